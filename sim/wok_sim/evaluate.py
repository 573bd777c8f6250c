"""`wok evaluate`: every policy over a matrix of conditions, against the static frontier of each.

One run of `wok simulate` is one draw: a routing seed, an overlay seed, one rate scale, one pod
start, one SLO set. A law can look good on one draw and lose on the next, so this command runs a
matrix of them and reports each policy's mean and its range over seeds. For every condition it
computes the static frontier (every fleet size N at its best fixed B, mean over the same seeds)
and says whether each policy's mean attainment is at or above the frontier at the policy's own
mean GPU-hours (linear between adjacent N: a fleet that alternated between N and N + 1 would get
there), and whether it uses fewer GPU-hours than every baseline variant (HPA on concurrency,
KEDA on waiting, swept over their own targets and over B) whose mean attainment reaches its own.

Fairness, said once: every policy is scored from the same time (`WARM_UP_S`), requests and GPU
time before it count for none (static fleets start at full size, autoscalers at the planner's
warm start); the static fleets and the baselines pick their B and target in hindsight, which no
real deployment can, so they are an upper bound on what tuning them buys. The matrix is a list
of jobs (one simulation each) run in a process pool; `--quick` runs a small one for tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TRACES_DIR = Path(__file__).resolve().parents[2] / "bench" / "traces"
TRACES = {
    "code": str(TRACES_DIR / "azure_llm_2023_code.csv"),
    "conv": str(TRACES_DIR / "azure_llm_2023_conv.csv"),
    "mooncake": str(TRACES_DIR / "mooncake_conversation.jsonl"),
    "day": str(TRACES_DIR / "servegen_m_large.json"),  # its default day, drawn with each seed
}
#: Run only when named (`--trace day`): a day is 24 times an hour-long trace's simulations.
ON_REQUEST = ("day",)
# Loose: the project's defaults. Tight: an interactive chat (25 tokens/s read speed and more).
SLO_SETS = {"loose": (2.0, 0.1), "tight": (1.0, 0.04)}
WARM_UP_S = 300.0  # longer than the slowest pod start of the matrix, plus a control tick
SEEDS = (0, 1, 2, 3, 4)  # each seed draws the overlay copies and the routing
FULL_SWEEP_BELOW = 0.90  # the frontier's fleets below this on the first seed are not run again
SATURATED = 0.999  # nor those past the first that reaches this
RIVAL_MARGIN = 0.01  # a baseline target this far below every policy on the first seed is out
# The goals a policy is judged on besides the frontier and the baselines: where static-peak (the
# cheapest fleet at 99 %) reaches 99.5 %, the policy's mean must reach 99 %.
PEAK_REACHES, PEAK_GOAL = 0.995, 0.99
MAIN_POLICIES = ("wok", "wok-frozen-cap", "wok-frozen-plan")  # those registered are run
SWEPT_BASELINES = (
    "hpa-concurrency-swept",
    "keda-waiting-swept",
    "aibrix-kpa-swept",
    "aibrix-apa-swept",
    "dynamo-planner-swept",
    "wva-swept",
)
STATIC = "static"
PROFILE = "sim:llama-3-8b-80g"
MAX_REPLICAS = 32


@dataclass(frozen=True, order=True)
class Condition:
    trace: str
    scale: float
    cold_start_s: float
    slo: str

    @property
    def label(self) -> str:
        return f"{self.trace} ×{self.scale:g}, {self.cold_start_s:g} s start, {self.slo} SLOs"

    @property
    def frontier_key(self) -> tuple[str, float, str]:
        """A static fleet never starts a pod: its results do not depend on the pod start."""
        return (self.trace, self.scale, self.slo)


@dataclass(frozen=True)
class Job:
    condition: Condition
    seed: int
    policy: str  # a registry name, or STATIC
    variant: int  # the registry variant's index; for STATIC, replicas × 1000 + batch

    @property
    def cost(self) -> float:
        """A rough relative run time, to start the longest simulations first."""
        weight = {"mooncake": 0.2, "day": 24.0}.get(self.condition.trace, 1.0)
        return self.condition.scale * weight


@dataclass(frozen=True)
class Outcome:
    job: Job
    name: str  # the variant's own name (a swept baseline's carries its target)
    batch: int | None
    attainment: float
    gpu_hours: float
    wall_s: float


def matrix(*, quick: bool = False) -> list[Condition]:
    """The conditions: on the shared code trace, the full grid of rate scale × pod start (loose
    SLOs), and the tight SLOs at ×3; on every other trace, its own rate at a 90 s start under
    both SLO sets. `quick`: the Mooncake excerpt only, two conditions."""
    if quick:
        return [
            Condition("mooncake", 1.0, 90.0, "loose"),
            Condition("mooncake", 1.0, 30.0, "tight"),
        ]
    conditions = [
        Condition("code", scale, start, "loose") for scale in (2.0, 3.0, 4.0)
        for start in (30.0, 90.0, 180.0)
    ]  # fmt: skip
    conditions.append(Condition("code", 3.0, 90.0, "tight"))
    for trace in ("conv", "mooncake", *ON_REQUEST):
        conditions += [Condition(trace, 1.0, 90.0, slo) for slo in SLO_SETS]
    return conditions


# What one worker process keeps between jobs: arrivals and contexts are built once per draw.
_CACHE: dict[Any, Any] = {}


def _requests(trace: str, scale: float, seed: int) -> list[Any]:
    from wok_contracts.traces import load_trace, scale_rate

    key = ("requests", trace, scale, seed)
    if key not in _CACHE:
        requests = load_trace(TRACES[trace], seed=seed)
        if scale != 1.0:
            requests = scale_rate(requests, scale, mode="overlay", seed=seed)
        _CACHE[key] = requests
    return _CACHE[key]


def context(condition: Condition, seed: int, *, warm_start_fleet: bool = True) -> Any:
    """The run's PolicyContext, as `wok simulate` builds it (the same warm start for all);
    without `warm_start_fleet` (enough to list the variants) it skips the planner's warm start."""
    from wok_contracts.profile import load_profile
    from wok_sim.plan import batch_mem_of, warm_start
    from wok_sim.policies import PolicyContext
    from wok_sim.report import Slos

    key = ("context", condition, seed, warm_start_fleet)
    if key not in _CACHE:
        profile = load_profile(PROFILE)
        ttft, tpot = SLO_SETS[condition.slo]
        slos = Slos(ttft, tpot)
        requests = _requests(condition.trace, condition.scale, seed)
        start = ("start", condition.frontier_key, seed)  # the pod start does not change it
        if warm_start_fleet and start not in _CACHE:
            _CACHE[start] = warm_start(profile, requests, slos)
        _CACHE[key] = PolicyContext(
            profile=profile,
            slo_ttft_s=ttft,
            slo_tpot_s=tpot,
            slo_e2e_s=None,
            max_replicas=MAX_REPLICAS,
            batch_mem=batch_mem_of(profile, requests),
            cold_start_s=condition.cold_start_s,
            requests=tuple(requests),
            start_replicas=_CACHE[start] if warm_start_fleet else 1,
        )
    return _CACHE[key]


