"""What an autoscaling policy sees and does in the fleet simulator.

Every policy (wok's law, the plain sign-step, HPA, KEDA, static fleets) is driven the same way:
every `interval_s` the simulator hands it a `FleetView` built from the emulated Prometheus (so it
sees what the real one would: scraped gauges, `rate()` windows, `histogram_quantile` over the
runtime's buckets) and applies the `Action` it returns: the batch cap (and the step token budget,
when the policy sets one) is pushed to every pod at once (the runtime's admin API), the replica
count goes to the Deployment (new pods start after the cold start; removed pods drain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from wok_contracts.signals import PodView, ServiceSignals


@dataclass(frozen=True)
class PodSample:
    """One pod at a tick, with its last scraped gauges (None: never scraped, or scrape failed)."""

    pod: PodView
    waiting: float | None
    running: float | None
    kv_usage: float | None


@dataclass(frozen=True)
class FleetView:
    now: float
    replicas: int  # the Deployment's spec.replicas (what the last action asked for)
    batch: int  # the batch cap the pods run with
    pods: tuple[PodSample, ...]  # every pod of the Deployment, starting ones included
    signals: ServiceSignals  # the operator's signals, as its PromQL round would return them

    @property
    def pod_views(self) -> list[PodView]:
        return [sample.pod for sample in self.pods]


@dataclass(frozen=True)
class Action:
    batch: int
    replicas: int
    reason: str = ""
    # The step token budget pushed to every pod (the admin API's max_num_batched_tokens);
    # None leaves it where it is (the profile's, unless a policy moved it).
    token_budget: int | None = None


class Policy(Protocol):
    name: str
    interval_s: float
    fixed_batch: int | None  # the batch a fixed-batch baseline runs with; None when it moves

    def start(self) -> Action:
        """The batch and replica count at t = 0."""
        ...

    def decide(self, view: FleetView) -> Action: ...
