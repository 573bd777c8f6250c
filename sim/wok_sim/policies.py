"""The registry of autoscaling policies that `wok simulate --policy` can run, by name.

Each entry makes the variants to simulate on the same arrivals (one for a law that moves its own
batch; one per fixed batch size B for a baseline swept over B) and picks the one to report: by
default the best in hindsight (highest attainment of all SLOs, then fewest GPU-hours). Entries
are added where the policy lives (`wok_policy`, `baselines`); this module only holds the table,
so the simulator never needs to know them.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from wok_contracts.profile import StepProfile
from wok_contracts.traces import TraceRequest
from wok_sim.policy import Policy

SWEEP_BATCHES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class PolicyContext:
    """What a factory may use to build its policies (the same for every policy of a run)."""

    profile: StepProfile
    slo_ttft_s: float
    slo_tpot_s: float
    slo_e2e_s: float | None  # None: no end-to-end SLO
    max_replicas: int
    batch_mem: int  # the most sequences of the trace's mean length the KV pool holds
    cold_start_s: float
    requests: tuple[TraceRequest, ...]  # the arrivals (a static fleet may size itself on them)
    start_replicas: int = 1  # every autoscaler's fleet at t = 0 (the planner's, for minute one)

    def sweep_batches(self) -> list[int]:
        """The fixed batch sizes a baseline is swept over: B ≤ B_mem (at least the smallest)."""
        return [b for b in SWEEP_BATCHES if b <= self.batch_mem] or [SWEEP_BATCHES[0]]


class Scored(Protocol):
    """What `pick` sees of a finished variant (a `report.PolicyResult`)."""

    slo_attainment: float
    gpu_hours: float


def best_in_hindsight(results: Sequence[Scored]) -> int:
    """The variant with the highest attainment of all SLOs, then the fewest GPU-hours."""
    return min(
        range(len(results)), key=lambda i: (-results[i].slo_attainment, results[i].gpu_hours)
    )


@dataclass(frozen=True)
class PolicyEntry:
    variants: Callable[[PolicyContext], list[Policy]]
    pick: Callable[[Sequence[Scored]], int] = best_in_hindsight
    in_all: bool = True  # run by `--policy all`


REGISTRY: dict[str, PolicyEntry] = {}
POLICY_MODULES = (
    "wok_sim.wok_policy",
    "wok_sim.baselines",
    "wok_sim.budget_policy",
    "wok_sim.aibrix_policy",
    "wok_sim.dynamo_policy",
    "wok_sim.wva_policy",
)


def register(name: str, entry: PolicyEntry) -> None:
    if name in REGISTRY:
        raise ValueError(f"policy {name!r} is registered twice")
    REGISTRY[name] = entry


def load_registry() -> dict[str, PolicyEntry]:
    """Every policy: importing the modules that define them registers them."""
    for module in POLICY_MODULES:
        if importlib.util.find_spec(module) is not None:  # baselines may not be written yet
            importlib.import_module(module)
    return REGISTRY


def resolve(names: str) -> list[str]:
    """`all` or a comma-separated list of registered names, in registry order for `all`."""
    registry = load_registry()
    if names == "all":
        return [name for name, entry in registry.items() if entry.in_all]
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in registry]
    if unknown or not chosen:
        raise ValueError(
            f"unknown policy {', '.join(unknown) or names!r} (known: {', '.join(registry)})"
        )
    return chosen
