"""The batch lane's backlog in the control loop: Little's-law estimate, composed
with the law only on the deadline opt-in, and shown in status."""

from __future__ import annotations

from dataclasses import replace

import pytest

from wok_contracts.signals import Observation, PodView, ServiceSignals
from wok_operator.api import InferenceServiceSpec
from wok_operator.backlog import Backlog, backlog_need, compose
from wok_operator.budget import plan_for_spec
from wok_operator.control import LawParams, LoopState, decide
from wok_operator.loop import control_tick, decision_status, initial_state, with_batch_lane
from wok_operator.resources import runtime_args

SPEC = InferenceServiceSpec.model_validate(
    {
        "scaling": {"maxReplicas": 8, "maxStep": 2, "podStartSeconds": 30},
        "slo": {"windowSeconds": 30},
    }
)
DEADLINE = SPEC.model_copy(
    update={"batch_lane": SPEC.batch_lane.model_copy(update={"complete_within_seconds": 60.0})}
)
BATCH_MEM = plan_for_spec(SPEC).max_batch_size
# A quiet online lane (one request running per pod, no queue, P99s well inside the SLOs) next
# to a large offline backlog: 400 requests owing 100k tokens, drained at 200 tokens/s.
QUIET_ONLINE = {
    "waiting": 0.0,
    "running": 2.0,
    "kv_usage": 0.1,
    "reporting_pods": 2,
    "p99_seconds": 0.5,
    "p99_ttft_seconds": 0.05,
    "p99_tpot_seconds": 0.01,
    "finished_per_s": 1.0,
    "rejected_per_s": 0.0,
}
BACKLOG = {"batch_requests": 400.0, "batch_pending_tokens": 100_000.0, "batch_tokens_per_s": 200.0}


def pods(ready: int, pending: int = 0) -> list[PodView]:
    return [PodView(f"p{i}", f"u{i}", "127.1.0.2", True, False) for i in range(ready)] + [
        PodView(f"s{i}", f"v{i}", None, False, False) for i in range(pending)
    ]


def state(replicas: int = 2, **memory: float | int | None) -> LoopState:
    params = LawParams.from_spec(SPEC, batch_mem=BATCH_MEM)
    fresh = initial_state(SPEC, params)
    return LoopState(batch=fresh.batch, replicas=replicas, **memory)  # type: ignore[arg-type]


def tick(spec: InferenceServiceSpec, signals: ServiceSignals, **kwargs):  # type: ignore[no-untyped-def]
    return control_tick(
        spec,
        kwargs.pop("state", state()),
        signals,
        kwargs.pop("pods", pods(2)),
        batch_mem=BATCH_MEM,
        now=kwargs.pop("now", 1000.0),
    )


def test_the_time_to_drain_and_the_replicas_a_deadline_needs():
    b = backlog_need(
        requests=40, pending_tokens=1000, tokens_per_s=10, ready_replicas=2, deadline_s=50
    )
    assert (b.requests, b.pending_tokens, b.seconds, b.replicas) == (40, 1000, 100.0, 4)
    assert "needs 4" in b.reason
    in_time = backlog_need(
        requests=40, pending_tokens=1000, tokens_per_s=10, ready_replicas=2, deadline_s=200
    )
    assert in_time.replicas == 1 and "within the 200s deadline" in in_time.reason


@pytest.mark.parametrize(
    ("inputs", "seconds", "replicas", "says"),
    [
        ({"requests": None, "pending_tokens": None, "tokens_per_s": None}, None, None, "no metr"),
        ({"requests": 0, "pending_tokens": 0, "tokens_per_s": 0}, 0.0, 0, "empty"),
        ({"requests": 5, "pending_tokens": 500, "tokens_per_s": None}, None, None, "no through"),
        ({"requests": 5, "pending_tokens": 500, "tokens_per_s": 0.0}, None, None, "no through"),
        ({"requests": 5, "pending_tokens": float("nan"), "tokens_per_s": 5}, None, None, "no thr"),
    ],
)
def test_no_data_is_no_opinion_and_an_empty_lane_needs_nothing(inputs, seconds, replicas, says):
    b = backlog_need(**inputs, ready_replicas=2, deadline_s=60)
    assert (b.seconds, b.replicas) == (seconds, replicas)
    assert says in b.reason


def test_without_a_deadline_the_backlog_is_estimated_but_never_scaled_for():
    b = backlog_need(
        requests=40, pending_tokens=1000, tokens_per_s=10, ready_replicas=2, deadline_s=None
    )
    assert b.seconds == 100.0 and b.replicas is None and "no deadline" in b.reason


def test_an_offline_backlog_without_the_opt_in_changes_nothing_the_law_decides():
    online = ServiceSignals(**QUIET_ONLINE)
    alone = tick(SPEC, online)
    beside = tick(SPEC, ServiceSignals(**QUIET_ONLINE, **BACKLOG))
    assert beside.decision == alone.decision  # replicas, batch, reason, state: all the law's
    assert beside.backlog is not None and beside.backlog.seconds == 500.0
    assert beside.backlog.replicas is None
    status = decision_status(
        beside.decision, beside.observation, previous_conditions=None, generation=1, now="t"
    )
    breached = next(c for c in status["conditions"] if c["type"] == "SLOBreached")
    assert breached["status"] == "False"


