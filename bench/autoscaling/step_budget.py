"""Whether a rule that moves the step token budget pays: `wok-step-budget` (the law, plus the
budget halved on a TPOT breach before the batch and doubled on a TTFT breach with TPOT slack)
against `wok-fixed-budget` (the same law, the budget pinned at the InferenceService default of
2048), on the regimes of `law_ablation.py --regimes` and a few of its base conditions.

Both run on the default profile with its runner sized for a whole `max_model_len` step
(`step_token_budget` = max_model_len), so the rule may raise the budget above the default as well
as lower it; that sizing is free here, while a real pod pays for it in KV blocks (the comparison
favours the rule).

    .venv/bin/python bench/autoscaling/step_budget.py                 # about 20 min on one core
    .venv/bin/python bench/autoscaling/step_budget.py --only spikes
    .venv/bin/python bench/autoscaling/step_budget.py --rules wok-step-budget-1024 \
        --out step_budget_1024

Writes bench/autoscaling/results/<out>.md and .json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from law_ablation import conditions, regimes, simulate, table, write_results

from wok_contracts.profile import load_profile
from wok_sim.cli import DEFAULT_PROFILE

ROOT = Path(__file__).resolve().parents[2]
CONTROL = "wok-fixed-budget"
BASE = (
    "ramps, TPOT 0.03",
    "ramps, TPOT 0.05",
    "code x3 seed 0, TPOT 0.03",
    "code x3 seed 1",
    "poisson 12/s",
)


def runs(profile: Path) -> dict[str, list[str]]:
    """The regimes, each seeded one with a third seed, and the base conditions above."""
    base = conditions()
    chosen = dict(regimes())
    for name, args in regimes().items():
        if name.endswith("seed 1"):
            seed = args.index("--seed") + 1
            chosen[name.replace("seed 1", "seed 2")] = [*args[:seed], "2", *args[seed + 1 :]]
    chosen.update({name: base[name] for name in BASE})
    return {name: [*args, "--profile", str(profile)] for name, args in chosen.items()}


def wide_profile(folder: Path) -> Path:
    """The default profile, its runner sized for a step of max_model_len tokens."""
    profile = load_profile(DEFAULT_PROFILE)
    wide = replace(
        profile,
        name=f"{profile.name}-budget-{profile.max_model_len}",
        step_token_budget=profile.max_model_len,
    )
    path = folder / "profile.json"
    path.write_text(wide.to_json())
    return path


def deltas(results: dict[str, dict[str, dict]], rule: str) -> str:
    """`rule` against the control per condition: attainment points and GPU-h ratio."""
    lines = [
        f"`{rule}` against `{CONTROL}`:\n",
        "| condition | Δ attainment (points) | GPU-h rule / fixed |",
        "|---|---|---|",
    ]
    points = []
    for name, row in results.items():
        fixed, moved = row[CONTROL], row[rule]
        d = 100 * (moved["slo_attainment"] - fixed["slo_attainment"])
        points.append(d)
        ratio = moved["gpu_hours"] / fixed["gpu_hours"] if fixed["gpu_hours"] else float("nan")
        lines.append(f"| {name} | {d:+.2f} | {ratio:.3f} |")
    lines.append(
        f"| **median / min / max** | {statistics.median(points):+.2f} / {min(points):+.2f} / "
        f"{max(points):+.2f} | |"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the conditions whose name has this")
    parser.add_argument(
        "--rules", default="wok-step-budget", help="the budget rules to run beside the control"
    )
    parser.add_argument("--out", default="step_budget")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        profile = wide_profile(Path(folder))
        results = {
            name: simulate(run, f"{CONTROL},{args.rules}")
            for name, run in runs(profile).items()
            if args.only in name
        }
    command = " ".join(sys.argv[1:])
    text = (
        f"# The step token budget: a rule that moves it against the budget fixed\n\n"
        f"Made by `.venv/bin/python bench/autoscaling/step_budget.py {command}` in "
        f"{time.monotonic() - started:.0f} s: each cell is all-SLO attainment, GPU-h of `wok "
        "simulate <condition> --cold-start 90 --profile <default, runner sized for 8192 tokens> "
        "--policy <policy>`.\n\n"
        + table(results)
        + "".join(f"\n\n{deltas(results, rule)}" for rule in args.rules.split(","))
        + "\n"
    )
    write_results(args.out, text, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
