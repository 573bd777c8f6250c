"""A fleet that follows a schedule written in advance: N pods at batch B from each step's start.

It is what an operator with a calendar runs (a CronJob that scales the Deployment on the hour),
and, with the schedule chosen in hindsight (`wok_sim.hourly_fleet`), the reference a law is
judged against over a day. The simulator applies each step as it applies any policy's action:
pods added pay the pod start (pending, billed from their creation), pods removed drain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wok_sim.policy import Action, FleetView


@dataclass(frozen=True)
class Step:
    start_s: float  # from here until the next step's start
    replicas: int
    batch: int


class ScheduledPolicy:
    """Asks for each step's fleet from its start on. A step must start on a control tick (a
    multiple of `interval_s`), so that it is applied at its start, not up to a tick later."""

    interval_s = 60.0

    def __init__(self, name: str, steps: Sequence[Step]) -> None:
        starts = [s.start_s for s in steps]
        if not steps or starts[0] != 0.0 or starts != sorted(set(starts)):
            raise ValueError(f"a schedule starts at 0 s, its steps in order: {starts}")
        if any(s.start_s % self.interval_s for s in steps):
            raise ValueError(f"every step starts on a {self.interval_s:g} s tick: {starts}")
        if any(s.replicas < 0 or s.batch < 1 for s in steps):
            raise ValueError(f"a step needs replicas >= 0 and batch >= 1: {list(steps)}")
        self.name = name
        self.steps = tuple(steps)
        batches = {s.batch for s in steps}
        self.fixed_batch: int | None = batches.pop() if len(batches) == 1 else None

    def _action(self, step: Step) -> Action:
        return Action(
            batch=step.batch,
            replicas=step.replicas,
            reason=f"schedule: {step.replicas} replicas at B{step.batch} from {step.start_s:g} s",
        )

    def start(self) -> Action:
        return self._action(self.steps[0])

    def decide(self, view: FleetView) -> Action:
        return self._action(next(s for s in reversed(self.steps) if s.start_s <= view.now))
