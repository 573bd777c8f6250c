"""`wok evaluate`'s verdicts: each variant's mean and range over the seeds (`Point`), the static
frontier of a condition and the policy's place against it and against the swept baselines, and
the goals a verdict misses, in words. Pure: nothing here simulates.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from wok_sim.evaluation_matrix import SEEDS, STATIC, SWEPT_BASELINES, Condition, Outcome

# The goals a policy is judged on besides the frontier and the baselines: where static-peak (the
# cheapest fleet at 99 %) reaches 99.5 %, the policy's mean must reach 99 %.
PEAK_REACHES, PEAK_GOAL = 0.995, 0.99


@dataclass(frozen=True)
class Point:
    """One policy variant on one condition, over the seeds."""

    name: str
    batch: int | None
    attainment: float  # mean over seeds
    attainment_range: tuple[float, float]
    gpu_hours: float
    gpu_hours_range: tuple[float, float]
    seeds: int


def point(outcomes: Sequence[Outcome]) -> Point:
    att = [o.attainment for o in outcomes]
    gpu = [o.gpu_hours for o in outcomes]
    return Point(
        name=outcomes[0].name,
        batch=outcomes[0].batch,
        attainment=statistics.fmean(att),
        attainment_range=(min(att), max(att)),
        gpu_hours=statistics.fmean(gpu),
        gpu_hours_range=(min(gpu), max(gpu)),
        seeds=len(outcomes),
    )


def points(outcomes: Iterable[Outcome]) -> list[Point]:
    """One point per variant (name and batch), its seeds together."""
    by_variant: dict[tuple[str, int | None], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_variant[(o.name, o.batch)].append(o)
    return [point(group) for group in by_variant.values()]


def best_batches(variants: Iterable[Point]) -> list[Point]:
    """Each name (a fleet size, a baseline target) at its best B: the highest mean attainment,
    then the fewest GPU-hours, among the B run on the most seeds (one lucky seed must not pick
    it)."""
    best: dict[str, Point] = {}
    for p in variants:
        if p.name not in best or (p.seeds, p.attainment, -p.gpu_hours) > (
            best[p.name].seeds,
            best[p.name].attainment,
            -best[p.name].gpu_hours,
        ):
            best[p.name] = p
    return list(best.values())


def frontier(statics: Sequence[Point]) -> list[Point]:
    """Every fleet size at its best B (`best_batches`), by GPU-hours."""
    return sorted(best_batches(statics), key=lambda p: p.gpu_hours)


def frontier_at(front: Sequence[Point], gpu_hours: float) -> float:
    """The frontier's attainment at `gpu_hours`: linear between adjacent fleet sizes, the best
    fleet within that budget, never less than a smaller fleet's (more pods may do worse at a
    worse B; the smaller one could still be bought)."""
    below = [p for p in front if p.gpu_hours <= gpu_hours]
    above = [p for p in front if p.gpu_hours > gpu_hours]
    best_below = max((p.attainment for p in below), default=0.0)
    if not below or not above:
        return best_below
    lo, hi = below[-1], above[0]
    share = (gpu_hours - lo.gpu_hours) / (hi.gpu_hours - lo.gpu_hours)
    return max(best_below, lo.attainment + share * (hi.attainment - lo.attainment))


def static_peak(front: Sequence[Point], target: float = 0.99) -> Point | None:
    """The cheapest fleet whose mean attainment reaches `target`; None if none does."""
    return next((p for p in front if p.attainment >= target), None)


@dataclass(frozen=True)
class Verdict:
    condition: Condition
    policy: Point
    frontier_attainment: float  # the frontier at the policy's mean GPU-hours
    above_frontier: bool
    cheapest_rival: Point | None  # the cheapest baseline variant at or above its attainment
    cheaper_than_baselines: bool | None  # None: no baseline was run on this condition
    static_peak: Point | None


def judge(
    condition: Condition, policy: Point, front: Sequence[Point], rivals: Sequence[Point]
) -> Verdict:
    at = frontier_at(front, policy.gpu_hours)
    # A target run on the first seed alone fell `RIVAL_MARGIN` below every policy there: it
    # reaches none, and its one seed would flatter it against a mean.
    reaching = [r for r in rivals if r.seeds == len(SEEDS) and r.attainment >= policy.attainment]
    cheapest = min(reaching, key=lambda r: r.gpu_hours, default=None)
    return Verdict(
        condition=condition,
        policy=policy,
        frontier_attainment=at,
        above_frontier=policy.attainment >= at,
        cheapest_rival=cheapest,
        cheaper_than_baselines=(
            None if not rivals else cheapest is None or policy.gpu_hours < cheapest.gpu_hours
        ),
        static_peak=static_peak(front),
    )


def misses(v: Verdict) -> list[str]:
    """The goals a verdict misses, in words (none: it meets them all)."""
    p, peak, said = v.policy, v.static_peak, []
    if not v.above_frontier:
        said.append(
            f"under the frontier: {pct(p.attainment)} % at {p.gpu_hours:.2f} GPU-h, the "
            f"frontier {pct(v.frontier_attainment)} % there"
        )
    if v.cheaper_than_baselines is False:
        said.append(
            f"a baseline reaches its attainment with fewer GPU-h ({short(v.cheapest_rival)})"
        )
    if peak is not None and peak.attainment >= PEAK_REACHES and p.attainment < PEAK_GOAL:
        said.append(
            f"under {PEAK_GOAL:.0%} ({pct(p.attainment)} %) where static-peak reaches "
            f"{PEAK_REACHES:.1%} ({short(peak)})"
        )
    return said


@dataclass(frozen=True)
class Evaluation:
    verdicts: list[Verdict]
    frontiers: dict[Condition, list[Point]]
    baselines: dict[Condition, list[Point]]
    simulations: int
    wall_s: float


def evaluate(
    outcomes: Sequence[Outcome], conditions: Sequence[Condition], policies: Sequence[str]
) -> Evaluation:
    by_condition: dict[tuple[Condition, str], list[Outcome]] = defaultdict(list)
    statics: dict[tuple[str, float, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if o.job.policy == STATIC:
            statics[o.job.condition.frontier_key].append(o)
        else:
            by_condition[(o.job.condition, o.job.policy)].append(o)
    verdicts, frontiers, baselines = [], {}, {}
    for condition in conditions:
        front = frontier(points(statics[condition.frontier_key]))
        rivals = [p for b in SWEPT_BASELINES for p in points(by_condition[(condition, b)])]
        frontiers[condition], baselines[condition] = front, rivals
        for policy in policies:
            if by_condition[(condition, policy)]:
                verdicts.append(
                    judge(condition, point(by_condition[(condition, policy)]), front, rivals)
                )
    return Evaluation(verdicts, frontiers, baselines, len(outcomes), 0.0)


def pct(value: float) -> str:
    return f"{100 * value:.2f}"


def short(p: Point | None) -> str:
    if p is None:
        return "none"
    batch = "" if p.batch is None else f" B{p.batch}"
    return f"{p.name}{batch}: {pct(p.attainment)} % at {p.gpu_hours:.2f}"
