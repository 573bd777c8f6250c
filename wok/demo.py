"""`wok demo`: wok's main job on an embedded default, on a laptop, in about a minute.

It sizes a real model's KV cache from its architecture (the memory budget), runs the control law
in the fleet simulator over a scripted busy quarter-hour (plot), then runs it live: a real runtime
process under a real burst of requests, its batch size moved through the admin API (plot).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(commands: Any) -> None:
    parser = commands.add_parser("demo", help="run the demo on an embedded default")
    parser.add_argument("--out", type=Path, default=Path("out"), help="where plots go")
    parser.add_argument("--no-live", action="store_true", help="skip the live runtime part")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wok_operator.cli import run_budget
    from wok_sim import cli as sim_cli

    print("== 1. The memory budget: Llama-3-8B in bf16 on one 80 GiB GPU, 8k context ==")
    run_budget(
        argparse.Namespace(
            list=False,
            preset="llama-3-8b",
            config=None,
            gpu_memory="80Gi",
            gpus=1,
            utilization=0.9,
            dtype="bfloat16",
            max_model_len=8192,
            reserve="512Mi",
            max_num_batched_tokens=2048,
            sequence_length=None,
            json=False,
        )
    )
    print("\n== 2. The control law in the fleet simulator, on a scripted busy quarter-hour ==")
    simulate = argparse.ArgumentParser(prog="wok simulate")
    sim_cli.add_arguments(simulate)
    # TTFT and TPOT only: the script's long answers take longer than the headline run's 5 s E2E
    # SLO at any batch, which no autoscaler can change.
    sim_args = ["--trace", "script", "--slo-e2e", "0", "--policy", "wok", "--jobs", "1"]
    sim_args += ["--plot", str(args.out)]
    sim_cli.run(simulate.parse_args(sim_args))
    print(f"\nThe control loop over time: {args.out / 'simulate-wok.png'}")
    if args.no_live:
        return 0
    from wok.live_demo import plot_live, run_live

    print("\n== 3. Live: a real runtime (builtin:tiny) under a burst, batch moved by the law ==")
    ticks = run_live(args.out)
    live_path = args.out / "demo-live.png"
    plot_live(ticks, live_path)
    peak = max(tick.batch for tick in ticks)
    print(f"\nbatch 2 → {peak} under the burst, {ticks[-1].batch} after it; plot: {live_path}")
    return 0
