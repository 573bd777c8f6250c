"""The law's fourth pass, rule by rule: each `wok evaluate` run's law rows side by side.

Each run simulated only the law's policies (`--policy wok,<ablation>`); the static fleets and the
swept baselines came from bench/autoscaling/results/evaluation.json through a journal
(`bench/autoscaling/law_ab.py seed`), so each run's frontier and rivals are those of the published
matrix. Each JSON here is trimmed to the law's runs and the verdicts; this script writes
bench/autoscaling/results/law_fourth_pass.md from them.

    python bench/autoscaling/law_fourth_pass.py trim /tmp/after/evaluation.json \
        bench/autoscaling/results/law_prior.json
    python bench/autoscaling/law_fourth_pass.py table
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
#: (file, what it ran, the law's commit), in the order the rules were built.
RUNS = (
    ("law_before_tight", "the law before this pass", "fadf9e4"),
    ("law_prior", "rule 1: μ's prior, the proven floor dropped (wok) vs no prior", "85b86c2"),
    ("law_budget", "rule 2: the budget forgives (wok) vs every breach a burst", "ecd334a"),
    ("law_bsla_tight_conv_mooncake", "rule 3: B_SLA in the cap (wok) vs none", "fd33380"),
    ("law_bsla_tight_code", "rule 3: B_SLA in the cap (wok) vs none", "fd33380"),
    ("law_final", "the three rules, the proven floor kept (B_SLA in the cap)", "7448fd8"),
    ("law_default", "the default law: the prior, the forgiving budget, no B_SLA", "5e3ac1f"),
    ("law_budget_code", "rule 2 on the code trace, loose: forgiving (wok) vs not", "08c6aef"),
)


def trim(source: Path, target: Path) -> None:
    data = json.loads(source.read_text())
    data["runs"] = [r for r in data["runs"] if r["policy"].startswith("wok")]
    data["verdicts"] = [v for v in data["verdicts"] if v["policy"]["name"].startswith("wok")]
    target.write_text(json.dumps(data, indent=1) + "\n")


def law_rows(data: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
    runs = defaultdict(list)
    for r in data["runs"]:
        runs[(r["trace"], r["scale"], r["cold_start_s"], r["slo"], r["policy"])].append(r)
    above = {
        (v["condition"]["trace"], v["condition"]["scale"], v["condition"]["cold_start_s"],
         v["condition"]["slo"], v["policy"]["name"]): v["above_frontier"]
        for v in data["verdicts"]
    }  # fmt: skip
    return {
        key: {
            "attainment": 100 * statistics.mean(r["attainment"] for r in rs),
            "gpu_hours": statistics.mean(r["gpu_hours"] for r in rs),
            "seeds": len(rs),
            "above": above.get(key),
        }
        for key, rs in sorted(runs.items())
    }


def table() -> str:
    lines = [
        "# The law's fourth pass, rule by rule",
        "",
        "Written by `python bench/autoscaling/law_fourth_pass.py table`. Each run: a checkout of "
        "the commit named, `python bench/autoscaling/law_ab.py seed "
        "bench/autoscaling/results/evaluation.json J` (the static fleets "
        "and swept baselines of the published matrix), then the command shown, at `nice -n 10` on "
        "the shared 2-core machine; the law's rows are means over seeds 0-4, scored from 300 s. "
        "Every trace here is a development trace.",
        "",
    ]
    for name, what, commit in RUNS:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        lines += [f"## {what} (`{name}.json`, the law at {commit})", "", f"`{data['command']}`", ""]
        lines += ["| condition | policy | all SLOs % | GPU-h | seeds | above the frontier |"]
        lines += ["|---|---|---|---|---|---|"]
        for (trace, scale, start, slo, policy), row in law_rows(data).items():
            lines.append(
                f"| {trace} ×{scale:g}, {start:g} s, {slo} | {policy} | {row['attainment']:.2f} | "
                f"{row['gpu_hours']:.2f} | {row['seeds']} | {'yes' if row['above'] else 'no'} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trim")
    t.add_argument("source", type=Path)
    t.add_argument("target", type=Path)
    sub.add_parser("table")
    args = parser.parse_args()
    if args.command == "trim":
        trim(args.source, args.target)
    else:
        (RESULTS / "law_fourth_pass.md").write_text(table())


if __name__ == "__main__":
    main()
