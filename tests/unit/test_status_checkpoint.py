"""Status is the law's checkpoint: a steady service writes it once a heartbeat, a changed
decision or condition writes at once, and the law's state is read back from status only when
the operator holds none (a new process, which is also a new leader)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import kopf
import pytest
from kopf._core.engines.posting import event_queue_loop_var, event_queue_var, settings_var
from prometheus_client import REGISTRY

from wok_contracts.profile import load_profile
from wok_contracts.signals import PodView, ServiceSignals
from wok_contracts.slos import Slos
from wok_operator import handlers
from wok_operator.api import InferenceServiceSpec, StepProfileSpec
from wok_operator.budget import plan_for_spec
from wok_operator.control import LawParams, LoopState
from wok_operator.loop import (
    STATUS_HEARTBEAT_S,
    control_tick,
    decision_status,
    memory_status,
    phase,
    resume_state,
    status_digest,
    status_due,
    status_write_cause,
    with_kv_budget,
)
from wok_operator.plan import mix_capacity
from wok_operator.signals import UNAVAILABLE_INTERVALS, Round, SignalsHub, round_queries

SPEC = InferenceServiceSpec.model_validate(
    {
        "scaling": {"minReplicas": 2},
        "runtime": {"gpuMemory": "256Mi", "gpusPerPod": 1},
        "memory": {"maxModelLen": 512, "reserve": "16Mi"},
        "model": {"dtype": "float32"},
        "slo": {"ttftP99Seconds": 2.0},
    }
)
PLAN = plan_for_spec(SPEC)
PODS = [PodView(f"p{i}", f"uid{i}", f"10.0.0.{i}", ready=True, terminating=False) for i in (1, 2)]


def steady_signals(rng: random.Random) -> ServiceSignals:
    """A service well within its SLO whose figures wander a little every tick."""
    return ServiceSignals(
        waiting=0.0,
        running=rng.uniform(3.0, 5.0),
        kv_usage=rng.uniform(0.2, 0.3),
        reporting_pods=2,
        p99_ttft_seconds=rng.uniform(0.3, 0.5),
        p99_tpot_seconds=rng.uniform(0.01, 0.02),
        finished_per_s=rng.uniform(9.0, 11.0),
        rejected_per_s=0.0,
    )


def run_ticks(minutes: int, *, interval_s: float = 5.0) -> tuple[int, list[float]]:
    """The record step's write decision over `minutes` of ticks; returns the writes and the
    decision inputs of every patch (to show they moved)."""
    rng = random.Random(7)
    params = LawParams.from_spec(SPEC, batch_mem=PLAN.max_batch_size)
    held: LoopState | None = None
    status: dict = {}
    last_digest, last_write_at, writes, inputs = None, None, 0, []
    for tick in range(int(minutes * 60 / interval_s)):
        now = 1_000.0 + tick * interval_s
        state = resume_state(held, status, SPEC, params)
        result = control_tick(
            SPEC, state, steady_signals(rng), PODS, batch_mem=PLAN.max_batch_size, now=now
        )
        patch = decision_status(
            result.decision,
            result.observation,
            previous_conditions=status.get("conditions"),
            generation=1,
            now=f"t{tick}",
        )
        patch = with_kv_budget(patch, result.signals or ServiceSignals(), generation=1, now="t")
        patch["memory"] = memory_status(PLAN)
        inputs.append(repr(sorted(patch["lastDecision"]["inputs"].items())))
        digest = status_digest(patch)
        since = None if last_write_at is None else now - last_write_at
        if status_due(
            digest, last_digest, decided_change=result.decision.changed, since_write_s=since
        ):
            status, last_digest, last_write_at, writes = patch, digest, now, writes + 1
        held = result.decision.state
    return writes, inputs


def test_a_steady_service_writes_status_at_most_once_a_minute():
    writes, inputs = run_ticks(minutes=10)
    assert len(set(inputs)) > 100, "the decision's inputs move every tick"
    # The first tick, then one heartbeat a minute.
    assert writes <= 1 + 10, writes
    assert writes >= 10, "the heartbeat still writes"


def test_a_changed_decision_or_condition_writes_at_once_and_the_heartbeat_at_its_period():
    patch = {"batchSize": 8, "replicas": 2, "readyReplicas": 2, "conditions": []}
    digest = status_digest(patch)
    assert status_due(digest, None, decided_change=False, since_write_s=None)
    assert not status_due(digest, digest, decided_change=False, since_write_s=5.0)
    assert status_due(digest, digest, decided_change=True, since_write_s=5.0)
    assert status_due(digest, digest, decided_change=False, since_write_s=STATUS_HEARTBEAT_S)
    ready = {"type": "Ready", "status": "True", "reason": "ReplicasReady", "message": "2 ready"}
    with_ready = status_digest({**patch, "conditions": [ready]})
    assert status_due(with_ready, digest, decided_change=False, since_write_s=5.0)
    # A condition's message carries live figures: a new message alone waits for the heartbeat.
    reworded = status_digest({**patch, "conditions": [{**ready, "message": "3 ready"}]})
    assert reworded == with_ready
    fewer_ready = status_digest({**patch, "readyReplicas": 1})
    assert status_due(fewer_ready, digest, decided_change=False, since_write_s=5.0)


def test_the_law_runs_on_its_held_state_not_on_a_status_the_watch_delivered_late():
    params = LawParams.from_spec(SPEC, batch_mem=PLAN.max_batch_size)
    stale = {"batchSize": 4, "replicas": 1, "controller": {"serviceRate": 1.5}}
    held = LoopState(batch=16, replicas=2, service_rate=6.0, batch_run=3)
    assert resume_state(held, stale, SPEC, params) == held
    # On start (or as a new leader) there is no held state: the checkpoint is read back.
    restored = resume_state(None, stale, SPEC, params)
    assert (restored.batch, restored.replicas, restored.service_rate) == (4, 1, 1.5)


def test_an_external_owners_count_replaces_the_held_replicas():
    spec = SPEC.model_copy(
        update={"replicas": 3, "scaling": SPEC.scaling.model_copy(update={"replicas": "external"})}
    )
    params = LawParams.from_spec(spec, batch_mem=PLAN.max_batch_size)
    held = LoopState(batch=16, replicas=1)
    assert resume_state(held, {}, spec, params) == replace(held, replicas=3)


def test_services_tick_and_write_their_heartbeats_spread_over_the_period():
    # Every daemon starts at once: a phase of their own spreads a thousand services' ticks (and
    # the status writes they bring) over the interval instead of one burst.
    keys = [("team", f"s{i:03d}") for i in range(1000)]
    phases = [phase(key, 5.0) for key in keys]
    assert all(0.0 <= p < 5.0 for p in phases)
    assert phase(keys[7], 5.0) == phase(keys[7], 5.0)  # the same in every process
    tenths = Counter(int(p / 0.5) for p in phases)
    assert len(tenths) == 10 and all(50 <= n <= 150 for n in tenths.values()), tenths


class RecordsWaits:
    """Kopf's DaemonStopped, stopped after its first wait, which it records."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __bool__(self) -> bool:
        return bool(self.waits)

    async def wait(self, timeout: float) -> None:
        self.waits.append(timeout)


