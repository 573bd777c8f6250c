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

`SWEPT_BASELINES` is the one table of rivals: a policy registered with its sweep (its variants
its targets × B, each named with its target) joins every condition by adding its name there;
`--baselines` runs a subset.

`--trace PATH[@SCALE,…]` runs the same protocol on a trace file of your own (held out: the law
was never tuned on it): every scale given, a 90 s pod start (`--cold-start`), each SLO set.
The static fleets of a frontier are found by bisection on the pod count (`fleet_search`).
"""

from __future__ import annotations

import argparse
import itertools
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

from wok_sim.fleet_search import PLATEAU, FleetSearch

TRACES_DIR = Path(__file__).resolve().parents[2] / "bench" / "traces"
TRACES = {
    "code": str(TRACES_DIR / "azure_llm_2023_code.csv"),
    "conv": str(TRACES_DIR / "azure_llm_2023_conv.csv"),
    "mooncake": str(TRACES_DIR / "mooncake_conversation.jsonl"),
    "day": str(TRACES_DIR / "servegen_m_large.json"),  # its default day, drawn with each seed
    # The day's morning ramp, 08:00 to 13:00 (13 to 31 arrivals/s at ×1), cut from the day's draw.
    "morning": str(TRACES_DIR / "servegen_m_large.json") + "#8h-13h",
}
#: Run only when named (`--trace day`): a day is 24 times an hour-long trace's simulations.
ON_REQUEST = ("day", "morning")
#: The rate scales of the multi-hour traces: their own rate, and three times it (overlay).
LONG_SCALES = (1.0, 3.0)
#: A trace reference's window: `REF#START-END` (`wok_contracts.traces.parse_window`).
WINDOW = "#"
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
    def trace_name(self) -> str:
        """A built-in trace's name, or a trace file's name without its folder."""
        return self.trace if self.trace in TRACES else Path(self.trace).name

    @property
    def label(self) -> str:
        return f"{self.trace_name} ×{self.scale:g}, {self.cold_start_s:g} s start, {self.slo} SLOs"

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
        weight = {"mooncake": 0.2, "day": 24.0, "morning": 5.0}.get(self.condition.trace, 1.0)
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
    both SLO sets, and the multi-hour ones (the day, its morning) at ×1 and ×3. `quick`: the
    Mooncake excerpt only, two conditions."""
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
    for trace in ("conv", "mooncake"):
        conditions += [Condition(trace, 1.0, 90.0, slo) for slo in SLO_SETS]
    for trace in ON_REQUEST:
        conditions += [Condition(trace, s, 90.0, slo) for s in LONG_SCALES for slo in SLO_SETS]
    return conditions


def pick(
    conditions: Iterable[Condition],
    traces: Iterable[str],
    slos: Iterable[str],
    *,
    scales: Iterable[float] = (),
    starts: Iterable[float] = (),
) -> list[Condition]:
    """The conditions on these traces under these SLO sets, at these rate scales and pod starts
    (none given: every one)."""
    traces, slos, scales, starts = set(traces), set(slos), set(scales), set(starts)
    return [
        c
        for c in conditions
        if c.trace in traces
        and c.slo in slos
        and (not scales or c.scale in scales)
        and (not starts or c.cold_start_s in starts)
    ]


# What one worker process keeps between jobs: arrivals and contexts are built once per draw.
_CACHE: dict[Any, Any] = {}


def split_window(ref: str) -> tuple[str, tuple[float, float] | None]:
    """A trace reference's file (or built-in load) and its window in seconds, if it names one."""
    from wok_contracts.traces import parse_window

    path, sep, window = ref.rpartition(WINDOW)
    return (path, parse_window(window)) if sep else (ref, None)


def _requests(trace: str, scale: float, seed: int) -> list[Any]:
    """A condition's arrivals: the trace drawn with `seed`, cut to its window (the window's
    clock starts at 0), then overlaid to `scale`."""
    from wok_contracts.traces import cut_window, load_trace, scale_rate

    key = ("requests", trace, scale, seed)
    if key not in _CACHE:
        ref, window = split_window(TRACES.get(trace, trace))
        requests = load_trace(ref, seed=seed)
        if window is not None:
            requests = cut_window(requests, *window)
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


def fleet_search(condition: Condition) -> FleetSearch:
    """The search for a frontier's fleets on the first seed (`fleet_search`), from the fleet the
    busiest minute needs at the planner's capacity at the largest B (the planner sizes for the
    minute's mean; the seconds-long spikes inside it need more, which the search finds)."""
    from wok_sim.baselines import sizing

    ctx = context(condition, SEEDS[0], warm_start_fleet=False)
    fleet = sizing(ctx)
    guess = math.ceil(fleet.peak_rate / fleet.capacity[ctx.sweep_batches()[-1]])
    return FleetSearch(ctx.max_replicas, guess, FULL_SWEEP_BELOW, SATURATED)


def variants_of(policy: str, condition: Condition, seed: int) -> list[tuple[str, int | None]]:
    """(name, fixed batch) of each variant of a registered policy, by index."""
    from wok_sim.policies import load_registry

    ctx = context(condition, seed, warm_start_fleet=False)
    return [(p.name, p.fixed_batch) for p in load_registry()[policy].variants(ctx)]


