"""Which of AIBrix's KV-usage targets act on `wok evaluate`'s traces: the KPA and APA on
`gpu_cache_usage_perc` at each target and B, seed 0, the most pods each asked for against the
warm start it began from. A target whose policy never asks past one pod adds no point to a
swept frontier (the matrix's `aibrix-*-swept` leave it out, `wok_sim.aibrix_policy`).

    nice -n 10 .venv/bin/python bench/autoscaling/aibrix_kv_reach.py  # results/aibrix_kv_reach.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from wok_sim.aibrix_policy import AibrixPolicy
from wok_sim.evaluation_matrix import WARM_UP_S, Condition, context
from wok_sim.fleet import FleetConfig, simulate_fleet

TARGETS = (0.05, 0.1, 0.2, 0.5)  # the sweep before the matrix kept the targets that act
CONDITIONS = (
    Condition("code", 3.0, 90.0, "loose"),
    Condition("code", 4.0, 90.0, "loose"),
    Condition("conv", 1.0, 90.0, "loose"),
    Condition("mooncake", 1.0, 90.0, "loose"),
)
OUT = Path(__file__).resolve().parent / "results" / "aibrix_kv_reach.md"


def main() -> int:
    lines = [
        "# AIBrix on KV usage: which targets scale on the matrix's traces",
        "",
        f"Command: `nice -n 10 .venv/bin/python bench/{Path(__file__).name}`",
        "",
        "Seed 0, 90 s pod start, loose SLOs, each B the matrix sweeps; `max pods`: the most "
        "replicas the policy asked for over the run (it starts from the planner's warm start).",
        "",
        "| condition | strategy | target | warm start | max pods at each B |",
        "|---|---|---|---|---|",
    ]
    for condition in CONDITIONS:
        ctx = context(condition, 0)
        config = FleetConfig(profile=ctx.profile, cold_start_s=90.0, seed=0, score_from_s=WARM_UP_S)
        for strategy in ("kpa", "apa"):
            # The targets that act need showing once (the code trace ×3); those that never do,
            # on every trace.
            for target in TARGETS if condition.scale == 3.0 else TARGETS[2:]:
                most = []
                for b in ctx.sweep_batches():
                    policy = AibrixPolicy(
                        f"aibrix-{strategy}-kv-{target:g}",
                        strategy=strategy,
                        target=target,
                        batch=b,
                        ctx=ctx,
                        metric="kv",
                    )
                    run = simulate_fleet(list(ctx.requests), policy, config)
                    most.append(f"B{b}: {max(t.desired for t in run.timeline)}")
                lines.append(
                    f"| {condition.trace} ×{condition.scale:g} | {strategy} | {target:g} "
                    f"| {ctx.start_replicas} | {', '.join(most)} |"
                )
                print(lines[-1], file=sys.stderr, flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
