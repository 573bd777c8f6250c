"""The static frontier's fleet sizes, found by bisection on the pod count.

For a fixed batch B, a static fleet's attainment does not fall as pods are added: every pod sees
a thinner share of the same arrivals (random routing splits them; a pod's queue and its steps
only shrink with its load), so attainment is monotone in N up to the simulator's seeded draws;
so is the frontier's (each N at its best B: the largest of monotone functions). A frontier
needs only the pod counts where it moves: from the largest N still under `low` (a smaller fleet
serves too little to be bought) to the smallest N at `high` (every larger fleet only costs
more), or, where even the largest fleet does not reach `high`, to the smallest within `PLATEAU`
of it. Both ends are found by bisection, the counts between them are all run (the frontier is
linear between adjacent N), and nothing else is: a few probes each side instead of one
simulation per N.

Pure: `FleetSearch` only says which N to simulate next from the attainments it was given, so
the caller runs the probes of every search at once, in rounds, in its process pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Within this of the largest fleet's attainment, more pods buy nothing worth a simulation: the
# routing draw alone moves a fleet's attainment by as much (the Mooncake excerpt at tight SLOs
# wanders between 99.2 and 99.9 % from 13 pods to 28).
PLATEAU = 0.005


@dataclass
class FleetSearch:
    """The pod counts one frontier needs (of one B, or of each N at its best B), in
    [1, `max_replicas`], from a first guess."""

    max_replicas: int
    guess: int  # where the search starts (the planner's fleet for the busiest minute)
    low: float  # the frontier starts at the largest N below this attainment
    high: float  # and ends at the smallest N at or above this one
    plateau: float = PLATEAU  # 0: where none reaches `high`, the smallest N at the largest's
    seen: dict[int, float] = field(default_factory=dict)  # N -> attainment

    def __post_init__(self) -> None:
        if self.max_replicas < 1 or not 0.0 <= self.low <= self.high <= 1.0 or self.plateau < 0:
            raise ValueError(f"bad fleet search {self}")
        self.guess = min(self.max_replicas, max(1, self.guess))

    def add(self, replicas: int, attainment: float) -> None:
        self.seen[replicas] = attainment

    def _bracket(self, threshold: float) -> tuple[int, int]:
        """The largest N seen under `threshold` (0: none) and the smallest at it or above
        (`max_replicas` + 1: none)."""
        under = [n for n, a in self.seen.items() if a < threshold]
        over = [n for n, a in self.seen.items() if a >= threshold]
        return max(under, default=0), min(over, default=self.max_replicas + 1)

    def _top(self) -> float:
        """`high`, or just under the largest fleet's attainment where that does not reach it."""
        largest = self.seen.get(self.max_replicas)
        if largest is not None and largest < self.high:
            return max(0.0, largest - self.plateau)
        return self.high

    def _probe(self, threshold: float) -> int | None:
        """The next N that narrows `threshold`'s bracket to adjacent counts, or None. Without a
        bound on one side it gallops from the other (doubling the step), so that a good guess
        costs a few simulations near it, not one at the far end of [1, max]."""
        below, above = self._bracket(threshold)
        if above - below <= 1:
            return None
        if below == 0:  # every count seen is at the threshold: walk down
            over = sorted(n for n, a in self.seen.items() if a >= threshold)
            step = 1 if len(over) < 2 else 2 * (over[1] - over[0])
            return max(1, above - step)
        if above > self.max_replicas:  # every count seen is under it: walk up
            under = sorted(n for n, a in self.seen.items() if a < threshold)
            step = 1 if len(under) < 2 else 2 * (under[-1] - under[-2])
            return min(self.max_replicas, below + step)
        return (below + above) // 2

    def next_probes(self) -> list[int]:
        """The pod counts to simulate next (all at once); empty when the search is done."""
        if not self.seen:
            return [self.guess]
        for threshold in (self._top(), self.low):
            probe = self._probe(threshold)
            if probe is not None:
                return [probe]
        return [n for n in self.span() if n not in self.seen]

    def span(self) -> range:
        """The frontier's pod counts: from the largest N under `low` (or 1) to the smallest at
        `high` (or at the plateau under it)."""
        first = max(1, self._bracket(self.low)[0])
        last = min(self.max_replicas, self._bracket(self._top())[1])
        # Attainments that fall as N grows (a routing draw) may cross the brackets: keep both.
        return range(min(first, last), max(first, last) + 1)

    @property
    def done(self) -> bool:
        return bool(self.seen) and not self.next_probes()
