"""The CPU kernels a bfloat16 decode step of the runtime could use, timed side by side.

Why: bench/runtime_step.md says linear layers and paged attention are most of a step; this says
whether another way to compute them is faster on this CPU, before any of it goes into the model.
One intra-op thread (as the runtime runs beside vLLM), the `builtin:` models' shapes, 1, 8 and 32
rows (decode batches), every variant interleaved with its reference; medians.

  linears     F.linear on bf16 weights (oneDNN, torch's default) against the same weights held
              in fp32 (the input cast up, the output down: the same fp32 sums), against
              the weights reordered once into oneDNN's blocked layout (what the runtime's
              `Linear.pack` does on a CPU), and against torch's bf16 GEMM with oneDNN off
  attention   SDPA over gathered paged blocks with a bool mask (the runtime's) against an
              additive float mask made once, and against matmul, softmax, matmul

    .venv/bin/python bench/runtime/cpu_kernels.py     # writes results/cpu_kernels.{md,json}
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
# (in, out) of each linear; (KV heads, query heads per KV head, head_dim) of attention.
LINEARS = {
    "tiny": {"qkv": (256, 512), "gate_up": (256, 1376), "down": (688, 256), "lm_head": (256, 8192)},
    "smollm2-135m": {
        "qkv": (576, 960),
        "o": (576, 576),
        "gate_up": (576, 3072),
        "down": (1536, 576),
        "lm_head": (576, 49152),
    },
}
ATTENTION = {"tiny": (4, 2, 32), "smollm2-135m": (3, 3, 64)}
BLOCK, KEYS = 16, 176  # a sequence at position 160, in 11 blocks


def without_onednn(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        torch._C._set_mkldnn_enabled(False)
        try:
            return fn()
        finally:
            torch._C._set_mkldnn_enabled(True)

    return run


def interleaved(variants: dict[str, Callable[[], torch.Tensor]], iters: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(iters):
        for name, fn in variants.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def linear_variants(k: int, n: int, rows: int) -> dict[str, Callable[[], torch.Tensor]]:
    w = torch.randn(n, k).bfloat16()
    w32, x = w.float(), torch.randn(rows, k).bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    return {
        "bf16 (oneDNN)": lambda: F.linear(x, w),
        "fp32 weights": lambda: F.linear(x.float(), w32).bfloat16(),
        "bf16, prepacked": lambda: torch.ops.mkldnn._linear_pointwise(
            x, packed, None, "none", [], ""
        ),
        "bf16, oneDNN off": without_onednn(lambda: F.linear(x, w)),
    }


def attention_variants(kv_heads: int, group: int, hd: int, rows: int) -> dict[str, Callable]:
    n_blocks = KEYS // BLOCK
    pool = torch.randn(kv_heads, 8 * rows * n_blocks, BLOCK, hd).bfloat16()  # (KVH, blocks, …)
    blocks = torch.randperm(pool.shape[1])[: rows * n_blocks]
    q = torch.randn(rows, kv_heads, group, hd).bfloat16()  # (B, KVH, G, hd)
    lengths = torch.randint(KEYS - BLOCK + 1, KEYS + 1, (rows,))
    mask = (torch.arange(KEYS)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, keys)
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))

    def gathered() -> tuple[torch.Tensor, torch.Tensor]:  # (B, KVH, keys, hd) each
        k = pool.index_select(1, blocks).view(kv_heads, rows, KEYS, hd).transpose(0, 1)
        v = pool.index_select(1, blocks).view(kv_heads, rows, KEYS, hd).transpose(0, 1)
        return k, v

    def sdpa(m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, *gathered(), attn_mask=m)

    def explicit() -> torch.Tensor:
        k, v = gathered()
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(hd)  # (B, KVH, G, keys)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(q.dtype)
        return weights @ v

    return {
        "SDPA, bool mask": lambda: sdpa(mask),
        "SDPA, float mask": lambda: sdpa(additive),
        "matmul-softmax-matmul": explicit,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# CPU kernels for a bfloat16 decode step, side by side",
        "",
        f"Produced by `{report['command']}` on {report['when']} (torch {report['torch']}, one "
        "thread, a 2-CPU machine shared with other work); medians of interleaved runs, µs, and "
        "each variant's time over the first one's (> 1: slower than what the runtime does).",
        "",
        "| model | op | rows | variants (µs, ratio to the first) |",
        "|---|---|---|---|",
    ]
    for row in report["rows"]:
        names = [k for k in row if k not in ("model", "op", "rows")]
        cells = "; ".join(f"{k} {row[k] * 1e6:.0f} ({row[k] / row[names[0]]:.2f}×)" for k in names)
        lines.append(f"| {row['model']} | {row['op']} | {row['rows']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=str(RESULTS / "cpu_kernels"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows_out: list[dict] = []
    with torch.inference_mode():
        for model, shapes in LINEARS.items():
            for rows in args.rows:
                for name, (k, n) in shapes.items():
                    iters = max(3, args.iters // 4) if name == "lm_head" else args.iters
                    t = interleaved(linear_variants(k, n, rows), iters)
                    rows_out.append({"model": model, "op": f"linear {name}", "rows": rows, **t})
                t = interleaved(attention_variants(*ATTENTION[model], rows), args.iters)
                rows_out.append({"model": model, "op": "decode attention", "rows": rows, **t})
    command = shlex.join(["python", "bench/runtime/cpu_kernels.py", *sys.argv[1:]])
    when = datetime.now(UTC).isoformat(timespec="seconds")
    report = {"command": command, "when": when, "torch": torch.__version__, "rows": rows_out}
    write_report(Path(args.out), report, markdown(report))
    return 0


def write_report(out: Path, report: dict[str, Any], text: str) -> None:
    """OUT.json (the figures) and OUT.md (their table); the table printed."""
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