def static_variants(ctx: Any) -> list[int]:
    """The static fleets of the frontier, as `replicas × 1000 + batch`: from one below to two
    above the fleet the busiest minute needs at the planner's capacity (the planner sizes for
    the minute's mean, and the seconds-long spikes inside it need more), at every B the
    baselines are swept over."""
    from wok_sim.baselines import sizing

    fleet = sizing(ctx)
    batches = ctx.sweep_batches()
    peak = math.ceil(fleet.peak_rate / fleet.capacity[batches[-1]])
    low, high = max(1, peak - 1), min(ctx.max_replicas, peak + 2)
    return [n * 1000 + b for n in range(low, high + 1) for b in batches]


def variants_of(policy: str, condition: Condition, seed: int) -> list[tuple[str, int | None]]:
    """(name, fixed batch) of each variant of a registered policy, by index."""
    from wok_sim.policies import load_registry

    ctx = context(condition, seed, warm_start_fleet=False)
    return [(p.name, p.fixed_batch) for p in load_registry()[policy].variants(ctx)]


def first_jobs(conditions: Sequence[Condition], policies: Sequence[str]) -> list[Job]:
    """Every policy on every condition and seed; on the first seed only, every static fleet of
    each frontier (N × B; they do not depend on the pod start) and every variant of the swept
    baselines (target × B) on every condition (they do depend on it)."""
    first = SEEDS[0]
    jobs = [Job(c, seed, p, 0) for c in conditions for seed in SEEDS for p in policies]
    frontiers: dict[tuple[str, float, str], Condition] = {}
    for condition in conditions:
        frontiers.setdefault(condition.frontier_key, condition)
        for baseline in SWEPT_BASELINES:
            count = len(variants_of(baseline, condition, first))
            jobs += [Job(condition, first, baseline, i) for i in range(count)]
    for condition in frontiers.values():
        ctx = context(condition, first, warm_start_fleet=False)
        jobs += [Job(condition, first, STATIC, v) for v in static_variants(ctx)]
    return jobs