async def test_a_control_loop_first_waits_its_services_phase():
    stopped = RecordsWaits()
    await handlers.control_loop(
        stopped=stopped,
        name="chat",
        namespace="team-a",
        spec={"scaling": {"intervalSeconds": 7}},
        body={},
        memo=SimpleNamespace(wok=None),
        logger=None,
        runtime_pods={},
        runtime_replicas={},
    )
    assert stopped.waits == [phase(("team-a", "chat"), 7.0)]


async def test_a_ticks_kubernetes_calls_are_timed_by_call():
    def patch_status(name: str, namespace: str) -> str:
        return f"{namespace}/{name}"

    def count() -> float:
        return (
            REGISTRY.get_sample_value(
                "wok_operator_kube_call_seconds_count", {"call": "patch_status"}
            )
            or 0.0
        )

    before = count()
    assert await handlers.kube_call(patch_status, "chat", "team-a") == "team-a/chat"
    assert count() == before + 1


def test_each_status_write_names_its_cause():
    patch = {"batchSize": 8, "replicas": 2, "readyReplicas": 1, "conditions": []}
    digest = status_digest(patch)

    def cause(now: dict, *, decided: bool = False, since: float | None = 5.0) -> str | None:
        return status_write_cause(
            status_digest(now), digest, decided_change=decided, since_write_s=since
        )

    assert cause(patch, since=None) == "first"
    assert cause({**patch, "batchSize": 9}, decided=True) == "decision"
    assert cause({**patch, "readyReplicas": 2}) == "readyReplicas"
    ready = {"type": "Ready", "status": "True", "reason": "ReplicasReady", "message": "2 ready"}
    assert cause({**patch, "conditions": [ready]}) == "condition:Ready"
    assert cause(patch) is None
    assert cause(patch, since=STATUS_HEARTBEAT_S) == "heartbeat"


