"""Commands of the runtime, registered into the `wok` CLI: `wok runtime …` and `wok bench …`.

Shared between the runtime engineers: each command has its own `_register_*` function, called
from `register`; heavy imports (torch, fastapi) stay inside the handlers.
"""

from __future__ import annotations

import argparse
from typing import Any


def _group(commands: Any, name: str, help_text: str) -> Any:
    """The sub-command group `wok NAME`, created once (two parts may both add commands to it)."""
    existing = commands.choices.get(name)
    if existing is not None:
        return existing._wok_commands
    parser = commands.add_parser(name, help=help_text)
    group = parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
    parser._wok_commands = group
    return group


def register(commands: Any) -> None:
    runtime = _group(commands, "runtime", "the inference runtime (serve a model)")
    bench = _group(commands, "bench", "benchmarks of the runtime")
    _register_serve(runtime)
    _register_bench_http(bench)
    _register_bench_engine(bench)
    _register_model(_group(commands, "model", "model files (export a built-in model)"))
    _register_profile(commands)


# --- wok runtime serve (serve.py) ----------------------------------------------------------------


def _register_serve(runtime: Any) -> None:
    p = runtime.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    _add_endpoint_flags(p)
    _add_batching_flags(p)
    _add_runner_flags(p)
    _add_sim_flags(p)
    _add_queue_flags(p)
    _add_connection_flags(p)
    p.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="compute every prompt in full (by default a request reuses the KV blocks of the "
        "longest prompt prefix that an earlier one computed)",
    )
    p.add_argument(
        "--as-vllm",
        action="store_true",
        help="answer as a vLLM 0.32 server where wok's differs: only vLLM's metric series, "
        "/health, 503 once --max-queue requests are in flight (waiting and running); the "
        "batch stays at --max-batch-size (the emulated cluster's fake vLLM pods)",
    )
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_serve)


def _add_endpoint_flags(p: argparse.ArgumentParser) -> None:
    """What is served, and where: the model, its name, the address and the admin token."""
    p.add_argument("--model", default="builtin:tiny", help="model source (builtin:NAME or a dir)")
    p.add_argument("--served-model-name", default=None, help="name in the API (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument(
        "--admin-token-file",
        default=None,
        help="bearer token for /admin (or env "
        "WOK_ADMIN_TOKEN); without one the admin API is disabled",
    )


def _add_batching_flags(p: argparse.ArgumentParser) -> None:
    """The engine's batching: its mode, the batch cap, the step's token budget, the online
    queue's bound and timeout."""
    p.add_argument("--mode", choices=("continuous", "static", "serial"), default="continuous")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=int, default=0)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-queue", type=int, default=256)
    p.add_argument("--queue-timeout", type=float, default=30.0, help="seconds a request may wait")


def _add_runner_flags(p: argparse.ArgumentParser) -> None:
    """The model runner and its device: context length, the KV pool, GPUs, dtype, kernels."""
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=None,
        help="KV pool size (default: on CUDA, measured free memory; on the CPU, a quarter of "
        "the available host memory, at most 4 GiB)",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="GPUs the model is split over (Megatron-style; one process per GPU)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="float32 | float16 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument(
        "--device",
        type=_device,
        default=None,
        help="cpu | cuda | sim (default: cuda when available); sim: a simulated accelerator",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile the model with torch.compile (inductor) and warm it up before serving "
        "(seconds to a minute at start; eager if compiling fails)",
    )
    p.add_argument(
        "--attention",
        choices=("auto", "flashinfer", "reference", "none"),
        default="auto",
        help="paged attention kernel: auto is FlashInfer on CUDA where it is installed, the "
        "runtime's own elsewhere (docs/runtime-contract.md)",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="CUDA: replay decode steps from graphs captured for batch sizes up to "
        "--max-batch-size (eager where capture fails)",
    )


def _add_sim_flags(p: argparse.ArgumentParser) -> None:
    """The simulated accelerator (`--device sim`): its step-time profile and load time."""
    p.add_argument("--profile", default=None, help="sim: step-time profile, sim:NAME or a path")
    p.add_argument(
        "--sim-load-seconds",
        type=float,
        default=None,
        help="sim: not ready this long after start (default: the profile's load_seconds)",
    )


def _add_queue_flags(p: argparse.ArgumentParser) -> None:
    """The queues and lanes: the batch lane, priority classes, aging and tenant shares."""
    p.add_argument(
        "--batch-queue-size",
        type=int,
        default=1024,
        help="bound of the batch lane's own queue (a full one refuses only batch requests)",
    )
    p.add_argument(
        "--batch-queue-timeout",
        type=float,
        default=3600.0,
        help="seconds a batch-lane request may wait for admission",
    )
    p.add_argument(
        "--batch-lane-max-batch-size",
        type=int,
        default=None,
        help="the batch lane's cap while no online request runs or waits "
        "(default: as many max-model-len sequences as the KV pool holds)",
    )
    p.add_argument("--priority-classes", default="interactive=0,standard=1,batch=2")
    p.add_argument("--aging-seconds", type=float, default=10.0)
    p.add_argument("--tenant-kv-share", type=float, default=1.0)