def _best_per_name(outcomes: Iterable[Outcome]) -> dict[str, Outcome]:
    """Each name's best variant on the first seed: highest attainment, then fewest GPU-hours,
    then the smallest B. B values often tie to the last digit (a fleet that never fills B64 runs
    B128 the same), and the outcomes come in the order the pool finishes them: without the last
    key, which B the other seeds run would change from one run of the matrix to the next."""

    def rank(o: Outcome) -> tuple[float, float, int]:
        return (o.attainment, -o.gpu_hours, -(o.batch or 0))

    best: dict[str, Outcome] = {}
    for o in outcomes:
        if o.name not in best or rank(o) > rank(best[o.name]):
            best[o.name] = o
    return best


def second_jobs(first: Sequence[Outcome], policies: Sequence[str]) -> list[Job]:
    """The other seeds, only where they can change a verdict: each static N at its best B from
    the first seed, from the last N below `FULL_SWEEP_BELOW` to the first at `SATURATED`; each
    baseline target at its best B, where its first seed came within `RIVAL_MARGIN` of the worst
    policy's mean (a target further below can reach no policy's attainment)."""
    statics: dict[Condition, list[Outcome]] = defaultdict(list)
    baselines: dict[tuple[Condition, str], list[Outcome]] = defaultdict(list)
    by_policy: dict[tuple[Condition, str], list[float]] = defaultdict(list)
    for o in first:
        if o.job.policy == STATIC:
            statics[o.job.condition].append(o)
        elif o.job.policy in SWEPT_BASELINES:
            baselines[(o.job.condition, o.job.policy)].append(o)
        else:
            by_policy[(o.job.condition, o.job.policy)].append(o.attainment)
    worst: dict[Condition, float] = {}
    for (condition, _), values in by_policy.items():
        worst[condition] = min(worst.get(condition, 1.0), statistics.fmean(values))
    jobs: list[Job] = []
    for condition, outcomes in statics.items():
        fleets = sorted(_best_per_name(outcomes).values(), key=lambda o: o.gpu_hours)
        low = max((i for i, o in enumerate(fleets) if o.attainment < FULL_SWEEP_BELOW), default=0)
        high = next((i for i, o in enumerate(fleets) if o.attainment >= SATURATED), len(fleets))
        jobs += [
            Job(condition, seed, STATIC, o.job.variant)
            for o in fleets[low : high + 1]
            for seed in SEEDS[1:]
        ]
    for (condition, baseline), outcomes in baselines.items():
        floor = worst.get(condition, 0.0) - RIVAL_MARGIN
        for o in _best_per_name(outcomes).values():
            if o.attainment < floor:
                continue
            for seed in SEEDS[1:]:
                index = variants_of(baseline, condition, seed).index((o.name, o.batch))
                jobs.append(Job(condition, seed, baseline, index))
    return jobs


def run_job(job: Job) -> Outcome:
    from wok_sim.baselines import StaticPolicy
    from wok_sim.fleet import FleetConfig, simulate_fleet
    from wok_sim.policies import load_registry
    from wok_sim.report import Slos, summarize

    condition = job.condition
    ctx = context(condition, job.seed, warm_start_fleet=job.policy != STATIC)
    if job.policy == STATIC:
        replicas, batch = divmod(job.variant, 1000)
        policy = StaticPolicy(f"static-{replicas}", batch=batch, replicas=replicas)
    else:
        policy = load_registry()[job.policy].variants(ctx)[job.variant]
    config = FleetConfig(
        profile=ctx.profile,
        cold_start_s=condition.cold_start_s,
        seed=job.seed,
        score_from_s=WARM_UP_S,
    )
    run = simulate_fleet(list(ctx.requests), policy, config)
    result = summarize(policy.name, run, Slos(ctx.slo_ttft_s, ctx.slo_tpot_s))
    return Outcome(
        job=job,
        name=policy.name,
        batch=policy.fixed_batch,
        attainment=result.slo_attainment,
        gpu_hours=result.gpu_hours,
        wall_s=result.wall_seconds,
    )


