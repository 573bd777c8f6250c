"""A change to the law, before against after, on `wok evaluate`'s matrix without rerunning what
it cannot move.

A law change moves the law's policies only: the static fleets of each frontier and the swept
HPA / KEDA baselines run the same simulations. `seed` writes a `wok evaluate --journal` that holds
those runs of an earlier evaluation.json, so `wok evaluate --policy wok --journal J` simulates the
law's jobs (and any baseline seed a moved verdict newly asks for); `seed --with-law` keeps the
law's runs too, for a change to the matrix's other jobs (the baselines' sweep). evaluation.json
keeps attainment to 6 digits and GPU-h to 4, so a frontier read at exactly a static fleet's GPU-h
(the conversation trace's single pod) can fall just below it: read that row's verdict, not its
"frontier there". `table` sets several runs' rows of one policy side by side; `day` does the
same for `daytrace.py`'s JSONs (the law's runs per seed, against the hourly fleet's GPU-h).

    python bench/autoscaling/law_ab.py seed bench/autoscaling/results/evaluation.json /tmp/j.jsonl
    wok evaluate --policy wok --jobs 1 --journal /tmp/j.jsonl --out /tmp/after
    python bench/autoscaling/law_ab.py table now=/tmp/before/evaluation.json \\
        after=/tmp/after/evaluation.json --out mu_window
    python bench/autoscaling/law_ab.py day now=/tmp/daytrace.json \\
        after=bench/autoscaling/results/daytrace.json --out law_day

`table` writes bench/autoscaling/results/<out>.json and prints the markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hourly_fleet import HOURLY, WOK, pairs, runs_from

from wok_sim.evaluation_matrix import Condition, variants_of

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
CONDITION = ("trace", "scale", "cold_start_s", "slo")


def journal_line(
    run: dict[str, Any], variants: dict[Any, list[Any]], *, with_law: bool = False
) -> dict[str, Any] | None:
    """A journal line (`evaluate.Journal`) for a static fleet or a swept baseline's run, and for
    the law's (one variant each) `with_law`."""
    if run["policy"].startswith("wok") and not with_law:
        return None
    condition = Condition(*(run[f] for f in CONDITION))
    if run["policy"].startswith("wok"):
        variant = 0
    elif run["policy"] == "static":  # its variant is replicas × 1000 + batch
        variant = int(run["name"].split("-")[1]) * 1000 + run["batch"]
    else:
        key = (run["policy"], condition, run["seed"])
        if key not in variants:
            variants[key] = variants_of(run["policy"], condition, run["seed"])
        variant = variants[key].index((run["name"], run["batch"]))
    same = (*CONDITION, "seed", "policy", "name", "batch", "attainment", "gpu_hours")
    return {**{f: run[f] for f in same}, "variant": variant, "wall_s": run["sim_s"]}


def seed(evaluation: Path, journal: Path, *, with_law: bool = False) -> int:
    variants: dict[Any, list[Any]] = {}
    runs = json.loads(evaluation.read_text())["runs"]
    lines = [journal_line(run, variants, with_law=with_law) for run in runs]
    kept = [json.dumps(line) for line in lines if line is not None]
    journal.write_text("".join(f"{line}\n" for line in kept))
    return len(kept)


