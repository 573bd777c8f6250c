"""`wok evaluate`'s matrix: the conditions it runs (trace, rate scale, pod start, SLO set), the
seeds, the rivals, one simulation's job and outcome, and what a job simulates (its arrivals and
its `PolicyContext`, built once per draw in each worker process). Nothing here runs a job
(`evaluation_runner`) or judges one (`evaluation_analysis`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    from wok_contracts.slos import Slos
    from wok_operator.plan import batch_mem_of, warm_start
    from wok_sim.policies import PolicyContext

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


def variants_of(policy: str, condition: Condition, seed: int) -> list[tuple[str, int | None]]:
    """(name, fixed batch) of each variant of a registered policy, by index."""
    from wok_sim.policies import load_registry

    ctx = context(condition, seed, warm_start_fleet=False)
    return [(p.name, p.fixed_batch) for p in load_registry()[policy].variants(ctx)]
