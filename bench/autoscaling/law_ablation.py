"""The control law against its own ablations, over traces, overlay seeds and rate scales.

One row per condition: each policy's attainment of all SLOs and GPU-hours on the same arrivals.
`wok-frozen-cap` and `wok-frozen-plan` are the law with its batch pinned (`sim/wok_sim/
wok_policy.py`), so a difference between them and `wok` is what the moving batch buys. Every
condition here is a development condition: the law's constants were judged on all of them
together (docs/control-law.md), never on one.

    .venv/bin/python bench/autoscaling/law_ablation.py --out law_ablation  # 20 min on a core
    .venv/bin/python bench/autoscaling/law_ablation.py --policies wok --only code
    .venv/bin/python bench/autoscaling/law_ablation.py --regimes --out law_regimes

Writes bench/autoscaling/results/<out>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
TRACES = ROOT / "bench" / "traces"
# No E2E SLO unless a condition names one: long answers set E2E, and no batch changes that.
LOOSE = ["--slo-ttft", "2", "--slo-tpot", "0.1", "--slo-e2e", "0"]
RAMPS = "script:300@2-20,600@20,300@20-2,300@2,300@2-30,300@30-5,600@5"
# A quiet 4 req/s (TPOT far within its SLO) with a 30 s spike to 40 req/s every 5 minutes.
SPIKES = "script:" + ",".join(["270@4,30@40"] * 6)


def conditions() -> dict[str, list[str]]:
    """Name → `wok simulate` arguments (90 s pod start unless the name says otherwise)."""
    runs: dict[str, list[str]] = {}
    for scale in (2, 3, 4):
        for seed in (0, 1, 2):
            runs[f"code x{scale} seed {seed}"] = [
                *("--rate-scale", str(scale), "--rate-mode", "overlay", "--seed", str(seed)),
                *LOOSE[:-2],
                *("--slo-e2e", "5"),
            ]
    for seed in (0, 1):
        runs[f"mooncake x3.24 seed {seed}"] = [
            *("--trace", str(TRACES / "mooncake_conversation.jsonl"), "--seed", str(seed)),
            *("--rate-scale", "3.24", "--rate-mode", "overlay", *LOOSE),
        ]
    runs["ramps"] = ["--trace", RAMPS, *LOOSE]
    runs["poisson 12/s"] = ["--trace", "poisson:12:1800", *LOOSE]
    for tpot in ("0.05", "0.03"):
        tight = ["--slo-ttft", "2", "--slo-tpot", tpot, "--slo-e2e", "0"]
        runs[f"ramps, TPOT {tpot}"] = ["--trace", RAMPS, *tight]
        runs[f"code x3 seed 0, TPOT {tpot}"] = [
            *("--rate-scale", "3", "--rate-mode", "overlay", *tight)
        ]
    return runs


def regimes() -> dict[str, list[str]]:
    """Where a batch that moves could pay: a context mix that shifts mid-run (Mooncake's long
    prompts spliced into short ones), KV pressure (Mooncake: B_mem binds), spikes that arrive
    while TPOT has slack, each at a loose and a tight TPOT SLO."""
    mooncake = str(TRACES / "mooncake_conversation.jsonl")
    runs: dict[str, list[str]] = {}
    for tpot, ttft in (("0.1", "2"), ("0.05", "1")):
        slos = ["--slo-ttft", ttft, "--slo-tpot", tpot, "--slo-e2e", "0"]
        for seed in (0, 1):
            tail = [*slos, "--seed", str(seed)]
            runs[f"poisson 8/s, Mooncake mix 600-1200, TPOT {tpot} seed {seed}"] = [
                *("--trace", "poisson:8:1800", "--splice", f"{mooncake}@600-1200", *tail)
            ]
            runs[f"ramps, Mooncake mix 1500-2100, TPOT {tpot} seed {seed}"] = [
                *("--trace", RAMPS, "--splice", f"{mooncake}@1500-2100", *tail)
            ]
            runs[f"spikes, TPOT {tpot} seed {seed}"] = ["--trace", SPIKES, *tail]
        runs[f"mooncake x3.24 seed 0, TPOT {tpot}"] = [
            *("--trace", mooncake, "--rate-scale", "3.24", "--rate-mode", "overlay", *slos)
        ]
    return runs


def simulate(args: list[str], policies: str) -> dict:
    command = [str(ROOT / ".venv" / "bin" / "wok"), "simulate", *args, "--cold-start", "90"]
    command += ["--policy", policies, "--jobs", "1", "--json"]
    print(f"$ {' '.join(command[1:])}", file=sys.stderr, flush=True)
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["policies"]


def table(results: dict[str, dict[str, dict]]) -> str:
    policies = list(next(iter(results.values())))
    lines = [
        "| condition | " + " | ".join(policies) + " |",
        "|---|" + "---|" * len(policies),
    ]
    for name, row in results.items():
        cells = [f"{row[p]['slo_attainment']:.2%}, {row[p]['gpu_hours']:.2f}" for p in policies]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    means = [
        f"{statistics.mean(r[p]['slo_attainment'] for r in results.values()):.2%}, "
        f"{statistics.mean(r[p]['gpu_hours'] for r in results.values()):.2f}"
        for p in policies
    ]
    lines.append("| **mean** | " + " | ".join(means) + " |")
    return "\n".join(lines)


def write_results(out: str, text: str, results: dict[str, dict[str, dict]]) -> None:
    """bench/autoscaling/results/OUT.md (the table) and OUT.json (the figures behind it); the table
    printed."""
    results_dir = RESULTS
    (results_dir / f"{out}.md").write_text(text)
    (results_dir / f"{out}.json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="wok,wok-frozen-cap,wok-frozen-plan")
    parser.add_argument("--only", default="", help="run the conditions whose name has this")
    parser.add_argument("--regimes", action="store_true", help="the regimes, not the conditions")
    parser.add_argument("--out", default="law_ablation")
    args = parser.parse_args()
    started = time.monotonic()
    results = {
        name: simulate(run, args.policies)
        for name, run in (regimes() if args.regimes else conditions()).items()
        if args.only in name
    }
    command = " ".join(sys.argv[1:])
    text = (
        "# The law and its batch ablations\n\n"
        f"Made by `.venv/bin/python bench/autoscaling/law_ablation.py "
        f"{command}` in {time.monotonic() - started:.0f} s: each cell is all-SLO attainment, "
        "GPU-h of `wok simulate <condition> --cold-start 90 --policy <policy>`.\n\n"
        + table(results)
        + "\n"
    )
    write_results(args.out, text, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