def _add_connection_flags(p: argparse.ArgumentParser) -> None:
    """The HTTP side: the drain, streaming and what one connection may cost."""
    p.add_argument("--drain-seconds", type=float, default=30.0)
    p.add_argument(
        "--unready-seconds",
        type=float,
        default=3.0,
        help="after SIGTERM, answer 503 draining at least this long (within --drain-seconds) "
        "so that endpoints drop the pod before its port closes",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed chunk after the first (fewer chunks, less host CPU)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=8 * 1024 * 1024,
        help="a larger request body is answered 413 (read and dropped first, up to 64 MiB, so "
        "that the client reads the answer)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send a request's headers; then the connection closes",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=60.0,
        help="seconds a client has to send a request's body, from its headers; then 408",
    )


def _port(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    if not (text.isascii() and text.isdigit() and int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535)")
    return int(text)


def _device(text: str) -> str:
    """cpu, cuda, cuda:N or sim: what the runtime can run on."""
    kind, _, index = text.partition(":")
    if text in ("cpu", "cuda", "sim") or (kind == "cuda" and index.isascii() and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu, cuda, cuda:N or sim")


def _serve(args: argparse.Namespace) -> int:
    from wok_runtime.http.serve import serve_from_args

    return serve_from_args(args)


# --- wok bench http (bench_http.py) --------------------------------------------------------------


def _register_bench_http(bench: Any) -> None:
    p = bench.add_parser("http", help="load-test a running server over HTTP")
    p.add_argument(
        "--url",
        action="append",
        default=None,
        help="server base URL (repeatable: client-side round robin); loopback only",
    )
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="Poisson arrivals per second (default: all at once)",
    )
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--trace", default=None, help="replay an Azure LLM trace CSV")
    p.add_argument("--trace-speedup", type=float, default=1.0)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        default=0,
        help="the same N tokens before every prompt (a system prompt: what prefix caching reuses)",
    )
    p.add_argument("--max-input-len", type=int, default=None, help="clip trace prompt lengths")
    p.add_argument("--max-output-len", type=int, default=None, help="clip trace output lengths")
    p.add_argument("--slo-ttft", type=float, default=None, help="goodput TTFT target (s)")
    p.add_argument("--slo-e2e", type=float, default=None, help="goodput E2E target (s)")
    p.add_argument("--duration", type=float, default=600.0, help="hard time bound (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_bench_http)


def _bench_http(args: argparse.Namespace) -> int:
    from wok_runtime.tools.bench_http import run_from_args

    return run_from_args(args)


# --- wok model export (builtin.py, loader.py) ----------------------------------------------------


def _register_model(model: Any) -> None:
    p = model.add_parser(
        "export", help="write a model (e.g. builtin:tiny) as a Hugging Face directory"
    )
    p.add_argument("source", help="builtin:NAME or a Hugging Face model directory")
    p.add_argument("out", help="directory to write (must not exist or be empty)")
    p.add_argument(
        "--max-shard-mb",
        type=float,
        default=None,
        help="split the weights into safetensors shards of at most this size, with an index",
    )
    p.set_defaults(func=_model_export)


def _model_export(args: argparse.Namespace) -> int:
    from wok_runtime.core.loader import export_model

    if args.max_shard_mb is not None and args.max_shard_mb <= 0:
        raise ValueError("--max-shard-mb must be positive")
    shard = None if args.max_shard_mb is None else int(args.max_shard_mb * 1024 * 1024)
    out = export_model(args.source, args.out, max_shard_bytes=shard)
    print(out)
    return 0


# --- wok bench engine (bench_engine.py) ----------------------------------------------------------


def _register_bench_engine(bench: Any) -> None:
    from wok_runtime.tools.bench_engine import register_arguments  # argparse only, no torch

    p = bench.add_parser("engine", help="offline engine benchmark by batching mode (no HTTP)")
    register_arguments(p)
    p.set_defaults(func=_bench_engine)


def _bench_engine(args: argparse.Namespace) -> int:
    from wok_runtime.tools.bench_engine import run_from_args

    return run_from_args(args)


# --- wok profile (profiler.py) -------------------------------------------------------------------


def _register_profile(commands: Any) -> None:
    from wok_runtime.tools.profiler import register_arguments  # argparse only, no torch

    p = commands.add_parser(
        "profile", help="measure the engine's step time and fit a wok_sim step-time profile"
    )
    register_arguments(p)
    p.set_defaults(func=_profile)


def _profile(args: argparse.Namespace) -> int:
    from wok_runtime.tools.profiler import run_from_args

    return run_from_args(args)
