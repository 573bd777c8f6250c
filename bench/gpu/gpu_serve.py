"""wok against vLLM on one GPU, both serving the same model directory (bench/gpu/gpu_check.py's
part (e)): closed loops of 1, 8 and 64 concurrent streams of 128 prompt and 64 output tokens
(`vllm bench serve --random-input-len 128 --random-output-len 64`'s load), each run `reps` times
per server, alternating which goes first; medians of output tok/s and TPOT P50/P99.

Both servers are up at once on the one GPU (the alternation needs it), each given the same KV
pool in bytes and about half of the memory: wok `--kv-cache-bytes`, vLLM
`--kv-cache-memory-bytes`. The servers, the client (wok's `bench_http`, streaming) and the
medians are bench/vllm/runtime_vs_vllm.py's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The servers and loads of the vLLM comparison, from its study.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))

from runtime_vs_vllm import (
    Load,
    Server,
    free_port,
    wok_vs_vllm_rows,
)

from wok_contracts.traces import TraceRequest

PROMPT_LEN, OUTPUT_LEN = 128, 64
MAX_MODEL_LEN = 1024


@dataclass(frozen=True)
class ServeSizes:
    requests: dict[int, int]  # concurrency -> requests per run
    reps: int
    kv_cache_bytes: int
    vllm_gpu_memory_utilization: float


FULL = ServeSizes({1: 8, 8: 48, 64: 192}, 3, 16 << 30, 0.45)


def loads(sizes: ServeSizes) -> list[Load]:
    return [
        Load(f"closed-{c}", [TraceRequest(0.0, PROMPT_LEN, OUTPUT_LEN)] * n, c)
        for c, n in sizes.requests.items()
    ]


def wok_server(model_dir: Path, logs: Path, sizes: ServeSizes, max_batch: int) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "wok.cli", "runtime", "serve", "--model", str(model_dir)]
    command += ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "--device", "cuda"]
    command += ["--kv-cache-bytes", str(sizes.kv_cache_bytes), "--port", str(port)]
    command += ["--max-batch-size", str(max_batch), "--cuda-graphs", "--attention", "auto"]
    command += ["--log-level", "warning"]
    return Server("wok", command, {}, "/readyz", port, logs / "wok.log")


def vllm_server(python: str, model_dir: Path, logs: Path, sizes: ServeSizes) -> Server:
    port = free_port()
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    command += ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    command += ["--gpu-memory-utilization", f"{sizes.vllm_gpu_memory_utilization:g}"]
    command += ["--kv-cache-memory-bytes", str(sizes.kv_cache_bytes)]
    return Server("vllm", command, {}, "/health", port, logs / "vllm.log")


def servers(model_dir: Path, vllm_python: str, logs: Path, sizes: ServeSizes) -> list[Server]:
    """wok first: it takes its pool before vLLM measures what is free."""
    max_batch = max(sizes.requests)
    return [
        wok_server(model_dir, logs, sizes, max_batch),
        vllm_server(vllm_python, model_dir, logs, sizes),
    ]


def compare(
    model_dir: Path, vllm_python: str, logs: Path, sizes: ServeSizes = FULL
) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    pair = servers(model_dir, vllm_python, logs, sizes)
    rows = wok_vs_vllm_rows(pair, loads(sizes), sizes.reps, tag="gpu")
    return {
        "wok_command": " ".join(pair[0].command[3:]),
        "vllm_command": " ".join(pair[1].command[1:]),
        "reps": sizes.reps,
        "rows": rows,
    }