def rows(evaluation: dict[str, Any], policy: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The policy's verdict per condition, with its per-seed attainment and GPU-h."""
    out = {}
    for v in evaluation["verdicts"]:
        if v["policy"]["name"] == policy:
            p = v["policy"]
            out[tuple(v["condition"].values())] = {
                "attainment": round(p["attainment"], 6),
                "gpu_hours": round(p["gpu_hours"], 4),
                "frontier_there": round(v["frontier_attainment"], 6),
                "above": v["above_frontier"],
                "per_seed": {},
            }
    for r in evaluation["runs"]:
        if r["policy"] == policy:
            row = out[tuple(r[f] for f in CONDITION)]
            row["per_seed"][str(r["seed"])] = [r["attainment"], r["gpu_hours"]]
    return out


def cell(row: dict[str, Any], base: dict[str, Any] | None) -> str:
    text = f"{100 * row['attainment']:.2f} at {row['gpu_hours']:.2f}"
    if base is not None:
        points = 100 * (row["attainment"] - base["attainment"])
        text += f" ({points:+.2f}, {100 * (row['gpu_hours'] / base['gpu_hours'] - 1):+.0f} %)"
    return text + ("" if row["above"] else " (under)")


def table(runs: dict[str, Path], policy: str) -> tuple[str, dict[str, Any]]:
    named = {name: rows(json.loads(path.read_text()), policy) for name, path in runs.items()}
    first = next(iter(named.values()))
    lines = [f"| condition | {' | '.join(named)} |", "|---" * (len(named) + 1) + "|"]
    for key, base in first.items():
        trace, scale, start, slo = key
        cells = [cell(named[name][key], None if i == 0 else base) for i, name in enumerate(named)]
        lines.append(f"| {trace} ×{scale:g}, {start:g} s, {slo} | {' | '.join(cells)} |")
    conditions = [
        {"condition": dict(zip(CONDITION, key, strict=True))} | {n: named[n][key] for n in named}
        for key in first
    ]
    data = {
        "policy": policy,
        "runs": {name: str(path) for name, path in runs.items()},
        "conditions": conditions,
    }
    return "\n".join(lines) + "\n", data


def day_table(runs: dict[str, Path], hourly: Path) -> tuple[str, dict[str, Any]]:
    """Each day JSON's runs of the law per seed, their means, and their GPU-h ÷ the hourly
    fleet's (`hourly_fleet.json`, paired by scale and seed as hourly_fleet.py pairs them, over
    the seeds it has)."""
    fleets = [r for r in json.loads(hourly.read_text())["runs"] if r["policy"] == HOURLY]
    lines = [
        "| run | scale | seeds | all SLOs % (mean) | GPU-h (mean) | GPU-h ÷ the hourly fleet's |",
        "|---|---|---|---|---|---|",
    ]
    data: dict[str, Any] = {"policy": WOK, "runs": {}}
    for name, path in runs.items():
        laws = [r for r in runs_from(path, fleets) if r["policy"] == WOK]
        scale = laws[0]["scale"]
        seeds = sorted((r["seed"], r["attainment"], r["gpu_hours"]) for r in laws)
        attainment = sum(a for _, a, _ in seeds) / len(seeds)
        gpu_hours = sum(g for _, _, g in seeds) / len(seeds)
        paired = pairs([*fleets, *laws], scale)
        ratio = "-"
        if paired:  # the means' ratio over the seeds whose hourly fleet was searched
            spent = sum(w["gpu_hours"] for _, w in paired)
            fleet = sum(h["gpu_hours"] for h, _ in paired)
            ratio = f"{100 * spent / fleet:.1f} % ({len(paired)} seeds)"
        lines.append(
            f"| {name} | ×{scale:g} | {','.join(str(s) for s, _, _ in seeds)} | "
            f"{100 * attainment:.2f} | {gpu_hours:.2f} | {ratio} |"
        )
        data["runs"][name] = {"path": str(path), "scale": scale, "per_seed": seeds}
    return "\n".join(lines) + "\n", data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("seed", help="a journal of an evaluation.json's statics and baselines")
    s.add_argument("evaluation", type=Path)
    s.add_argument("journal", type=Path)
    s.add_argument("--with-law", action="store_true", help="the law's runs as well")
    t = sub.add_parser("table", help="NAME=evaluation.json … side by side, the first the base")
    t.add_argument("runs", nargs="+")
    t.add_argument("--policy", default="wok")
    t.add_argument("--out", help="write bench/autoscaling/results/<out>.json")
    d = sub.add_parser("day", help="NAME=daytrace.json … side by side against the hourly fleet")
    d.add_argument("runs", nargs="+")
    d.add_argument("--hourly", type=Path, default=RESULTS / "hourly_fleet.json")
    d.add_argument("--out", help="write bench/autoscaling/results/<out>.json")
    args = parser.parse_args()
    if args.command == "seed":
        print(
            f"{seed(args.evaluation, args.journal, with_law=args.with_law)} runs → {args.journal}"
        )
        return
    runs = dict((name, Path(path)) for name, path in (r.split("=", 1) for r in args.runs))
    if args.command == "day":
        markdown, data = day_table(runs, args.hourly)
    else:
        markdown, data = table(runs, args.policy)
    print(markdown, end="")
    if args.out:
        (RESULTS / f"{args.out}.json").write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
