"""Two builds or settings of wok's server side by side through HTTP, on this CPU.

Why: bench/runtime/runtime_engine_ab.py compares model-side variants without HTTP, and
bench/vllm/runtime_vs_vllm.py compares wok with vLLM; this says whether a change to the server path
(the event loop, SSE, the engine-to-loop bridge) or a setting (OMP_NUM_THREADS) makes the whole
server faster. Each side is a `wok runtime serve` process, as bench/vllm/runtime_vs_vllm.py starts
it: `--a`/`--b` name its runtime code (a git ref, whose `runtime/` is extracted to a temporary
directory and put first on PYTHONPATH, or `tree` for this checkout) and `--a-env`/`--b-env` its
environment. The loads are runtime_vs_vllm's closed loops, run `--reps` times per side, alternating
which side goes first; figures are medians.

    .venv/bin/python bench/runtime/runtime_http_ab.py --a main --b tree  # results/runtime_http_ab.*
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The servers and loads of the vLLM comparison, from its study.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))

from runtime_vs_vllm import (
    ROOT,
    Load,
    Server,
    alternating_medians,
    loads,
    ratio,
    ratio_text,
    wok_server,
)

from wok_runtime.core.builtin import ensure_builtin

RESULTS = Path(__file__).resolve().parent / "results"


def side(
    label: str, code: str, env: list[str], *, model_dir: Path, extra: list[str], tmp: Path
) -> Server:
    """A wok server on the runtime code `code` (a git ref, or `tree`) with `env` (K=V) added."""
    server = wok_server(model_dir, tmp, extra)
    server.name = label
    server.log_path = tmp / f"{label}.log"
    server.env = {**server.env, **dict(item.split("=", 1) for item in env)}
    if code != "tree":
        source = tmp / label
        source.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", code, "runtime"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        server.env["PYTHONPATH"] = str(source / "runtime")  # found before the editable install
    return server


def run_side_by_side(servers: list[Server], chosen: list[Load], reps: int) -> list[dict[str, Any]]:
    rows = []
    for load, medians in alternating_medians(servers, chosen, reps):
        a, b = (medians[s.name] for s in servers)
        rows.append(
            {
                "load": load.name,
                "requests": len(load.specs),
                "concurrency": load.concurrency,
                "a": a,
                "b": b,
                "tok_s_ratio": ratio(b["output_tokens_per_s"], a["output_tokens_per_s"]),
                "tpot_p50_ratio": ratio(b["tpot_p50_s"], a["tpot_p50_s"]),
                "tpot_p99_ratio": ratio(b["tpot_p99_s"], a["tpot_p99_s"]),
            }
        )
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def markdown(report: dict[str, Any]) -> str:
    a, b = report["a"], report["b"]
    lines = [
        f"# wok's server side by side through HTTP: {report['model']}",
        "",
        f"Produced by `{report['command']}` on {report['when']} ({report['machine']}), "
        f"{report['reps']} alternating runs per side and load; medians. Latencies in ms; "
        "ratios are B / A.",
        "",
        f"- A: runtime `{a['code']}`, `{a['command']}`",
        f"- B: runtime `{b['code']}`, `{b['command']}`",
        "",
        "| load | A tok/s | B tok/s | ratio | TPOT P50 A / B | TPOT P99 A / B | TTFT P50 A / B "
        "| B tok/s in each run | A tok/s in each run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        ra, rb = row["a"], row["b"]
        runs_a = ", ".join(f"{r['output_tokens_per_s']:.0f}" for r in ra["runs"])
        runs_b = ", ".join(f"{r['output_tokens_per_s']:.0f}" for r in rb["runs"])
        lines.append(
            f"| {row['load']} ({row['requests']} req, {row['concurrency']} at once) "
            f"| {ra['output_tokens_per_s']:.0f} | {rb['output_tokens_per_s']:.0f} "
            f"| {ratio_text(row['tok_s_ratio'])} "
            f"| {_ms(ra['tpot_p50_s'])} / {_ms(rb['tpot_p50_s'])} "
            f"| {_ms(ra['tpot_p99_s'])} / {_ms(rb['tpot_p99_s'])} "
            f"| {_ms(ra['ttft_p50_s'])} / {_ms(rb['ttft_p50_s'])} | {runs_b} | {runs_a} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--a", default="main", help="side A's runtime: a git ref, or `tree`")
    parser.add_argument("--b", default="tree", help="side B's runtime: a git ref, or `tree`")
    parser.add_argument("--a-env", nargs="*", default=[], help="K=V added to A's environment")
    parser.add_argument("--b-env", nargs="*", default=[], help="K=V added to B's environment")
    parser.add_argument("--loads", nargs="+", default=["closed-1", "closed-8", "closed-32"])
    parser.add_argument("--scale", type=float, default=1.0, help="request counts")
    parser.add_argument("--reps", type=int, default=3, help="runs per side and load")
    parser.add_argument("--wok-args", default="--compile", help="`wok runtime serve` arguments")
    parser.add_argument("--out", default=str(RESULTS / "runtime_http_ab"))
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    chosen = [load for load in loads(args.scale) if load.name in args.loads]
    model_dir = ensure_builtin(args.model)
    extra = shlex.split(args.wok_args)
    with tempfile.TemporaryDirectory(prefix="wok-http-ab-") as tmp:
        servers = [
            side("A", args.a, args.a_env, model_dir=model_dir, extra=extra, tmp=Path(tmp)),
            side("B", args.b, args.b_env, model_dir=model_dir, extra=extra, tmp=Path(tmp)),
        ]
        try:
            rows = run_side_by_side(servers, chosen, args.reps)
        finally:
            for server in servers:
                server.stop()

    def described(server: Server, code: str) -> dict[str, str]:
        env = {k: v for k, v in server.env.items() if k != "PYTHONPATH"}
        command = " ".join(f"{k}={v}" for k, v in env.items())
        return {"code": code, "command": f"{command} wok {shlex.join(server.command[3:])}"}

    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work",
        "command": shlex.join(["python", "bench/runtime/runtime_http_ab.py", *sys.argv[1:]]),
        "model": f"builtin:{args.model}",
        "reps": args.reps,
        "a": described(servers[0], args.a),
        "b": described(servers[1], args.b),
        "rows": rows,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