class Journal:
    """Each finished simulation as one JSON line, so that a run stopped halfway (the shared
    machine, a deadline) continues where it stopped: a job found in the journal is not run
    again. Floats are written in full, so a result read back is the one computed. Only for the
    same code: the journal does not know which law or simulator wrote it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done: dict[Job, Outcome] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    o = _outcome_of(json.loads(line))
                    self.done[o.job] = o

    def add(self, outcome: Outcome) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(_line_of(outcome)) + "\n")


def _line_of(o: Outcome) -> dict[str, Any]:
    return {
        **asdict(o.job.condition),
        **{k: getattr(o.job, k) for k in ("seed", "policy", "variant")},
        **{k: getattr(o, k) for k in ("name", "batch", "attainment", "gpu_hours", "wall_s")},
    }


def _outcome_of(line: dict[str, Any]) -> Outcome:
    condition = Condition(*(line[f] for f in ("trace", "scale", "cold_start_s", "slo")))
    job = Job(condition, line["seed"], line["policy"], line["variant"])
    fields = ("name", "batch", "attainment", "gpu_hours", "wall_s")
    return Outcome(job, *(line[f] for f in fields))


def run_all(
    jobs: Sequence[Job], *, workers: int, desc: str, journal: Journal | None = None
) -> list[Outcome]:
    from tqdm import tqdm

    journal = journal or Journal(None)
    outcomes = [journal.done[j] for j in jobs if j in journal.done]
    ordered = sorted((j for j in jobs if j not in journal.done), key=lambda j: -j.cost)
    progress = tqdm(total=len(ordered), desc=desc, unit="sim", file=sys.stderr)

    def finished(outcome: Outcome) -> None:
        journal.add(outcome)
        outcomes.append(outcome)
        progress.update()

    if workers == 1:
        for job in ordered:
            finished(run_job(job))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for future in as_completed([pool.submit(run_job, job) for job in ordered]):
                finished(future.result())
    progress.close()
    return outcomes


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
            f"under the frontier: {_pct(p.attainment)} % at {p.gpu_hours:.2f} GPU-h, the "
            f"frontier {_pct(v.frontier_attainment)} % there"
        )
    if v.cheaper_than_baselines is False:
        said.append(
            f"a baseline reaches its attainment with fewer GPU-h ({_short(v.cheapest_rival)})"
        )
    if peak is not None and peak.attainment >= PEAK_REACHES and p.attainment < PEAK_GOAL:
        said.append(
            f"under {PEAK_GOAL:.0%} ({_pct(p.attainment)} %) where static-peak reaches "
            f"{PEAK_REACHES:.1%} ({_short(peak)})"
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


def _pct(value: float) -> str:
    return f"{100 * value:.2f}"


def _span(p: Point) -> str:
    lo, hi = p.attainment_range
    glo, ghi = p.gpu_hours_range
    return f"{_pct(p.attainment)} [{_pct(lo)}–{_pct(hi)}] | {p.gpu_hours:.2f} [{glo:.2f}–{ghi:.2f}]"


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else "yes" if value else "**no**"


def _short(p: Point | None) -> str:
    if p is None:
        return "none"
    batch = "" if p.batch is None else f" B{p.batch}"
    return f"{p.name}{batch}: {_pct(p.attainment)} % at {p.gpu_hours:.2f}"


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
        "between adjacent N, at the policy's mean GPU-h. Rival: the cheapest swept HPA / KEDA "
        "variant whose mean attainment reaches the policy's. The static fleets and the swept "
        "baselines choose B and target in hindsight.",
        "",
        "| condition | policy | all SLOs % [range] | GPU-h [range] | frontier % there "
        "| above | static-peak (99 %) | cheapest rival at its attainment | fewer GPU-h |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in ev.verdicts:
        lines.append(
            f"| {v.condition.label} | {v.policy.name} | {_span(v.policy)} "
            f"| {_pct(v.frontier_attainment)} | {'yes' if v.above_frontier else '**no**'} "
            f"| {_short(v.static_peak)} "
            f"| {'not run' if v.cheaper_than_baselines is None else _short(v.cheapest_rival)} "
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
            f"{p.name} {_pct(p.attainment)} at {p.gpu_hours:.2f} (B{p.batch})"
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
            f"{p.name.removeprefix('static-')} (B{p.batch}) {_pct(p.attainment)} at "
            f"{p.gpu_hours:.2f}"
            for p in front
        )
        label = f"{condition.trace} ×{condition.scale:g}, {condition.slo} SLOs"
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
                   color="tab:gray", alpha=0.6, label="HPA / KEDA swept")  # fmt: skip
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


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="every policy over a matrix of traces, rate scales, pod starts, SLOs and seeds, "
        "against the static frontier and swept HPA / KEDA baselines (fleet simulator)",
    )
    parser.add_argument(
        "--policy",
        default=",".join(MAIN_POLICIES),
        help="NAME[,NAME…] (default: wok and its batch ablations; names not registered are "
        "skipped with a note)",
    )
    parser.add_argument("--quick", action="store_true", help="a two-condition matrix (minutes)")
    parser.add_argument(
        "--slo", default=",".join(SLO_SETS), help="the conditions of these SLO sets only"
    )
    default_traces = ",".join(t for t in TRACES if t not in ON_REQUEST)
    parser.add_argument(
        "--trace",
        default=default_traces,
        help=f"the matrix's conditions on these traces only (default: {default_traces}; also "
        f"{', '.join(ON_REQUEST)}: the ServeGen day)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"), metavar="DIR")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="no simulation: write the table and plot again from an earlier run's JSON",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel simulations"
    )
    parser.add_argument(
        "--journal",
        type=Path,
        metavar="JSONL",
        help="append each finished simulation here, and skip those already in it: a stopped run "
        "continues where it stopped (the same code only; the results do not change)",
    )
    parser.set_defaults(func=run)


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


def render(path: Path) -> int:
    report = json.loads(path.read_text())
    outcomes = outcomes_of(report)
    conditions = list(dict.fromkeys(o.job.condition for o in outcomes))
    policies = list(dict.fromkeys(v["policy"]["name"] for v in report["verdicts"]))
    ev = evaluate(outcomes, conditions, policies)
    ev = Evaluation(ev.verdicts, ev.frontiers, ev.baselines, len(outcomes), report["wall_s"])
    path.with_suffix(".md").write_text(markdown(ev, report["command"]))
    path.write_text(to_json(ev, outcomes, report["command"]))
    plot(ev, path.with_suffix(".png"))
    print(markdown(ev, report["command"]))
    return 0


def run(args: argparse.Namespace) -> int:
    from wok_sim.policies import load_registry

    if args.render:
        return render(args.render)
    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    registry = load_registry()
    asked = [n.strip() for n in args.policy.split(",") if n.strip()]
    if not asked:
        raise ValueError("--policy needs at least one name")
    policies = [n for n in asked if n in registry]
    for name in asked:
        if name not in registry:
            print(f"wok evaluate: policy {name!r} is not registered: skipped", file=sys.stderr)
    if not policies:
        raise ValueError(f"no registered policy in {args.policy!r} (known: {', '.join(registry)})")
    traces = {t.strip() for t in args.trace.split(",") if t.strip()}
    unknown = traces - set(TRACES)
    if unknown or not traces:
        raise ValueError(f"unknown trace {', '.join(sorted(unknown))} (known: {', '.join(TRACES)})")
    slos = {s.strip() for s in args.slo.split(",") if s.strip()}
    if not slos or slos - set(SLO_SETS):
        raise ValueError(f"--slo takes {', '.join(SLO_SETS)}, got {args.slo!r}")
    conditions = [c for c in matrix(quick=args.quick) if c.trace in traces and c.slo in slos]
    started = time.perf_counter()
    journal = Journal(args.journal)
    first = run_all(
        first_jobs(conditions, policies), workers=args.jobs, desc="first seed", journal=journal
    )
    second = run_all(
        second_jobs(first, policies), workers=args.jobs, desc="other seeds", journal=journal
    )
    outcomes = first + second
    ev = evaluate(outcomes, conditions, policies)
    ev = Evaluation(
        ev.verdicts, ev.frontiers, ev.baselines, len(outcomes), time.perf_counter() - started
    )
    command = (
        "wok evaluate " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["evaluate"]
        else "wok evaluate"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    whole = (traces, slos) == (set(TRACES) - set(ON_REQUEST), set(SLO_SETS))
    parts = [] if whole else [*sorted(traces), *sorted(slos)]
    name = "-".join(["evaluation", *(["quick"] if args.quick else []), *parts])
    (args.out / f"{name}.md").write_text(markdown(ev, command))
    (args.out / f"{name}.json").write_text(to_json(ev, outcomes, command))
    plot(ev, args.out / f"{name}.png")
    print(markdown(ev, command))
    for suffix in ("md", "json", "png"):
        print(f"wrote {args.out / f'{name}.{suffix}'}", file=sys.stderr)
    return 0
