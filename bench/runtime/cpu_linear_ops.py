"""A model's linears, one step's worth, through torch's oneDNN ops and vLLM's, on this CPU.

Why: on SmolLM2 the GEMMs of one decode step take about as long as vLLM's whole step
(bench/vllm/results/runtime_vs_vllm.md). Both call the same oneDNN kernel on weights prepacked once;
this says how much of the difference is the call into it. One pass runs every linear of the model
once, each on its own weight (so weights stream from memory as in a step, not from cache), at M
rows, on one intra-op thread (as both servers run here):

  F.linear           torch on the plain bf16 weights (oneDNN reorders them on every call)
  torch prepacked    torch.ops.mkldnn._linear_pointwise on weights reordered once: what the
                     runtime runs on a CPU with AMX (`Linear.pack`)
  brgemm             torch's exported AMX micro-kernel on weights in its blocked layout: what
                     the runtime runs under `--compile` on a CPU with AMX (brgemm_linear.py)
  vLLM onednn_mm     vLLM's CPU backend (`create_onednn_mm` / `onednn_mm`, its own oneDNN
                     matmul handler), in vLLM's venv: same shapes, random weights

plus the cost of one call on a 64×64 weight that stays in cache (the fixed part of a call).
The backends alternate, `--reps` times; medians. vLLM's venv is the one
bench/vllm/runtime_vs_vllm.py installs; without it that column is left out.

    .venv/bin/python bench/runtime/cpu_linear_ops.py   # writes results/cpu_linear_ops.*
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from cpu_kernels import write_report

ROOT = Path(__file__).resolve().parents[2]
ROWS = (1, 8, 32, 128, 512, 2048)  # decode batches, then prefill chunks (2048: a full step)
PASSES = 9  # passes timed per backend and rep; their median is the rep's figure
Shape = tuple[int, int]  # (out_features, in_features)


def time_passes(calls: list[Callable[[torch.Tensor], Any]], inputs: list[torch.Tensor]) -> float:
    """Median seconds of one pass over every call, each on its input."""
    for call, x in zip(calls, inputs, strict=True):  # first calls build oneDNN's primitives
        call(x)
    times = []
    for _ in range(PASSES):
        started = time.perf_counter()
        for call, x in zip(calls, inputs, strict=True):
            call(x)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def time_backend(backend: str, weights: list[torch.Tensor]) -> dict[str, float]:
    """{'M=…': seconds a pass, 'call': seconds of one cached 64×64 call} for one backend."""
    small = torch.randn(64, 64).bfloat16()

    def make(weight: torch.Tensor) -> Callable[[torch.Tensor], Any]:
        if backend == "F.linear":
            return lambda x: torch.nn.functional.linear(x, weight)
        if backend == "torch prepacked":
            from wok_runtime.core.model import PACKED_GEMM_ROWS

            packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_GEMM_ROWS)
            op = torch.ops.mkldnn._linear_pointwise.default
            return lambda x: op(x, packed, None, "none", [], "")
        if backend == "brgemm":
            from wok_runtime.kernels import brgemm_linear

            blocked = brgemm_linear.pack(weight)
            return lambda x: brgemm_linear.linear(x, blocked, None)
        from vllm import _custom_ops as ops  # only in vLLM's venv

        handler = ops.create_onednn_mm(weight.t(), 32)
        return lambda x: ops.onednn_mm(handler, x, None)

    calls = [make(w) for w in weights]
    figures = {}
    for rows in ROWS:
        inputs = [torch.randn(rows, w.shape[1]).bfloat16() for w in weights]
        figures[f"M={rows}"] = time_passes(calls, inputs)
    one = make(small)
    figures["call"] = time_passes([one] * 1000, [torch.randn(1, 64).bfloat16()] * 1000) / 1000
    return figures


def random_weights(shapes: list[Shape]) -> list[torch.Tensor]:
    return [(torch.randn(out, inp) * 0.02).bfloat16() for out, inp in shapes]


def worker(shapes_json: str) -> None:
    """vLLM's side, run under vLLM's python: its figures as JSON on stdout."""
    torch.set_num_threads(1)
    shapes = [tuple(s) for s in json.loads(shapes_json)]
    print(json.dumps(time_backend("vLLM onednn_mm", random_weights(shapes))))


def model_shapes(source: str) -> list[Shape]:
    from wok_runtime.core.loader import load_model, resolve_source

    model = load_model(resolve_source(source), dtype=torch.bfloat16, device=torch.device("cpu"))
    return [(m.weight.shape[0], m.weight.shape[1]) for m in model.linears()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["builtin:tiny", "builtin:smollm2-135m"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--vllm-venv", type=Path, default=Path.home() / ".cache/wok/vllm-venv")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/runtime/results/cpu_linear_ops")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # vLLM's side; see worker()
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    torch.set_num_threads(1)
    vllm_python = args.vllm_venv / "bin/python"
    backends = ["F.linear", "torch prepacked"]
    from wok_runtime.kernels import brgemm_linear

    if brgemm_linear.load():
        backends.append("brgemm")
    if vllm_python.exists():
        backends.append("vLLM onednn_mm")
    results: dict[str, Any] = {}
    for source in args.models:
        shapes = model_shapes(source)
        weights = random_weights(shapes)
        megabytes = sum(out * inp for out, inp in shapes) * 2 / 1e6
        runs: dict[str, list[dict[str, float]]] = defaultdict(list)
        for rep in range(args.reps):
            for backend in backends:
                if backend == "vLLM onednn_mm":
                    done = subprocess.run(
                        [str(vllm_python), __file__, "--worker", json.dumps(shapes)],
                        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    runs[backend].append(json.loads(done.stdout.strip().splitlines()[-1]))
                else:
                    runs[backend].append(time_backend(backend, weights))
                print(f"{source} rep {rep + 1}/{args.reps}: {backend} done", file=sys.stderr)
        results[source] = {
            "linears": len(shapes),
            "weight_mb": megabytes,
            "median": {
                b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()
            },
            "runs": runs,
        }
    report = {
        "command": shlex.join(["python", "bench/runtime/cpu_linear_ops.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "results": results,
    }
    write_report(args.out, report, render(report))
    return 0


def render(report: dict[str, Any]) -> str:
    lines = [
        "# A model's linears through torch's oneDNN ops and vLLM's, on this CPU",
        "",
        f"Produced by `{report['command']}` on {report['date']} (torch {report['torch']}, one "
        "intra-op thread, a 2-CPU machine shared with other work). One pass runs every linear "
        "of the model once, each on its own weight, at M rows; ms, medians of alternating runs. "
        "`call` is one call on a 64×64 weight held in cache, in µs.",
    ]
    for source, result in report["results"].items():
        medians = result["median"]
        first = next(iter(medians.values()))
        rows = [k for k in first if k != "call"]
        lines += [
            "",
            f"## {source}: {result['linears']} linears, "
            f"{result['weight_mb']:.0f} MB of bf16 weights",
            "",
            "| backend | " + " | ".join(f"pass at {k} (ms)" for k in rows) + " | call (µs) |",
            "|---|" + "---|" * (len(rows) + 1),
        ]
        for backend, figures in medians.items():
            cells = [f"{figures[k] * 1e3:.1f}" for k in rows] + [f"{figures['call'] * 1e6:.1f}"]
            lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
