"""The static frontier's search by bisection on the pod count: on every monotone attainment
curve it ends with exactly the pod counts a linear sweep would keep, in fewer simulations."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from wok_sim.fleet_search import PLATEAU, FleetSearch

LOW, HIGH = 0.90, 0.999


def run(search: FleetSearch, attainment: Callable[[int], float]) -> int:
    """The search to its end; the simulations it asked for."""
    runs = 0
    while probes := search.next_probes():
        for n in probes:
            assert n not in search.seen and 1 <= n <= search.max_replicas
            search.add(n, attainment(n))
            runs += 1
        assert runs <= 2 * search.max_replicas, "the search does not end"
    return runs


def linear_span(curve: list[float]) -> range:
    """What a sweep over every N keeps: the last N under LOW (or 1) to the first at HIGH, or
    within PLATEAU of the largest fleet where none reaches it."""
    top = HIGH if curve[-1] >= HIGH else curve[-1] - PLATEAU
    first = max((n for n, a in enumerate(curve, 1) if a < LOW), default=1)
    last = next(n for n, a in enumerate(curve, 1) if a >= top)
    return range(min(first, last), max(first, last) + 1)  # a plateau under LOW: both ends


def monotone_curve(rng: random.Random, size: int) -> list[float]:
    values = [0.2, 0.6, 0.85, 0.9, 0.93, 0.97, 0.99, 0.995, 0.999, 1.0]
    return sorted(rng.choice(values) for _ in range(size))


def test_on_every_monotone_curve_it_keeps_the_linear_sweep_s_pod_counts() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        curve = monotone_curve(rng, rng.randint(1, 32))
        search = FleetSearch(len(curve), rng.randint(0, len(curve) + 3), LOW, HIGH)
        run(search, lambda n, c=curve: c[n - 1])
        assert search.span() == linear_span(curve), curve
        assert set(search.span()) <= set(search.seen)


def test_a_good_guess_costs_a_few_simulations_beyond_the_span() -> None:
    # 32 pods allowed; the frontier moves between 5 and 8 pods, and the guess is 6.
    curve = [0.3, 0.5, 0.7, 0.85, 0.89, 0.95, 0.99, 0.9995] + [1.0] * 24
    search = FleetSearch(32, 6, LOW, HIGH)
    runs = run(search, lambda n: curve[n - 1])
    assert search.span() == range(5, 9)
    assert runs <= len(search.span()) + 2  # a linear sweep runs all 32


def test_where_no_fleet_reaches_high_it_stops_where_more_pods_buy_nothing() -> None:
    curve = [0.4, 0.8, 0.92, 0.97, 0.98, 0.9876 - PLATEAU, 0.9875] + [0.9876] * 25
    search = FleetSearch(32, 2, LOW, HIGH)
    runs = run(search, lambda n: curve[n - 1])
    assert search.span() == range(2, 7)  # 6 pods are within PLATEAU of 32 pods' 0.9876
    assert runs < 16


def test_a_curve_that_dips_still_ends_and_runs_its_whole_span() -> None:
    rng = random.Random(3)
    for _ in range(500):
        curve = [rng.random() for _ in range(rng.randint(1, 20))]
        search = FleetSearch(len(curve), rng.randint(1, len(curve)), LOW, HIGH)
        run(search, lambda n, c=curve: c[n - 1])
        assert set(search.span()) <= set(search.seen)


@pytest.mark.parametrize(("low", "high"), [(0.9, 0.8), (-0.1, 0.5), (0.5, 1.1)])
def test_bad_thresholds_are_refused(low: float, high: float) -> None:
    with pytest.raises(ValueError, match="bad fleet search"):
        FleetSearch(8, 2, low, high)
