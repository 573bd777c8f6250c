"""`wok profile --url` against vLLM and against wok's runtime, and the simulator's prediction of
each server's throughput from its profile.

Why: `wok plan` and `wok simulate --profile` size a fleet from a step profile; for a vLLM fleet
that profile can only come from outside the engine, over HTTP (wok_runtime/tools/http_profiler.py).
This checks that such a profile predicts what the server then does: both servers serve the same
`builtin:tiny` directory (bfloat16, max_model_len 512, batch cap 32, one OpenMP thread, on this
CPU); each is profiled over HTTP, then driven by closed loops of 1, 4 and 16 concurrent clients
(128 prompt tokens, 64 output tokens, streaming, `wok bench http`'s client), and the simulator
runs the same closed loops on a replica with the measured profile: wok's replica for wok's
runtime, `wok_sim.vllm_pod.VllmReplica` (vLLM's fixed cap and unbounded queue) for vLLM. Target:
the simulated throughput within 15 % of the measured.

    .venv/bin/python bench/vllm/http_profile_check.py     # writes results/http_profile_check.*

vLLM comes from its cached venv (`make vllm-venv`). The machine is shared: the profile and the
loads of one server run back to back, so a change of the machine's load between them shows as
error; the table gives the 1-minute load average at each phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime_vs_vllm import Server, log, vllm_server, vllm_version, wok_server

from wok_cluster.vllm_venv import VLLM_WHEEL, ensure_vllm
from wok_contracts.profile import StepProfile, load_profile
from wok_contracts.traces import TraceRequest
from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.tools.bench_http import run_bench, summarize
from wok_sim.replica import SimReplica
from wok_sim.vllm_pod import VllmReplica

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "http_profile_check"
BATCH_CAP = 32
PROMPT, OUTPUT = 128, 64
TARGET = 0.15


@dataclass(frozen=True)
class Load:
    concurrency: int
    requests: int


LOADS = (Load(1, 16), Load(4, 48), Load(16, 128))


def shown_command(command: list[str]) -> list[str]:
    """The command as a reader reruns it: the interpreter by its path in the checkout."""
    python = Path(command[0])
    shown = str(python.relative_to(ROOT)) if python.is_relative_to(ROOT) else python.name
    return [shown, *command[1:]]


def closed_loop_sim(replica: SimReplica, load: Load) -> dict[str, float]:
    """`load.concurrency` clients, each sending its next request when the last one ends, on a
    simulated replica stepped one step at a time; output tokens per second to the last end."""
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        replica.add(sent, TraceRequest(now, PROMPT, OUTPUT))
        sent += 1

    for _ in range(min(load.concurrency, load.requests)):
        send(0.0)
    seen = 0
    while replica.has_work():
        step_from = replica.clock
        entry = replica.next_engine_entry_s() if isinstance(replica, VllmReplica) else None
        if entry is not None and replica.num_running + replica.num_waiting == 0:
            step_from = max(step_from, entry)  # the engine idles until the API server hands on
        replica.advance_to(math.nextafter(step_from, math.inf))  # one step
        for _ in replica.records[seen:]:
            if sent < load.requests:
                send(replica.clock)
        seen = len(replica.records)
    records = replica.records
    assert len(records) == load.requests and {r.outcome for r in records} == {"ok"}
    end = max(r.finish_s for r in records)
    return {"output_tokens_per_s": sum(r.output_tokens for r in records) / end, "seconds": end}


def simulated(engine: str, profile: StepProfile, load: Load) -> dict[str, float]:
    replica: SimReplica
    if engine == "vllm":
        replica = VllmReplica(profile, max_num_seqs=BATCH_CAP, fast=False)
    else:
        replica = SimReplica(profile, batch_cap=BATCH_CAP, fast=False)
    return closed_loop_sim(replica, load)


def measured(server: Server, load: Load) -> dict[str, Any]:
    specs = [TraceRequest(0.0, PROMPT, OUTPUT) for _ in range(load.requests)]
    results, elapsed, batch = asyncio.run(
        run_bench([server.url], specs, max_concurrency=load.concurrency, duration_s=600, seed=1)
    )
    report = summarize(results, elapsed, mean_batch_size=batch)
    if report["failed"]:
        raise SystemExit(f"{server.name}: {report['failed']} requests failed at {load}")
    return report


def profile_server(server: Server, out: Path, extra: list[str]) -> StepProfile:
    command = [sys.executable, "-m", "wok.cli", "profile", "--url", server.url, "--out", str(out)]
    command += ["--no-progress", *extra]
    log(shlex.join(command))
    subprocess.run(command, check=True)
    return load_profile(out)


def check_server(server: Server, engine: str, profile_path: Path, extra: list[str]) -> dict:
    started = time.monotonic()
    server.start(timeout_s=600)
    ready_s = time.monotonic() - started
    try:
        load_profiling = os.getloadavg()[0]
        profile = profile_server(server, profile_path, extra)
        rows = []
        for load in LOADS:
            load_avg = os.getloadavg()[0]
            real = measured(server, load)
            sim = simulated(engine, profile, load)
            log(
                f"{engine} c={load.concurrency}: {real['output_tokens_per_s']:.1f} tok/s "
                f"measured, {sim['output_tokens_per_s']:.1f} simulated"
            )
            rows.append(
                {
                    "concurrency": load.concurrency,
                    "requests": load.requests,
                    "measured_tok_s": real["output_tokens_per_s"],
                    "simulated_tok_s": sim["output_tokens_per_s"],
                    "delta": sim["output_tokens_per_s"] / real["output_tokens_per_s"] - 1,
                    "measured_tpot_p50_s": real["tpot_p50_s"],
                    "mean_batch": real.get("mean_batch_size"),
                    "load_average_1m": load_avg,
                }
            )
    finally:
        server.stop()
    return {
        "engine": engine,
        "command": shlex.join(shown_command(server.command)),
        "ready_seconds": round(ready_s, 1),
        "profile": json.loads(profile_path.read_text()),
        "profile_file": os.path.relpath(profile_path, ROOT),
        "load_average_profiling": load_profiling,
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# `wok profile --url` against vLLM and wok's runtime: simulated vs measured throughput",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}; shared with other work (load averages below). "
        f"{report['vllm']}. Model builtin:tiny, bfloat16, max_model_len 512, batch cap "
        f"{BATCH_CAP}, closed loops of {PROMPT}-token prompts and {OUTPUT}-token outputs.",
        "",
        "Each server is profiled over HTTP (`wok profile --url`: the gaps between streamed "
        "tokens), then serves three closed loops; the simulator runs the same loops on one "
        "replica with that profile (vLLM: `VllmReplica`, fixed cap, unbounded queue, and the "
        "profile's per-request overhead as a serial API-server stage in front of the engine). "
        f"Δ = simulated / measured − 1 (target ±{TARGET:.0%}, ✗ beyond).",
        "",
    ]
    for server in report["servers"]:
        p = server["profile"]
        fit = p["fit"]
        charged = (
            "charged: the API server's stage"
            if server["engine"] == "vllm"
            else "not charged: HTTP runs in the engine's process"
        )
        lines += [
            f"## {server['engine']}",
            "",
            f"- server: `{server['command']}` (ready after {server['ready_seconds']} s)",
            f"- profile (`{server['profile_file']}`): a {p['a_s'] * 1e3:.2f} ms, b "
            f"{p['b_s_per_seq'] * 1e3:.3f} ms/seq, c {p['c_s_per_prefill_token'] * 1e3:.4f} "
            f"ms/prefill token, d {p['d_s_per_context_token'] * 1e6:.3f} µs/context token; "
            f"fit R² {fit['r2']}, median |rel err| {fit['median_abs_rel_error']:.1%} over "
            f"{len(fit['grid'])} shapes; request overhead "
            f"{p.get('request_overhead_s', 0.0) * 1e3:.1f} ms ({charged}); load average "
            f"{server['load_average_profiling']:.1f}",
            "",
            "| clients | requests | measured tok/s | simulated tok/s | Δ | load avg |",
            "|---|---|---|---|---|---|",
        ]
        for row in server["rows"]:
            mark = " ✗" if abs(row["delta"]) > TARGET else ""
            lines.append(
                f"| {row['concurrency']} | {row['requests']} | {row['measured_tok_s']:.1f} | "
                f"{row['simulated_tok_s']:.1f} | {row['delta']:+.0%}{mark} | "
                f"{row['load_average_1m']:.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="wok,vllm")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    model_dir = ensure_builtin("tiny")
    python = ensure_vllm()
    out = Path(args.out)
    servers = []
    with tempfile.TemporaryDirectory(prefix="wok-http-profile-") as tmp:
        logs = Path(tmp)
        for engine in args.engines.split(","):
            if engine == "wok":
                server = wok_server(model_dir, logs, [f"--max-batch-size={BATCH_CAP}"])
                extra: list[str] = ["--name", "tiny-wok-http"]
            else:
                server = vllm_server(python, model_dir, logs)
                server.command += [f"--max-num-seqs={BATCH_CAP}"]
                server.env |= {"OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "1"}
                # vLLM's CPU server's default step budget (it does not export it)
                extra = ["--name", "tiny-vllm-http", "--step-token-budget", "2048"]
            path = out.parent / f"{out.name}_{engine}_profile.json"
            servers.append(check_server(server, engine, path, extra))
    report = {
        "command": shlex.join(
            ["python", "bench/vllm/http_profile_check.py", *(argv or sys.argv[1:])]
        ),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "vllm": f"{VLLM_WHEEL}: {vllm_version(python)}",
        "servers": servers,
    }
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    log(f"wrote {out}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
