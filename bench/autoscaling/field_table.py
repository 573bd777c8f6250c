"""wok against each competitor, one by one: the competitor swept over its targets (each target at
its best B), its frontier read at wok's GPU-hours, and whether any of its variants dominates wok
(as much or more served for as many or fewer GPU-hours, one of them strictly).

Reads `wok evaluate` reports (their JSON) and `bench/autoscaling/daytrace.py` runs (the day and its
windows), and writes one table, with a plot of the fleet against the load over the day for wok
and the two competitors nearest it.

    .venv/bin/python bench/autoscaling/field_table.py \\
        --evaluation bench/autoscaling/results/evaluation-field.json \\
        --day bench/autoscaling/results/daytrace.json --out bench/autoscaling/results/field.md

A competitor is a registry entry: `hpa-concurrency-swept`, `keda-waiting-swept`,
`aibrix-kpa-swept`, `aibrix-apa-swept`, `dynamo-planner-swept`, `wva-swept`. Its frontier at
wok's GPU-h is `wok_sim.evaluation_analysis.frontier_at` over its variants (linear between
adjacent ones, never below a cheaper one), as the static frontier is read. Every trace here is a
development trace.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wok_sim.evaluation_analysis import Point, best_batches, frontier_at, point, points
from wok_sim.evaluation_matrix import STATIC, SWEPT_BASELINES, Condition, Job, Outcome

WOK = "wok"
HOUR_S = 3600.0


@dataclass(frozen=True)
class Standing:
    condition: str
    competitor: str
    wok: Point
    frontier_there: float  # the competitor's frontier at wok's mean GPU-h
    nearest: Point | None  # its cheapest variant reaching wok's attainment, if one does
    best: Point  # its variant with the highest attainment
    dominated_by: Point | None  # a variant as good for no more GPU-h, one of them strictly
    variants: int
    cheapest_gpu_hours: float  # its cheapest variant's: above wok's, its frontier there is none

    @property
    def above(self) -> bool:
        return self.wok.attainment >= self.frontier_there


def standing(condition: str, competitor: str, wok: Point, variants: Sequence[Point]) -> Standing:
    front = sorted(best_batches(variants), key=lambda p: p.gpu_hours)
    reaching = [p for p in front if p.attainment >= wok.attainment]
    dominating = [
        p
        for p in reaching
        if p.gpu_hours <= wok.gpu_hours
        and (p.attainment > wok.attainment or p.gpu_hours < wok.gpu_hours)
    ]
    return Standing(
        condition=condition,
        competitor=competitor,
        wok=wok,
        frontier_there=frontier_at(front, wok.gpu_hours),
        nearest=min(reaching, key=lambda p: p.gpu_hours, default=None),
        best=max(front, key=lambda p: (p.attainment, -p.gpu_hours)),
        dominated_by=min(dominating, key=lambda p: p.gpu_hours, default=None),
        variants=len(front),
        cheapest_gpu_hours=front[0].gpu_hours,
    )


def standings(outcomes: Sequence[Outcome], label: dict[Condition, str]) -> list[Standing]:
    """Each condition's wok (mean over its seeds) against each competitor run there."""
    by: dict[tuple[Condition, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by[(o.job.condition, o.job.policy)].append(o)
    out = []
    for condition in label:
        if not by[(condition, WOK)]:
            continue
        wok = point(by[(condition, WOK)])
        for competitor in SWEPT_BASELINES:
            if by[(condition, competitor)]:
                variants = points(by[(condition, competitor)])
                out.append(standing(label[condition], competitor, wok, variants))
    return out


def evaluation_outcomes(path: Path) -> list[Outcome]:
    report = json.loads(path.read_text())
    fields = ("trace", "scale", "cold_start_s", "slo")
    return [
        Outcome(
            Job(Condition(*(r[f] for f in fields)), r["seed"], r["policy"], 0),
            r["name"],
            r["batch"],
            r["attainment"],
            r["gpu_hours"],
            r["sim_s"],
        )
        for r in report["runs"]
    ]


def day_outcomes(path: Path) -> tuple[list[Outcome], Condition, list[dict]]:
    stored = json.loads(path.read_text())
    condition = Condition(stored.get("trace", "day"), stored.get("scale", 1.0), 90.0, "loose")
    runs = stored["runs"]
    outcomes = [
        Outcome(
            Job(condition, r["seed"], r["policy"], r["variant"]),
            r["name"],
            r["batch"],
            r["attainment"],
            r["gpu_hours"],
            r["sim_s"],
        )
        for r in runs
        if r["policy"] != STATIC
    ]
    return outcomes, condition, runs


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _p(p: Point | None) -> str:
    if p is None:
        return "none"
    return f"{p.name} B{p.batch}: {_pct(p.attainment)} % at {p.gpu_hours:.2f} ({p.seeds} seeds)"


def markdown(rows: Sequence[Standing], commands: Sequence[str], notes: Sequence[str] = ()) -> str:
    lines = [
        "# wok against each competitor, swept over its targets",
        "",
        *(f"Made from: `{c}`" for c in commands),
        "",
        *(f"{n}\n" for n in notes),
        "Each competitor's variants are its targets, each at its best B (in hindsight); its "
        "frontier at wok's mean GPU-h is linear between adjacent variants and never below a "
        "cheaper one, as the static frontier is read. wok: mean over its seeds; a variant "
        "run on the first seed only (it fell a point or more below wok there) is marked by "
        "its seed count. Dominated: a variant of the competitor served as much or more for as "
        "many or fewer GPU-h, one of them strictly. Every trace here is a development trace.",
        "",
        "| condition | competitor | variants | wok % at GPU-h | its frontier % at wok's GPU-h "
        "| wok above | cheapest variant reaching wok | GPU-h ÷ wok's | dominated by |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        ratio = f"{s.nearest.gpu_hours / s.wok.gpu_hours:.2f}×" if s.nearest else "-"
        there = (
            _pct(s.frontier_there)
            if s.cheapest_gpu_hours <= s.wok.gpu_hours
            else "none (every variant costs more)"
        )
        lines.append(
            f"| {s.condition} | {s.competitor.removesuffix('-swept')} | {s.variants} "
            f"| {_pct(s.wok.attainment)} at {s.wok.gpu_hours:.2f} | {there} "
            f"| {'yes' if s.above else '**no**'} | {_p(s.nearest)} | {ratio} "
            f"| {'**' + _p(s.dominated_by) + '**' if s.dominated_by else 'no'} |"
        )
    above = sum(s.above for s in rows)
    dominated = sum(s.dominated_by is not None for s in rows)
    lines += [
        "",
        f"wok above the competitor's frontier in {above} of {len(rows)} pairs; dominated in "
        f"{dominated}.",
    ]
    return "\n".join(lines) + "\n"


def nearest_two(rows: Sequence[Standing]) -> list[Standing]:
    """The two competitors whose frontier comes nearest wok at its GPU-h."""
    return sorted(rows, key=lambda s: -s.frontier_there)[:2]


def plot_day(runs: list[dict], rows: Sequence[Standing], title: str, path: Path) -> None:
    """Arrivals per hour and the ready pods of wok and the two nearest competitors (seed 0:
    for each competitor its cheapest variant reaching wok, else its best)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wok0 = next((r for r in runs if r["policy"] == WOK and r["seed"] == 0), None)
    if wok0 is None:
        return
    hours = list(range(len(wok0["hourly"])))
    fig, (load, pods) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    load.bar(hours, [h["arrived"] / HOUR_S for h in wok0["hourly"]], color="tab:gray")
    load.set_ylabel("arrivals/s")

    def ready(run: dict) -> list[float]:
        return [h["ready"] for h in run["hourly"]]

    pods.step(hours, ready(wok0), where="mid", label=f"wok ({_pct(wok0['attainment'])} %)")
    for s in nearest_two(rows):
        chosen = s.nearest or s.best
        run = next(
            r
            for r in runs
            if r["seed"] == 0 and (r["name"], r["batch"]) == (chosen.name, chosen.batch)
        )
        pods.step(
            hours,
            ready(run),
            where="mid",
            label=f"{chosen.name} B{chosen.batch} ({_pct(run['attainment'])} %)",
        )
    pods.set_ylim(bottom=0)
    pods.set_ylabel("ready pods (hourly mean)")
    pods.set_xlabel("hour")
    pods.legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evaluation", type=Path, action="append", default=[])
    parser.add_argument("--day", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", action="append", default=[], help="a paragraph: how it ran")
    args = parser.parse_args()
    rows: list[Standing] = []
    commands = []
    for path in args.evaluation:
        outcomes = evaluation_outcomes(path)
        conditions = dict.fromkeys(o.job.condition for o in outcomes)
        rows += standings(outcomes, {c: c.label for c in conditions})
        commands.append(json.loads(path.read_text())["command"])
    for path in args.day:
        outcomes, condition, runs = day_outcomes(path)
        label = f"{path.stem}: {condition.label}"
        mine = standings(outcomes, {condition: label})
        rows += mine
        commands.append(json.loads(path.read_text())["command"])
        plot_day(runs, mine, label, args.out.with_name(f"{args.out.stem}-{path.stem}.png"))
    command = "python bench/autoscaling/field_table.py " + " ".join(
        [*(f"--evaluation {p}" for p in args.evaluation), *(f"--day {p}" for p in args.day)]
        + [f"--out {args.out}"]
        + (["--note TEXT (each paragraph below)"] if args.note else [])
    )
    args.out.write_text(markdown(rows, [*commands, command], args.note))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