def first_jobs(
    conditions: Sequence[Condition],
    policies: Sequence[str],
    baselines: Sequence[str] = tuple(SWEPT_BASELINES),
) -> list[Job]:
    """Every policy on every condition and seed; on the first seed only, every variant of the
    swept baselines (target × B) on every condition (they depend on the pod start). The static
    fleets are searched apart (`search_frontiers`)."""
    first = SEEDS[0]
    jobs = [Job(c, seed, p, 0) for c in conditions for seed in SEEDS for p in policies]
    for condition in conditions:
        for baseline in baselines:
            count = len(variants_of(baseline, condition, first))
            jobs += [Job(condition, first, baseline, i) for i in range(count)]
    return jobs


def search_frontiers(
    conditions: Sequence[Condition], *, workers: int, journal: Journal | None = None
) -> list[Outcome]:
    """The static fleets of each frontier on the first seed, every N probed at every B the
    baselines are swept over (the frontier's attainment at N is its best B's). They do not
    depend on the pod start: one frontier per trace, scale and SLO set. The searches run in
    rounds: each simulates the next pod counts of every search still open, in one pool."""
    frontiers = {c.frontier_key: c for c in reversed(conditions)}  # the first condition of each
    searches = {c: fleet_search(c) for c in frontiers.values()}
    outcomes: list[Outcome] = []
    for round_ in itertools.count(1):
        jobs = [
            Job(condition, SEEDS[0], STATIC, n * 1000 + b)
            for condition, search in searches.items()
            for n in search.next_probes()
            for b in context(condition, SEEDS[0], warm_start_fleet=False).sweep_batches()
        ]
        if not jobs:
            return outcomes
        found = run_all(
            jobs, workers=workers, desc=f"static fleets, round {round_}", journal=journal
        )
        best: dict[tuple[Condition, int], float] = defaultdict(float)
        for o in found:
            key = (o.job.condition, o.job.variant // 1000)
            best[key] = max(best[key], o.attainment)
        for (condition, replicas), attainment in best.items():
            searches[condition].add(replicas, attainment)
        outcomes += found
    raise AssertionError("unreachable")


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
    the first seed, from the last N below `FULL_SWEEP_BELOW` to the first at `SATURATED` (or,
    where none reaches it, within `PLATEAU` of the best: the span `fleet_search` ran); each
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
        best = max(o.attainment for o in fleets)
        top = SATURATED if best >= SATURATED else best - PLATEAU
        high = next((i for i, o in enumerate(fleets) if o.attainment >= top), len(fleets))
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
    same code: the journal does not know which law or simulator wrote it. A run killed while
    writing leaves its last line cut short: that line is dropped (its simulation runs again),
    and the file is cut back to the lines it keeps, so the next ones start on a line of their
    own."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done: dict[Job, Outcome] = {}
        if path is None or not path.exists():
            return
        text = path.read_text()
        whole = text[: text.rfind("\n") + 1]  # a last line without its newline was cut short
        for number, line in enumerate(whole.splitlines(), start=1):
            if line.strip():
                try:
                    o = _outcome_of(json.loads(line))
                except (json.JSONDecodeError, KeyError, TypeError) as error:
                    raise ValueError(f"{path}:{number} is not a journal line: {error}") from None
                self.done[o.job] = o
        if whole != text:
            path.write_text(whole)

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
    if outcomes:
        desc = f"{desc} ({len(outcomes)} from the journal)"
    progress = tqdm(total=len(ordered), desc=desc, unit="sim", file=sys.stderr)

    def finished(outcome: Outcome) -> None:
        journal.add(outcome)
        outcomes.append(outcome)
        # A day's simulation takes minutes: say which finished, and how long it took.
        condition = outcome.job.condition
        progress.set_postfix_str(
            f"{condition.trace_name} ×{condition.scale:g} seed {outcome.job.seed} "
            f"{outcome.name}: {outcome.wall_s:.0f} s",
            refresh=False,
        )
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


def register(commands: Any) -> None:
    from wok_sim.held_out import HELD_OUT_START_S, TRACE_FORMATS

    parser = commands.add_parser(
        "evaluate",
        help="every policy over a matrix of traces, rate scales, pod starts, SLOs and seeds, "
        "against the static frontier and swept HPA / KEDA baselines (fleet simulator)",
    )
    parser.add_argument(
        "--policy",
        "--policies",
        default=",".join(MAIN_POLICIES),
        help="NAME[,NAME…] (default: wok and its batch ablations; names not registered are "
        "skipped with a note)",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(SWEPT_BASELINES),
        help="the swept rivals run on every condition: NAME[,NAME…] or none (default: all, "
        f"{', '.join(SWEPT_BASELINES)})",
    )
    parser.add_argument("--quick", action="store_true", help="a two-condition matrix (minutes)")
    parser.add_argument(
        "--slo", default=",".join(SLO_SETS), help="the conditions of these SLO sets only"
    )
    default_traces = ",".join(t for t in TRACES if t not in ON_REQUEST)
    parser.add_argument(
        "--trace",
        action="append",
        metavar="NAMES | PATH[@SCALE,…]",
        help=f"repeatable. NAME[,NAME…]: the matrix's conditions on these built-in traces only "
        f"(default: {default_traces}; also {', '.join(ON_REQUEST)}: the ServeGen day and its "
        "08:00-13:00 morning ramp, each at x1 and x3). PATH: a "
        "trace file of your own, held out ("
        + ", ".join(f"{suffix}: {kind}" for suffix, kind in TRACE_FORMATS.items())
        + "), at each rate SCALE (overlay; default 1), under each --slo set, with the "
        "matrix's scoring",
    )
    parser.add_argument(
        "--scale",
        metavar="X[,X…]",
        help="the matrix's conditions at these rate scales only (default: all of them)",
    )
    parser.add_argument(
        "--starts",
        metavar="S[,S…]",
        help="the matrix's conditions at these pod starts only (default: all of them)",
    )
    parser.add_argument(
        "--window",
        metavar="START-END",
        help="cut each trace file to this window (seconds, or 8h-13h; its clock starts at 0 "
        "there) before scaling it: a morning's ramp out of a day",
    )
    parser.add_argument(
        "--cold-start",
        type=float,
        default=HELD_OUT_START_S,
        metavar="S",
        help="the pod start of a trace file's conditions",
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


def report_name(
    *,
    quick: bool,
    traces: Iterable[str],
    files: Sequence[str],
    slos: Iterable[str],
    scales: Sequence[float] = (),
    starts: Sequence[float] = (),
) -> str:
    """The report's file name (no suffix): `evaluation` for the whole default matrix, else what
    the run kept (traces, trace files, rate scales, pod starts, SLO sets), so that a part never
    overwrites the whole."""
    picked = [f"x{s:g}" for s in scales] + [f"{s:g}s" for s in starts]
    traces, slos = set(traces), set(slos)
    default = {t for t in TRACES if t not in ON_REQUEST}
    whole = not files and not picked and (traces, slos) == (default, set(SLO_SETS))
    stems = [Path(split_window(path)[0]).stem for path in files]
    parts = [] if whole else [*sorted(traces), *stems, *picked, *sorted(slos)]
    return "-".join(["evaluation", *(["quick"] if quick else []), *parts])


def render(path: Path) -> int:
    from wok_sim.evaluation_report import markdown, outcomes_of, plot, to_json

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
    from wok_contracts.traces import parse_window
    from wok_sim.evaluation_report import markdown, plot, to_json
    from wok_sim.held_out import check_held_out, held_out, parse_scales, parse_traces
    from wok_sim.policies import load_registry

    if args.render:
        return render(args.render)
    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    if not (math.isfinite(args.cold_start) and args.cold_start >= 0):
        raise ValueError(f"--cold-start must be >= 0 s, got {args.cold_start}")
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
    baselines = [] if args.baselines == "none" else [b.strip() for b in args.baselines.split(",")]
    unknown = [b for b in baselines if b not in SWEPT_BASELINES or b not in registry]
    if unknown:
        raise ValueError(
            f"unknown baseline {', '.join(unknown)} (known: {', '.join(SWEPT_BASELINES)}, none)"
        )
    default_traces = [t for t in TRACES if t not in ON_REQUEST]
    names, files = parse_traces(args.trace or [",".join(default_traces)])
    traces = set(names)
    slos = {s.strip() for s in args.slo.split(",") if s.strip()}
    if not slos or slos - set(SLO_SETS):
        raise ValueError(f"--slo takes {', '.join(SLO_SETS)}, got {args.slo!r}")
    scales = parse_scales(args.scale, "--scale") if args.scale else ()
    starts = parse_scales(args.starts, "--starts") if args.starts else ()
    conditions = pick(matrix(quick=args.quick), traces, slos, scales=scales, starts=starts)
    if args.window:
        parse_window(args.window)  # a bad window is one clear line before anything runs
        if not files:
            raise ValueError("--window cuts trace files: name one with --trace PATH")
        files = [(f"{path}{WINDOW}{args.window}", factors) for path, factors in files]
    held = held_out(files, slos, args.cold_start)
    check_held_out(held)
    conditions += held
    started = time.perf_counter()
    journal = Journal(args.journal)
    first = run_all(
        first_jobs(conditions, policies, baselines),
        workers=args.jobs,
        desc="first seed",
        journal=journal,
    )
    first += search_frontiers(conditions, workers=args.jobs, journal=journal)
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
    name = report_name(
        quick=args.quick,
        traces=traces,
        files=[path for path, _ in files],
        slos=slos,
        scales=scales,
        starts=starts,
    )
    (args.out / f"{name}.md").write_text(markdown(ev, command))
    (args.out / f"{name}.json").write_text(to_json(ev, outcomes, command))
    plot(ev, args.out / f"{name}.png")
    print(markdown(ev, command))
    for suffix in ("md", "json", "png"):
        print(f"wrote {args.out / f'{name}.{suffix}'}", file=sys.stderr)
    return 0
