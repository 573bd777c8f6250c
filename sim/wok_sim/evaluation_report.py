"""`wok evaluate`'s report: the table, its JSON, and the plot, from an `Evaluation`; and the
outcomes read back from a report's JSON (`--render`). Nothing here simulates."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wok_sim.evaluation_analysis import (
    PEAK_GOAL,
    PEAK_REACHES,
    Evaluation,
    Point,
    best_batches,
    misses,
    pct,
    short,
)
from wok_sim.evaluation_matrix import (
    RIVAL_MARGIN,
    SEEDS,
    WARM_UP_S,
    Condition,
    Job,
    Outcome,
)


def _span(p: Point) -> str:
    lo, hi = p.attainment_range
    glo, ghi = p.gpu_hours_range
    return f"{pct(p.attainment)} [{pct(lo)}–{pct(hi)}] | {p.gpu_hours:.2f} [{glo:.2f}–{ghi:.2f}]"


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else "yes" if value else "**no**"


def markdown(ev: Evaluation, command: str) -> str:
    """The results as one table (and the swept baselines' figures), with the command."""
    lines = [
        "# wok evaluate: every policy against the static frontier of each condition",
        "",
        f"Command: `{command}`",
        "",
        f"{ev.simulations} simulations in {ev.wall_s / 60:.1f} min. Mean over seeds "
        f"{', '.join(map(str, SEEDS))} (each draws the overlay copies and the routing), "
        "[min–max] over them. Attainment: the share of requests within every SLO (TTFT and "
        "TPOT; loose 2 s / 0.1 s, tight 1 s / 0.04 s). Scored from "
        f"{WARM_UP_S:g} s for every policy. Frontier: every static N at its best B, linear "
        "between adjacent N, at the policy's mean GPU-h. Rival: the cheapest variant of a swept "
        "baseline (HPA, KEDA, AIBrix, Dynamo, WVA) whose mean attainment reaches the policy's. "
        "The static fleets and the swept baselines choose B and target in hindsight.",
        "",
        "| condition | policy | all SLOs % [range] | GPU-h [range] | frontier % there "
        "| above | static-peak (99 %) | cheapest rival at its attainment | fewer GPU-h |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in ev.verdicts:
        lines.append(
            f"| {v.condition.label} | {v.policy.name} | {_span(v.policy)} "
            f"| {pct(v.frontier_attainment)} | {'yes' if v.above_frontier else '**no**'} "
            f"| {short(v.static_peak)} "
            f"| {'not run' if v.cheaper_than_baselines is None else short(v.cheapest_rival)} "
            f"| {_yes_no(v.cheaper_than_baselines)} |"
        )
    lines += ["", "## Where a goal is missed", ""]
    lines += [
        "Above the frontier at its mean GPU-h; fewer GPU-h than every swept baseline that reaches "
        f"its attainment; {PEAK_GOAL:.0%} wherever static-peak reaches {PEAK_REACHES:.1%}.",
        "",
    ]
    missed = [(v, m) for v in ev.verdicts for m in misses(v)]
    lines += [f"- {v.condition.label}, {v.policy.name}: {m}" for v, m in missed] or ["- none"]
    lines += ["", "## The swept baselines (each target at its best B)", ""]
    lines += [
        "Mean over the seeds, at the best B among those run on the most seeds; a target marked "
        "(seed 0) fell more than "
        f"{RIVAL_MARGIN:.0%} below every policy on the first seed and was not run again.",
        "",
        "| condition | target: all SLOs % at GPU-h (B) |",
        "|---|---|",
    ]
    for condition, rivals in ev.baselines.items():
        if not rivals:
            continue
        cells = "; ".join(
            f"{p.name} {pct(p.attainment)} at {p.gpu_hours:.2f} (B{p.batch})"
            + (" (seed 0)" if p.seeds < len(SEEDS) else "")
            for p in sorted(best_batches(rivals), key=lambda p: p.name)
        )
        lines.append(f"| {condition.label} | {cells} |")
    lines += ["", "## The static frontiers (every N at its best B)", ""]
    lines += ["| condition | N (B): all SLOs % at GPU-h |", "|---|---|"]
    seen: set[tuple[str, float, str]] = set()
    for condition, front in ev.frontiers.items():
        if condition.frontier_key in seen:
            continue
        seen.add(condition.frontier_key)
        cells = "; ".join(
            f"{p.name.removeprefix('static-')} (B{p.batch}) {pct(p.attainment)} at "
            f"{p.gpu_hours:.2f}"
            for p in front
        )
        label = f"{condition.trace_name} ×{condition.scale:g}, {condition.slo} SLOs"
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines) + "\n"


def to_json(ev: Evaluation, outcomes: Sequence[Outcome], command: str) -> str:
    return json.dumps(
        {
            "command": command,
            "seeds": list(SEEDS),
            "warm_up_s": WARM_UP_S,
            "wall_s": round(ev.wall_s, 1),
            "verdicts": [asdict(v) for v in ev.verdicts],
            "runs": [
                {
                    **asdict(o.job.condition),
                    "seed": o.job.seed,
                    "policy": o.job.policy,
                    "name": o.name,
                    "batch": o.batch,
                    "attainment": round(o.attainment, 6),
                    "gpu_hours": round(o.gpu_hours, 4),
                    "sim_s": round(o.wall_s, 2),
                }
                for o in sorted(outcomes, key=lambda o: (o.job.condition, o.job.policy, o.name))
            ],
        },
        indent=1,
    )


def _bar(mean: float, span: Iterable[float]) -> list[list[float]]:
    """An error bar from a mean to its seeds' min and max: never negative (the mean of equal
    values may differ from them in the last digit)."""
    lo, hi = span
    return [[max(0.0, mean - lo)], [max(0.0, hi - mean)]]


def plot(ev: Evaluation, path: Path) -> None:
    """One panel per condition: the static frontier, the swept baselines, each policy with its
    range over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = list(ev.frontiers)
    cols = min(4, len(conditions))
    rows = math.ceil(len(conditions) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
    for ax, condition in zip(axes.flat, conditions, strict=False):
        front = ev.frontiers[condition]
        ax.plot([p.gpu_hours for p in front], [100 * p.attainment for p in front], "k.-",
                label="static frontier")  # fmt: skip
        rivals = ev.baselines[condition]
        ax.scatter([p.gpu_hours for p in rivals], [100 * p.attainment for p in rivals], s=8,
                   color="tab:gray", alpha=0.6, label="swept baselines")  # fmt: skip
        for v in (v for v in ev.verdicts if v.condition == condition):
            p = v.policy
            ax.errorbar(
                p.gpu_hours,
                100 * p.attainment,
                xerr=_bar(p.gpu_hours, p.gpu_hours_range),
                yerr=_bar(100 * p.attainment, (100 * lo for lo in p.attainment_range)),
                fmt="o",
                label=p.name,
            )
        ax.set_ylim(90, 100.2)
        ax.set_title(condition.label, fontsize="small")
        ax.set_xlabel("GPU-h")
        ax.set_ylabel("all SLOs (%)")
    for ax in list(axes.flat)[len(conditions) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize="x-small", loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def outcomes_of(report: dict[str, Any]) -> list[Outcome]:
    """An earlier run's outcomes from its JSON (`to_json`)."""
    fields = ("trace", "scale", "cold_start_s", "slo")
    return [
        Outcome(
            job=Job(Condition(*(r[f] for f in fields)), r["seed"], r["policy"], 0),
            name=r["name"],
            batch=r["batch"],
            attainment=r["attainment"],
            gpu_hours=r["gpu_hours"],
            wall_s=r["sim_s"],
        )
        for r in report["runs"]
    ]
