"""`wok demo`: wok's main job on an embedded default, on a laptop, in a few minutes.

It sizes a real model's KV cache from its architecture (the memory budget), runs the control law
in the fleet simulator over a scripted busy quarter-hour beside the HPA on the queue and the
cheapest fixed fleet (plots), says in words what the law did there and why, then runs it live: a
real runtime process under a real burst of requests, its batch size moved through the admin API
(plot).
"""

from __future__ import annotations

import argparse
import itertools
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wok_sim.fleet import Tick

#: The simulated part: the law, the HPA on the queue (what most teams would try first) and the
#: fixed fleet sized in hindsight, on the same arrivals, at the headline run's 90 s pod start.
DEMO_TRACE = "script"  # the default load script: a busy quarter-hour (wok_contracts.traces)
DEMO_POLICIES = "wok,hpa-waiting,static-peak"
DEMO_POD_START_S = 90.0
DEMO_SLO_TTFT_S = 2.0


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def what_the_law_did(ticks: Sequence[Tick], *, slo_ttft_s: float, pod_start_s: float) -> str:
    """The law's run in words, from its control ticks: when it first added a pod and from how
    many, when that pod served, and how long the P99 TTFT it saw stayed over the SLO; with the
    reason the law gives for adding pods no sooner."""
    first = ticks[0]
    up = next((b for a, b in itertools.pairwise(ticks) if b.desired > a.desired), None)
    over = [t for t in ticks if t.p99_ttft_s is not None and t.p99_ttft_s > slo_ttft_s]
    parts = [
        f"wok starts with {first.desired} pod{'s' * (first.desired != 1)}, each running up to "
        f"{max(t.batch for t in ticks)} requests at once (its batch). It sizes the fleet by the "
        "requests in it (running + waiting) against what the pods' batches hold at its target "
        "utilization (ρ, docs/control-law.md), so while the arrivals climb it fills the pods it "
        "has before it adds one."
    ]
    if up is None:
        parts.append(f"It never needed more than {first.desired}.")
    else:
        before = next(t.desired for t in reversed(ticks) if t.time_s < up.time_s)
        parts.append(
            f"It first adds a pod at {_minutes(up.time_s)} ({before} → {up.desired}), once the "
            f"requests pass that; a pod takes {pod_start_s:g} s to start"
        )
        ready = next((t for t in ticks if t.time_s > up.time_s and t.ready > before), None)
        if ready is not None:
            parts[-1] += f", and the first new one serves from {_minutes(ready.time_s)}."
        else:
            parts[-1] += "."
    if over:
        most = max(t.waiting for t in ticks)
        parts.append(
            f"Meanwhile requests queue (at most {most} waiting) and the P99 TTFT the law sees is "
            f"over the {slo_ttft_s:g} s SLO from {_minutes(over[0].time_s)} to "
            f"{_minutes(over[-1].time_s)}: a P99 over a window, it falls a while after the queue "
            f"is gone. After that breach the law keeps more headroom, up to "
            f"{max(t.desired for t in ticks)} pods."
        )
    else:
        parts.append(f"The P99 TTFT it saw stayed within the {slo_ttft_s:g} s SLO throughout.")
    parts.append(
        "static-peak is sized in hindsight, knowing the whole load; wok and the HPA see it as it "
        "comes. `wok simulate --trace script --slo-e2e 0 --cold-start 30` shows what a shorter "
        "pod start changes."
    )
    return " ".join(parts)


def read_ticks(path: Path) -> list[Tick]:
    from wok_sim.fleet import Tick

    return [Tick(**json.loads(line)) for line in path.read_text().splitlines()]


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
    print(
        "\n== 2. The control law in the fleet simulator, on a scripted busy quarter-hour, beside "
        "the HPA on the queue and the cheapest fixed fleet =="
    )
    simulate = argparse.ArgumentParser(prog="wok simulate")
    sim_cli.add_arguments(simulate)
    # TTFT and TPOT only: the script's long answers take longer than the headline run's 5 s E2E
    # SLO at any batch, which no autoscaler can change.
    sim_args = ["--trace", DEMO_TRACE, "--slo-e2e", "0", "--policy", DEMO_POLICIES]
    sim_args += ["--slo-ttft", f"{DEMO_SLO_TTFT_S:g}", "--cold-start", f"{DEMO_POD_START_S:g}"]
    sim_args += ["--plot", str(args.out), "--ticks", str(args.out)]
    sim_cli.run(simulate.parse_args(sim_args))
    ticks = read_ticks(args.out / "ticks-wok.jsonl")
    story = what_the_law_did(ticks, slo_ttft_s=DEMO_SLO_TTFT_S, pod_start_s=DEMO_POD_START_S)
    print("\n" + textwrap.fill(story, 100))
    print(
        f"\nThe control loop over time: {args.out / 'simulate-wok.png'}; the three side by side: "
        f"{args.out / 'simulate-comparison.png'}"
    )
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