def test_the_replicas_a_deadline_needs_reach_status_with_the_decision_or_the_heartbeat():
    # The need moves with the estimate; when it moves the replicas the decision writes at once.
    def lane(needed: int | None) -> dict:
        backlog = {"requests": 40, "estimatedSeconds": 90.0, "neededReplicas": needed}
        return {"batchSize": 8, "replicas": 2, "readyReplicas": 2, "batchLane": backlog}

    assert status_digest(lane(2)) == status_digest(lane(3))
    assert status_digest(lane(2)) != status_digest({**lane(2), "batchLane": {"requests": 0}})


# The operator_scale bench's services (bench/autoscaling/autoscale_manifests.py): an 8B model on
# 80 GiB, whose memory cap is 256 at the observed mean length and 221 at maxModelLen.
BENCH_SPEC = InferenceServiceSpec.model_validate(
    {
        "model": {"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b", "dtype": "bfloat16"},
        "runtime": {"gpuMemory": "80Gi"},
        "memory": {"maxModelLen": 2048},
        "scaling": {"minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 5},
        "slo": {"ttftP99Seconds": 2.0, "tpotP99Seconds": 0.2},
    }
)
MEAN_LENGTH = 700


def test_a_tick_without_the_mean_length_keeps_the_length_the_loop_used_not_an_older_status():
    plan = plan_for_spec(BENCH_SPEC)
    lagging = {"memory": {"sequenceLength": 2048}}  # the reconcile's, the loop's write not landed
    observed = ServiceSignals(mean_prompt_tokens=float(MEAN_LENGTH - 100), mean_output_tokens=100.0)
    fresh = handlers.budget_in_force(BENCH_SPEC, plan, lagging, observed)
    assert fresh.sequence_length == MEAN_LENGTH
    held = handlers.budget_in_force(
        BENCH_SPEC, plan, lagging, ServiceSignals(), held_length=fresh.sequence_length
    )
    assert held == fresh
    # A new process holds nothing yet: the checkpoint's length.
    assert handlers.budget_in_force(BENCH_SPEC, plan, lagging).sequence_length == 2048


def bench_round(fetched_at: float) -> Round:
    """A round with every signal of a bench service (batch lane empty) and its KV measured."""
    values = {
        "waiting": 0.0,
        "running": 20.0,
        "kv_usage": 0.3,
        "reporting": 1.0,
        "mean_prompt:60": float(MEAN_LENGTH - 100),
        "mean_output:60": 100.0,
        "finished_rate:60": 5.0,
        "kv_budget_bytes": 40e9,
        "kv_measured_ratio_min": 1.025,
        "kv_measured_ratio_max": 1.025,
    }
    queries = round_queries({60}, {3600})
    key = ("bench", "svc")
    vectors = {name: {key: values.get(name, 0.05 if "p99" in name else 0.0)} for name in queries}
    return Round(fetched_at=fetched_at, vectors=vectors)


class Kube:
    """The writes a tick hands its writer (the writer is not started: they wait in `pending`)."""

    def patch_status(self, *_: object) -> None: ...
    def set_batch_size(self, *_: object) -> None: ...
    def scale(self, *_: object) -> None: ...


PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing answers: the hub's own rounds fail, as overloaded
POD = PodView("p1", "uid1", "10.0.0.1", ready=True, terminating=False)


def bench_tick(
    spec: InferenceServiceSpec, hub: SignalsHub, kube: Kube
) -> tuple[handlers.LoopMemo, handlers.ServiceTick]:
    """A bench service's tick as the operator runs it, its rounds from `hub`, its writes to
    `kube` (in Kopf's event context, as the operator has it)."""
    settings_var.set(kopf.OperatorSettings())
    event_queue_loop_var.set(asyncio.get_running_loop())
    config = handlers.OperatorConfig(PROMETHEUS_URL)
    wok = handlers.Shared(kube=kube, config=config, hub=hub)  # type: ignore[arg-type]
    memo = handlers.LoopMemo()
    body = {
        "metadata": {"generation": 1},
        "spec": spec.model_dump(by_alias=True),
        "status": {"batchSize": 256, "replicas": 1, "memory": memory_status(plan_for_spec(spec))},
    }
    tick = handlers.ServiceTick(wok, memo, "svc", "bench", body, logging.getLogger("test"))  # type: ignore[arg-type]
    return memo, tick


async def test_a_late_round_changes_neither_the_knobs_nor_status_and_an_outage_does():
    # At 1,000 services most ticks came between two rounds more than 3 intervals apart: each such
    # tick held on no data, flipped MetricsUnavailable, the batch lane's estimate, KVBudgetMatched
    # and the memory cap (so the batch, 256 → 221 → 256), and wrote status 3.4 times per service
    # per minute.
    events: asyncio.Queue = asyncio.Queue()
    event_queue_var.set(events)
    hub = SignalsHub()
    memo, tick = bench_tick(BENCH_SPEC, hub, Kube())

    async def run(age_s: float) -> set[str]:
        hub.answered[PROMETHEUS_URL] = bench_round(time.monotonic() - age_s)
        memo.writer.pending.clear()
        await tick.run([POD], deployed=1)
        return set(memo.writer.pending)

    try:
        assert await run(age_s=0.0) == {"status"}  # the first checkpoint
        assert memo.state is not None and memo.state.batch == 256
        for age_s in (20.0, 40.0, 0.0, 30.0, 1.0):  # late, late, fresh, late, fresh
            assert await run(age_s) == set(), age_s
            assert memo.state.batch == 256
        assert events.empty()
        # No round for 12 intervals: Prometheus is gone, and the SRE hears of it at once.
        assert await run(age_s=UNAVAILABLE_INTERVALS * 5.0 + 1.0) == {"status"}
        assert memo.state.batch == 256
    finally:
        await hub.close()


class RecordingKube(Kube):
    def __init__(self) -> None:
        self.patches: list[tuple[object, ...]] = []

    def patch_status(self, *args: object) -> None:
        self.patches.append(args)


async def test_the_operator_believes_its_step_profiles_capacity_for_the_mix_and_shows_it():
    """An InferenceService with `scaling.stepProfile`: the operator's first tick prices the mix
    its pods finished (700-token sequences, 100 of them output) with the profile, and status
    says what a pod serves, from where."""
    profile = load_profile("sim:llama-3-8b-80g")
    spec = BENCH_SPEC.model_copy(
        update={
            "scaling": BENCH_SPEC.scaling.model_copy(
                update={"step_profile": StepProfileSpec.of(profile)}
            )
        }
    )
    event_queue_var.set(asyncio.Queue())
    hub, kube = SignalsHub(), RecordingKube()
    memo, tick = bench_tick(spec, hub, kube)
    try:
        hub.answered[PROMETHEUS_URL] = bench_round(time.monotonic())
        await tick.run([POD], deployed=1)
        await memo.writer.pending["status"].write()
        [(_, _, patch)] = kube.patches
        controller = patch["controller"]  # type: ignore[index]
        slos = Slos(2.0, 0.2)
        expected = mix_capacity(StepProfileSpec.of(profile), 2048, slos, 600.0, 100.0)
        assert expected is not None and expected > 5.0
        assert controller["capacitySource"] == "profile"
        assert controller["serviceRate"] == pytest.approx(expected)
        assert "capacityRatio" not in controller or controller["capacityRatio"] is None
    finally:
        await hub.close()