def test_with_a_deadline_the_backlog_adds_replicas_within_the_laws_bounds_and_step():
    d = tick(DEADLINE, ServiceSignals(**QUIET_ONLINE, **BACKLOG)).decision
    # 500 s on 2 pods within 60 s needs 17 pods; max step 2 from 2.
    assert (d.replicas_before, d.replicas) == (2, 4)
    assert "replicas 2→4 for the batch lane" in d.reason and "needs 17" in d.reason
    assert d.state.replicas == 4 and d.state.last_scale_up == 1000.0
    assert not d.slo_breached
    # The next ask waits until the new pods could show in the windowed rate (start + window).
    later = tick(
        DEADLINE, ServiceSignals(**QUIET_ONLINE, **BACKLOG), state=d.state, pods=pods(4), now=1030
    ).decision
    assert later.replicas == 4 and "waiting for the last scale-up to show" in later.reason
    settled = tick(
        DEADLINE, ServiceSignals(**QUIET_ONLINE, **BACKLOG), state=d.state, pods=pods(4), now=1061
    ).decision
    assert settled.replicas == 6
    # ... and never past maxReplicas.
    top = tick(
        DEADLINE,
        ServiceSignals(**QUIET_ONLINE, **BACKLOG),
        state=state(replicas=8),
        pods=pods(8),
    ).decision
    assert top.replicas == 8


def test_pods_starting_count_as_the_answer():
    d = tick(
        DEADLINE, ServiceSignals(**QUIET_ONLINE, **BACKLOG), state=state(3), pods=pods(2, 1)
    ).decision
    assert d.replicas == 3 and "waiting for pods starting" in d.reason


def test_a_scale_down_the_backlog_still_needs_is_held():
    params = LawParams.from_spec(SPEC, batch_mem=BATCH_MEM)
    # At its cap the batch holds (a batch that moves blocks a scale-down that tick).
    before = replace(state(replicas=4, down_since=0.0, down_target=1), batch=params.batch_cap)
    obs = Observation(
        queue_per_replica=0.0,
        kv_usage=0.1,
        ready_replicas=4,
        pending_replicas=0,
        running_per_replica=0.5,
        p99_ttft_seconds=0.05,
        p99_tpot_seconds=0.01,
        finished_per_s=0.0,
        rejected_per_s=0.0,
    )
    law = decide(before, obs, params, now=1000.0)
    assert law.replicas < 4  # the online demand alone would scale down
    need = Backlog(400, 100_000, 200.0, 500.0, 600.0, 4, "batch lane: needs 4")
    held = compose(law, need, before=before, obs=obs, params=params, now=1000.0)
    assert held.replicas == 4 and "replicas held at 4 for the batch lane" in held.reason
    assert held.state.replicas == 4
    assert held.state.last_replica_change == before.last_replica_change
    assert held.state.down_since == 0.0  # the law's window runs on for when the backlog is gone


def test_missing_metrics_hold_whatever_the_backlog_says():
    d = tick(DEADLINE, ServiceSignals(**BACKLOG)).decision  # no online queue metric
    assert d.metrics_missing and d.replicas == d.replicas_before


def test_an_external_owner_keeps_the_count_with_a_deadline_too():
    spec = DEADLINE.model_copy(
        update={
            "replicas": 2,
            "scaling": DEADLINE.scaling.model_copy(update={"replicas": "external"}),
        }
    )
    d = tick(spec, ServiceSignals(**QUIET_ONLINE, **BACKLOG)).decision
    assert d.replicas == 2


def test_status_shows_the_backlog_and_its_estimated_completion():
    result = tick(DEADLINE, ServiceSignals(**QUIET_ONLINE, **BACKLOG))
    now = "2026-12-01T20:00:00Z"
    status = decision_status(
        result.decision, result.observation, previous_conditions=None, generation=1, now=now
    )
    assert result.backlog is not None
    status = with_batch_lane(status, result.backlog, now=now)
    assert status["batchLane"] == {
        "requests": 400,
        "pendingTokens": 100_000,
        "tokensPerSecond": 200.0,
        "estimatedSeconds": 500.0,
        "estimatedCompletionTime": "2026-12-01T20:08:20Z",
        "completeWithinSeconds": 60.0,
        "neededReplicas": 17,
    }
    inputs = status["lastDecision"]["inputs"]
    assert (inputs["batchLaneRequests"], inputs["batchLanePendingTokens"]) == (400, 100_000)
    assert inputs["batchLaneReplicas"] == 17
    assert "for the batch lane" in status["lastDecision"]["reason"]


def test_the_batch_lane_cap_is_rendered_only_when_the_spec_sets_it():
    plan = plan_for_spec(SPEC)
    assert not any(a.startswith("--batch-lane-max-batch-size") for a in runtime_args(SPEC, plan))
    big = SPEC.model_copy(
        update={"batching": SPEC.batching.model_copy(update={"batch_lane_max_batch_size": 128})}
    )
    assert "--batch-lane-max-batch-size=128" in runtime_args(big, plan)
    parsed = InferenceServiceSpec.model_validate(
        {"batching": {"batchLaneMaxBatchSize": 64}, "batchLane": {"completeWithinSeconds": 3600}}
    )
    assert parsed.batching.batch_lane_max_batch_size == 64
    assert parsed.batch_lane.complete_within_seconds == 3600
