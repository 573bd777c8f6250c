"""`wok evaluate`'s runs: the jobs of each round (the first seed, the static fleets' searches,
the other seeds where they can change a verdict), what one job simulates (`job_setup`, also the
day's benchmark's), and the pool that runs them.
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wok_sim.evaluation_journal import Journal
from wok_sim.evaluation_matrix import (
    FULL_SWEEP_BELOW,
    RIVAL_MARGIN,
    SATURATED,
    SEEDS,
    STATIC,
    SWEPT_BASELINES,
    WARM_UP_S,
    Condition,
    Job,
    Outcome,
    context,
    variants_of,
)
from wok_sim.fleet_search import PLATEAU, FleetSearch

if TYPE_CHECKING:
    from wok_sim.fleet import FleetConfig
    from wok_sim.policies import PolicyContext
    from wok_sim.policy import Policy


def fleet_search(condition: Condition) -> FleetSearch:
    """The search for a frontier's fleets on the first seed (`fleet_search`), from the fleet the
    busiest minute needs at the planner's capacity at the largest B (the planner sizes for the
    minute's mean; the seconds-long spikes inside it need more, which the search finds)."""
    from wok_sim.baselines import sizing

    ctx = context(condition, SEEDS[0], warm_start_fleet=False)
    fleet = sizing(ctx)
    guess = math.ceil(fleet.peak_rate / fleet.capacity[ctx.sweep_batches()[-1]])
    return FleetSearch(ctx.max_replicas, guess, FULL_SWEEP_BELOW, SATURATED)


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


@dataclass(frozen=True)
class JobSetup:
    """What one job simulates: its context (the requests, the SLOs), the policy variant and the
    fleet, scored from `WARM_UP_S`."""

    context: PolicyContext
    policy: Policy
    config: FleetConfig


def job_setup(job: Job) -> JobSetup:
    """The job's policy (a static fleet of its replicas at its B, or the registered policy's
    variant) and fleet, on its condition's context: the autoscalers from the planner's warm
    start, the static fleets at full size."""
    from wok_sim.baselines import StaticPolicy
    from wok_sim.fleet import FleetConfig
    from wok_sim.policies import load_registry

    ctx = context(job.condition, job.seed, warm_start_fleet=job.policy != STATIC)
    policy: Policy
    if job.policy == STATIC:
        replicas, batch = divmod(job.variant, 1000)
        policy = StaticPolicy(f"static-{replicas}", batch=batch, replicas=replicas)
    else:
        policy = load_registry()[job.policy].variants(ctx)[job.variant]
    config = FleetConfig(
        profile=ctx.profile,
        cold_start_s=job.condition.cold_start_s,
        seed=job.seed,
        score_from_s=WARM_UP_S,
    )
    return JobSetup(ctx, policy, config)


def run_job(job: Job) -> Outcome:
    from wok_contracts.slos import Slos
    from wok_sim.fleet import simulate_fleet
    from wok_sim.report import summarize

    setup = job_setup(job)
    ctx, policy = setup.context, setup.policy
    run = simulate_fleet(list(ctx.requests), policy, setup.config)
    result = summarize(policy.name, run, Slos(ctx.slo_ttft_s, ctx.slo_tpot_s))
    return Outcome(
        job=job,
        name=policy.name,
        batch=policy.fixed_batch,
        attainment=result.slo_attainment,
        gpu_hours=result.gpu_hours,
        wall_s=result.wall_seconds,
    )


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


def run_matrix(
    conditions: Sequence[Condition],
    policies: Sequence[str],
    baselines: Sequence[str],
    *,
    workers: int,
    journal: Journal,
) -> list[Outcome]:
    """Every simulation the verdicts need: the first seed (`first_jobs`), the frontiers' static
    fleets (`search_frontiers`), then the other seeds where they can change a verdict
    (`second_jobs`)."""
    first = run_all(
        first_jobs(conditions, policies, baselines),
        workers=workers,
        desc="first seed",
        journal=journal,
    )
    first += search_frontiers(conditions, workers=workers, journal=journal)
    second = run_all(
        second_jobs(first, policies), workers=workers, desc="other seeds", journal=journal
    )
    return first + second
