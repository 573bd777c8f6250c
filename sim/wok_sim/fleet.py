"""The fleet: a Deployment of simulated runtime pods behind a Service, driven by one policy.

What it models, and why each matters to an autoscaler:
- The replica count is the Deployment's: a new pod is pending for the cold start (image pull,
  weights; GPU time is billed from creation), then ready. A removed pod leaves the load balancer at
  once (pending pods go first, then the least loaded ready one, as a ReplicaSet prefers) and drains
  its running and queued work for `drain_s`; what is left then is dropped (a miss).
- Routing: `least-loaded` (an ideal gateway: fewest running + waiting among ready pods) or
  `random` (kube-proxy: uniform per connection, seeded). With no ready pod a request is refused
  (503, a miss).
- Every `policy.interval_s` the policy sees a `FleetView` built from the emulated Prometheus (its
  pods' last scraped gauges, the operator's ServiceSignals over the SLO window) and its Action is
  applied: the batch cap (and the step token budget, when it sets one) at once on every pod, the
  replica count through the Deployment.
A timeline of every tick is kept for the plots. Pods present at t = 0 start ready (the service
was running before the trace began).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from dataclasses import dataclass, field
from typing import Literal

from wok_contracts.profile import StepProfile
from wok_contracts.signals import PodView
from wok_contracts.traces import TraceRequest, clip_to_model
from wok_sim.policy import Action, FleetView, PodSample, Policy
from wok_sim.prometheus import EmulatedPrometheus
from wok_sim.replica import (
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_QUEUE_TIMEOUT_S,
    Mode,
    RequestRecord,
    SimReplica,
)
from wok_sim.vllm_pod import VllmReplica

Routing = Literal["random", "least-loaded"]
TAIL_S = 600.0  # after the last arrival, how long work may still finish before it is dropped
DEFAULT_SLO_WINDOW_S = 60  # spec.slo.windowSeconds
DEFAULT_BUDGET_WINDOW_S = 3600  # spec.slo.budgetWindowSeconds


@dataclass(frozen=True)
class FleetConfig:
    profile: StepProfile
    cold_start_s: float = 90.0
    drain_s: float = 30.0  # runtime.drainSeconds
    routing: Routing = "random"
    scrape_interval_s: float = 5.0
    scrape_failure_prob: float = 0.0
    slo_window_s: int = DEFAULT_SLO_WINDOW_S
    budget_window_s: int = DEFAULT_BUDGET_WINDOW_S
    seed: int = 0
    mode: Mode = "continuous"
    max_queue: int = DEFAULT_MAX_QUEUE
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    duration_s: float | None = None  # default: up to the last arrival
    fast: bool = True
    prefix_caching: bool = True  # from the trace's hash_ids (replica.py)
    # vLLM pods (vllm_pod.py): this fixed --max-num-seqs, vLLM's queue; None: wok runtime pods
    vllm_max_num_seqs: int | None = None
    # Scoring starts here: requests that arrived before and GPU time before are not counted, the
    # same for every policy (a warm-up that no static fleet pays and every autoscaler does).
    score_from_s: float = 0.0

    def __post_init__(self) -> None:
        if self.routing not in ("random", "least-loaded"):
            raise ValueError(f"--routing must be random or least-loaded, got {self.routing!r}")
        if self.cold_start_s < 0 or self.drain_s < 0:
            raise ValueError("--cold-start and the drain time must be >= 0")
        if self.scrape_interval_s <= 0:
            raise ValueError(f"--scrape-interval must be > 0, got {self.scrape_interval_s}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"--duration must be > 0, got {self.duration_s}")
        if self.score_from_s < 0:
            raise ValueError(f"the scored start must be >= 0 s, got {self.score_from_s}")
        if self.vllm_max_num_seqs is not None and self.vllm_max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be >= 1, got {self.vllm_max_num_seqs}")


@dataclass(frozen=True)
class Tick:
    """One control tick, for the plots: the load, the fleet, and what the policy saw."""

    time_s: float
    arrival_rate: float  # requests/s since the previous tick
    desired: int
    ready: int
    pending: int
    batch: int
    waiting: int  # requests queued over all pods (ground truth, not the scraped figure)
    p99_ttft_s: float | None
    p99_tpot_s: float | None
    p99_e2e_s: float | None
    reason: str


@dataclass(frozen=True)
class FleetRun:
    records: list[RequestRecord]  # one per request scored, in request order
    timeline: list[Tick]
    gpu_seconds: float  # pod-seconds from creation to exit, within the scored duration
    duration_s: float
    scale_events: int  # actions that changed the replica count
    flips: int  # changes of the replica count that reverse the previous change's direction
    max_waiting: int
    clipped_requests: int  # prompts or outputs cut to fit max_model_len
    wall_seconds: float
    steps: int  # engine steps simulated, all pods together
    jumps: int


@dataclass
class _Pod:
    pod_id: int
    replica: SimReplica
    created_s: float
    state: Literal["pending", "ready", "draining", "gone"]
    drain_deadline: float | None = None
    gone_s: float | None = None

    def view(self) -> PodView:
        return PodView(
            name=f"sim-{self.pod_id}",
            uid=str(self.pod_id),
            ip=None,
            ready=self.state == "ready",
            terminating=self.state == "draining",
        )


@dataclass
class _Fleet:
    """The Deployment and its pods (mutable while the run lasts)."""

    config: FleetConfig
    pods: list[_Pod] = field(default_factory=list)
    events: list[tuple[float, int, int]] = field(default_factory=list)  # (time, pod id, kind)
    batch: int = 1
    token_budget: int | None = None  # None: the profile's
    desired: int = 0

    READY, DRAIN_END = 0, 1

    def live(self) -> list[_Pod]:
        return [p for p in self.pods if p.state != "gone"]

    def ready(self) -> list[_Pod]:
        return [p for p in self.pods if p.state == "ready"]

    def serving(self) -> list[_Pod]:
        """Pods whose runtime process is up (scraped, stepping): ready or draining."""
        return [p for p in self.pods if p.state in ("ready", "draining")]

    def create(self, now: float, *, ready_now: bool) -> None:
        c = self.config
        pod_id = len(self.pods)
        replica = SimReplica(
            c.profile,
            pod=pod_id,
            batch_cap=self.batch,
            mode=c.mode,
            max_queue=c.max_queue,
            queue_timeout_s=c.queue_timeout_s,
            max_wait_ms=c.max_wait_ms,
            fast=c.fast,
            start_s=now,
            prefix_caching=c.prefix_caching,
            token_budget=self.token_budget,
        )
        if c.vllm_max_num_seqs is not None:
            replica = VllmReplica(
                c.profile,
                max_num_seqs=c.vllm_max_num_seqs,
                pod=pod_id,
                fast=c.fast,
                start_s=now,
                prefix_caching=c.prefix_caching,
            )
        self.pods.append(_Pod(pod_id, replica, now, "ready" if ready_now else "pending"))
        if not ready_now:
            heapq.heappush(self.events, (now + c.cold_start_s, pod_id, self.READY))

    def apply(self, action: Action, now: float) -> None:
        if action.batch != self.batch:
            self.batch = max(1, action.batch)
            for pod in self.live():
                pod.replica.set_batch_cap(self.batch)
        if action.token_budget is not None and action.token_budget != self.token_budget:
            self.token_budget = action.token_budget
            for pod in self.live():
                pod.replica.set_token_budget(action.token_budget)
        self.desired = max(0, action.replicas)
        current = [p for p in self.pods if p.state in ("pending", "ready")]
        for _ in range(self.desired - len(current)):
            self.create(now, ready_now=False)
        surplus = len(current) - self.desired
        if surplus <= 0:
            return
        for pod in sorted((p for p in current if p.state == "pending"), key=lambda p: -p.pod_id):
            if surplus == 0:
                return
            pod.state, pod.gone_s = "gone", now
            surplus -= 1
        ready = [p for p in current if p.state == "ready"]
        for pod in ready:
            pod.replica.advance_to(now)
        for pod in sorted(ready, key=lambda p: (p.replica.load, p.pod_id))[:surplus]:
            pod.state = "draining"
            pod.replica.drain()
            pod.drain_deadline = now + self.config.drain_s
            heapq.heappush(self.events, (pod.drain_deadline, pod.pod_id, self.DRAIN_END))

    def pod_event(self, now: float, pod_id: int, kind: int) -> None:
        pod = self.pods[pod_id]
        if kind == self.READY and pod.state == "pending":
            pod.state = "ready"
            pod.replica.clock = now
        elif kind == self.DRAIN_END and pod.state == "draining":
            pod.replica.advance_to(now)
            pod.replica.stop(now)
            pod.state, pod.gone_s = "gone", now

    def reap_drained(self) -> None:
        """A draining runtime exits as soon as its work is done."""
        for pod in self.pods:
            if pod.state == "draining" and not pod.replica.has_work():
                pod.state = "gone"
                pod.gone_s = min(pod.replica.clock, pod.drain_deadline or math.inf)

    def scrape(self, prom: EmulatedPrometheus, now: float) -> int:
        """Prometheus scrapes every serving pod, brought up to `now`; drained pods exit. Returns
        the requests waiting, all pods together."""
        serving = self.serving()
        for pod in serving:
            pod.replica.advance_to(now)
        prom.scrape(now, (p.replica for p in serving))
        waiting = sum(p.replica.num_waiting for p in serving)
        self.reap_drained()
        return waiting

    def stop(self, final: float) -> None:
        """The run is over: the serving pods finish what `final` allows, and every pod stops."""
        for pod in self.live():
            if pod.state in ("ready", "draining"):
                pod.replica.advance_to(final)
            pod.replica.stop(final)

    def gpu_seconds(self, scored_from: float, end: float) -> float:
        """Pod-seconds from creation to exit, within [scored_from, end]."""
        return sum(
            max(
                0.0,
                min(p.gone_s if p.gone_s is not None else end, end) - max(p.created_s, scored_from),
            )
            for p in self.pods
        )


def _requests_in_run(
    requests: list[TraceRequest], config: FleetConfig
) -> tuple[list[TraceRequest], int, float]:
    """The requests that arrive within the run (each cut to the model's length), how many were
    cut, and the run's end: its duration, else the last arrival."""
    requests, clipped = clip_to_model(requests, config.profile.max_model_len)
    end = (
        config.duration_s
        if config.duration_s is not None
        else (max((r.arrival_s for r in requests), default=0.0))
    )
    return [r for r in requests if r.arrival_s <= end], clipped, end


def _started_fleet(policy: Policy, config: FleetConfig) -> _Fleet:
    """The fleet the policy starts with, its pods ready at time 0."""
    fleet = _Fleet(config)
    first = policy.start()
    fleet.batch = max(1, first.batch)
    fleet.token_budget = first.token_budget
    fleet.desired = max(0, first.replicas)
    for _ in range(fleet.desired):
        fleet.create(0.0, ready_now=True)
    return fleet


def _control_tick(
    fleet: _Fleet, prom: EmulatedPrometheus, policy: Policy, now: float, arrival_rate: float
) -> tuple[Tick, int]:
    """The policy decides on what Prometheus shows and the fleet applies it. Returns the tick as
    the timeline records it and the replica count's change (+1, -1, or 0 for none)."""
    before = fleet.desired
    view = _view(fleet, prom, now)
    action = policy.decide(view)
    fleet.apply(action, now)
    change = 0 if fleet.desired == before else (1 if fleet.desired > before else -1)
    s = view.signals
    tick = Tick(
        time_s=now,
        arrival_rate=arrival_rate,
        desired=fleet.desired,
        ready=len(fleet.ready()),
        pending=sum(1 for p in fleet.pods if p.state == "pending"),
        batch=fleet.batch,
        waiting=sum(p.replica.num_waiting for p in fleet.serving()),
        p99_ttft_s=s.p99_ttft_seconds,
        p99_tpot_s=s.p99_tpot_seconds,
        p99_e2e_s=s.p99_seconds,
        reason=action.reason,
    )
    return tick, change


def simulate_fleet(requests: list[TraceRequest], policy: Policy, config: FleetConfig) -> FleetRun:
    """Runs `policy` over `requests` (sorted by arrival) and returns every request's outcome."""
    started = time.perf_counter()
    requests, clipped, end = _requests_in_run(requests, config)
    rng = random.Random(config.seed)
    prom = EmulatedPrometheus(
        windows=(config.slo_window_s,),
        budget_windows=(config.budget_window_s,),
        scrape_failure_prob=config.scrape_failure_prob,
        seed=config.seed + 1,
    )
    fleet = _started_fleet(policy, config)
    refused: list[RequestRecord] = []
    timeline: list[Tick] = []
    changes: list[int] = []  # +1 / -1 per change of the replica count
    max_waiting = 0
    next_scrape = config.scrape_interval_s
    next_tick = policy.interval_s
    last_tick, arrivals_since = 0.0, 0
    i, n = 0, len(requests)
    stop_at = end + TAIL_S
    while True:
        t_arrival = requests[i].arrival_s if i < n else math.inf
        t_event = fleet.events[0][0] if fleet.events else math.inf
        t = min(t_arrival, t_event, next_scrape, next_tick)
        if t > stop_at:
            break
        if t_event == t:
            _, pod_id, kind = heapq.heappop(fleet.events)
            fleet.pod_event(t, pod_id, kind)
        elif t_arrival == t:
            _route(fleet, i, requests[i], rng, refused)
            i += 1
            arrivals_since += 1
        elif next_scrape == t:
            max_waiting = max(max_waiting, fleet.scrape(prom, t))
            next_scrape += config.scrape_interval_s
            if i >= n and t > end and not any(p.replica.has_work() for p in fleet.live()):
                break
        else:
            rate = arrivals_since / max(t - last_tick, 1e-9)
            tick, change = _control_tick(fleet, prom, policy, t, rate)
            timeline.append(tick)
            if change:
                changes.append(change)
            last_tick, arrivals_since = t, 0
            next_tick += policy.interval_s
    fleet.stop(min(t, stop_at))
    scored = config.score_from_s
    records = refused + [r for p in fleet.pods for r in p.replica.records]
    return FleetRun(
        records=sorted((r for r in records if r.arrival_s >= scored), key=lambda r: r.request_id),
        timeline=timeline,
        gpu_seconds=fleet.gpu_seconds(scored, end),
        duration_s=end,
        scale_events=len(changes),
        flips=sum(1 for a, b in itertools.pairwise(changes) if a != b),
        max_waiting=max_waiting,
        clipped_requests=clipped,
        wall_seconds=time.perf_counter() - started,
        steps=sum(p.replica.steps for p in fleet.pods),
        jumps=sum(p.replica.num_jumps for p in fleet.pods),
    )


def _route(
    fleet: _Fleet, rid: int, request: TraceRequest, rng: random.Random, refused: list[RequestRecord]
) -> None:
    ready = fleet.ready()
    if not ready:
        refused.append(
            RequestRecord(
                request_id=rid,
                pod=-1,
                arrival_s=request.arrival_s,
                prompt_tokens=request.prompt_tokens,
                output_tokens=0,
                first_token_s=None,
                finish_s=request.arrival_s,
                outcome="rejected",
            )
        )
        return
    if fleet.config.routing == "random":
        pod = ready[rng.randrange(len(ready))]
    else:
        for candidate in ready:
            candidate.replica.advance_to(request.arrival_s)
        pod = min(ready, key=lambda p: (p.replica.load, p.pod_id))
    pod.replica.advance_to(request.arrival_s)
    pod.replica.add(rid, request)


def _view(fleet: _Fleet, prom: EmulatedPrometheus, now: float) -> FleetView:
    samples = []
    for pod in fleet.live():
        gauges = prom.latest.get(pod.pod_id)
        samples.append(
            PodSample(
                pod=pod.view(),
                waiting=None if gauges is None else gauges.waiting,
                running=None if gauges is None else gauges.running,
                kv_usage=None if gauges is None else gauges.kv_usage,
            )
        )
    return FleetView(
        now=now,
        replicas=fleet.desired,
        batch=fleet.batch,
        pods=tuple(samples),
        signals=prom.signals(now, fleet.config.slo_window_s, fleet.config.budget_window_s),
    )
