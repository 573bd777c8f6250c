"""The control law against its own ablations, over traces, overlay seeds and rate scales.

One row per condition: each policy's attainment of all SLOs and GPU-hours on the same arrivals.
`wok-frozen-cap` and `wok-frozen-plan` are the law with its batch pinned (`sim/wok_sim/
wok_policy.py`), so a difference between them and `wok` is what the moving batch buys;
`wok-start-cap` starts the moving batch at the cap instead of the spec's initial batch. Every
condition here is a development condition: the law's constants were judged on all of them
together (docs/control-law.md), never on one.

    .venv/bin/python bench/law_ablation.py --out law_ablation       # about 20 min on one core
    .venv/bin/python bench/law_ablation.py --policies wok --only code

Writes bench/results/<out>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "bench" / "traces"
LOOSE = ["--slo-ttft", "2", "--slo-tpot", "0.1"]
RAMPS = "script:300@2-20,600@20,300@20-2,300@2,300@2-30,300@30-5,600@5"


def conditions() -> dict[str, list[str]]:
    """Name → `wok simulate` arguments (90 s pod start unless the name says otherwise)."""
    runs: dict[str, list[str]] = {}
    for scale in (2, 3, 4):
        for seed in (0, 1, 2):
            runs[f"code x{scale} seed {seed}"] = [
                *("--rate-scale", str(scale), "--rate-mode", "overlay", "--seed", str(seed)),
                *LOOSE,
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
        runs[f"ramps, TPOT {tpot}"] = ["--trace", RAMPS, "--slo-ttft", "2", "--slo-tpot", tpot]
        runs[f"code x3 seed 0, TPOT {tpot}"] = [
            *("--rate-scale", "3", "--rate-mode", "overlay", "--slo-ttft", "2"),
            *("--slo-tpot", tpot),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="wok,wok-frozen-cap,wok-frozen-plan,wok-start-cap")
    parser.add_argument("--only", default="", help="run the conditions whose name has this")
    parser.add_argument("--out", default="law_ablation")
    args = parser.parse_args()
    started = time.monotonic()
    results = {
        name: simulate(run, args.policies)
        for name, run in conditions().items()
        if args.only in name
    }
    command = " ".join(sys.argv[1:])
    text = (
        f"# The law and its batch ablations\n\nMade by `.venv/bin/python bench/law_ablation.py "
        f"{command}` in {time.monotonic() - started:.0f} s: each cell is all-SLO attainment, "
        "GPU-h of `wok simulate <condition> --cold-start 90 --policy <policy>`.\n\n"
        + table(results)
        + "\n"
    )
    results_dir = ROOT / "bench" / "results"
    (results_dir / f"{args.out}.md").write_text(text)
    (results_dir / f"{args.out}.json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
