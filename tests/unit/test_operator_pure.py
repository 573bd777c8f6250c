"""The operator's pure parts: manifests, conditions, the tick's observation and status, PromQL."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from wok_contracts.signals import Observation, PodView, ServiceSignals
from wok_operator import conditions as cond
from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import plan_for_spec
from wok_operator.control import LawParams, LoopState, decide
from wok_operator.leader import LeaseTimes
from wok_operator.loop import (
    decision_status,
    memory_status,
    observe,
    pod_view,
    state_from_status,
    status_digest,
)
from wok_operator.resources import (
    BATCH_SIZE_KEY,
    desired_batching_configmap,
    desired_deployment,
    desired_pod_disruption_budget,
    desired_service,
    runtime_args,
)
from wok_operator.signals import Round, parse_vector, round_queries

ROOT = Path(__file__).resolve().parents[2]

SPEC = InferenceServiceSpec.model_validate(
    {
        "runtime": {"gpuMemory": "256Mi", "gpusPerPod": 1},
        "memory": {"maxModelLen": 512, "reserve": "16Mi"},
        "model": {"dtype": "float32"},
    }
)
PLAN = plan_for_spec(SPEC)


def test_deployment_runs_the_runtime_with_flags_from_the_spec():
    dep = desired_deployment(
        "svc", "ns", SPEC, budget=PLAN, replicas=3, extra_pod_labels={"wok.dev/backed": "true"}
    )
    assert dep["metadata"]["name"] == "svc-runtime" and dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["wok"]
    args = container["args"]
    assert args[:2] == ["runtime", "serve"]
    assert "--model=builtin:tiny" in args
    assert "--max-model-len=512" in args
    assert f"--kv-cache-bytes={PLAN.kv_budget_bytes}" in args
    # The batch size comes from the ConfigMap at start, never from the template (no rollouts).
    assert "--max-batch-size=$(WOK_MAX_BATCH_SIZE)" in args
    env = {e["name"]: e for e in container["env"]}
    assert env["WOK_MAX_BATCH_SIZE"]["valueFrom"]["configMapKeyRef"]["key"] == BATCH_SIZE_KEY
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["OMP_NUM_THREADS"]["value"] == "2"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert not security["allowPrivilegeEscalation"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == SPEC.runtime.drain_seconds + 5
    assert pod["metadata"]["labels"]["wok.dev/backed"] == "true"
    assert pod["metadata"]["labels"]["wok.dev/service"] == "svc"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    selector = dep["spec"]["selector"]["matchLabels"]
    assert all(pod["metadata"]["labels"][k] == v for k, v in selector.items())


def test_a_sim_source_runs_the_simulated_accelerator_sized_by_its_profile():
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": "sim:llama-3-8b-80g", "preset": "llama-3-8b"},
            "runtime": {"simLoadSeconds": 2},
        }
    )
    plan = plan_for_spec(spec)
    args = runtime_args(spec, plan)
    assert {"--device=sim", "--profile=sim:llama-3-8b-80g", "--sim-load-seconds=2"} <= set(args)
    assert "--served-model-name=llama-3-8b-80g" in args
    # The profile sizes the KV pool; the budget of the model it stands for caps the batch.
    assert not any(a.startswith(("--kv-cache-bytes", "--gpu-memory-utilization")) for a in args)
    assert plan.max_batch_size > 32


def test_rendering_is_deterministic_and_the_configmap_carries_the_batch():
    first = desired_deployment("svc", "ns", SPEC, budget=PLAN, replicas=1)
    assert first == desired_deployment("svc", "ns", SPEC, budget=PLAN, replicas=1)
    assert desired_batching_configmap("svc", "ns", 12)["data"] == {BATCH_SIZE_KEY: "12"}
    assert (
        desired_service("svc", "ns")["spec"]["selector"] == first["spec"]["selector"]["matchLabels"]
    )


def test_the_disruption_budget_covers_the_runtime_pods_one_at_a_time_without_blocking_drains():
    pods = desired_deployment("svc", "ns", SPEC, budget=PLAN, replicas=2)["spec"]["template"]
    budget = desired_pod_disruption_budget("svc", "ns")
    assert budget["metadata"]["name"] == "svc-runtime"
    assert budget["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
    # One at a time, at any replica count: a minAvailable at the floor would block every drain.
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_changing_the_slo_does_not_change_the_pod_template():
    slower = SPEC.model_copy(update={"slo": SPEC.slo.model_copy(update={"ttft_p99_seconds": 9})})
    a = desired_deployment("svc", "ns", SPEC, budget=PLAN, replicas=1)["spec"]["template"]
    b = desired_deployment("svc", "ns", slower, budget=PLAN, replicas=1)["spec"]["template"]
    assert a == b


def test_runtime_args_name_every_queue_class():
    assert "--priority-classes=interactive=0,standard=1,batch=2" in runtime_args(SPEC, PLAN)


def test_condition_transition_time_moves_only_on_status_change():
    c = cond.set_condition([], "Ready", False, "Starting", now="t1", generation=1)
    c = cond.set_condition(c, "Ready", False, "StillStarting", now="t2", generation=1)
    assert c[0]["lastTransitionTime"] == "t1" and c[0]["reason"] == "StillStarting"
    c = cond.set_condition(c, "Ready", True, "Up", now="t3", generation=2)
    assert c[0]["lastTransitionTime"] == "t3" and c[0]["observedGeneration"] == 2
    c = cond.set_condition(c, "Degraded", False, "Fine", now="t4")
    assert [x["type"] for x in c] == ["Ready", "Degraded"]


def pod(name: str, *, ready: bool, phase: str = "Running", deleting: bool = False) -> PodView:
    meta = {"uid": name, **({"deletionTimestamp": "x"} if deleting else {})}
    status = {
        "phase": phase,
        "podIP": "127.1.0.2",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return pod_view(name, meta, status)


def test_observation_divides_the_queue_by_ready_pods_only():
    pods = [
        pod("a", ready=True),
        pod("b", ready=True),
        pod("c", ready=False, phase="Pending"),
        pod("d", ready=True, deleting=True),
    ]
    obs = observe(ServiceSignals(waiting=9, running=4, p99_seconds=1.5), pods)
    assert obs.ready_replicas == 3 and obs.pending_replicas == 1
    assert obs.queue_per_replica == 3 and obs.running_per_replica == pytest.approx(4 / 3)
    assert observe(ServiceSignals(), pods).queue_per_replica is None
    assert observe(ServiceSignals(waiting=5), []).queue_per_replica is None


def test_an_external_owner_pins_the_replicas_and_the_batch_still_moves():
    """`scaling.replicas: external`: kubectl scale, an HPA or KEDA set spec.replicas; the law
    never writes another count, whatever the queue says, and moves the batch as before."""
    spec = SPEC.model_copy(
        update={"replicas": 3, "scaling": SPEC.scaling.model_copy(update={"replicas": "external"})}
    )
    params = LawParams.from_spec(spec, batch_mem=PLAN.max_batch_size)
    state = state_from_status({"replicas": 1, "batchSize": 8}, spec, params)
    assert state.replicas == 3
    flooded = Observation(
        queue_per_replica=50,
        kv_usage=0.2,
        ready_replicas=3,
        pending_replicas=0,
        running_per_replica=8,
        p99_ttft_seconds=30.0,
        p99_tpot_seconds=0.01,
        finished_per_s=4.0,
        rejected_per_s=0.0,
    )
    batches = []
    for tick in range(12):
        d = decide(state, flooded, params, now=100.0 + 5 * tick)
        assert d.replicas == d.replicas_before == 3, d.reason
        assert "replicas" not in d.reason, d.reason
        batches.append(d.batch)
        state = d.state
    assert batches[0] > 8 and batches == sorted(batches)
    # The HPA scales to zero: the law follows, it does not bring a pod back.
    to_zero = spec.model_copy(update={"replicas": 0})
    params = LawParams.from_spec(to_zero, batch_mem=PLAN.max_batch_size)
    idle = state_from_status({"replicas": 3}, to_zero, params)
    assert decide(idle, flooded, params, now=200.0).replicas == 0


def test_state_round_trips_through_status():
    params = LawParams.from_spec(SPEC, batch_mem=PLAN.max_batch_size)
    fresh = state_from_status({}, SPEC, params)
    assert (fresh.batch, fresh.replicas) == (SPEC.batching.initial_batch_size, 1)
    long_queue = Observation(
        queue_per_replica=20,
        kv_usage=0.2,
        ready_replicas=1,
        pending_replicas=0,
        running_per_replica=8,
        p99_tpot_seconds=0.01,
        finished_per_s=4.0,
        rejected_per_s=0.0,
    )
    d = decide(fresh, long_queue, params, now=100.0)
    status = decision_status(d, long_queue, previous_conditions=None, generation=1, now="t")
    restored = state_from_status(status, SPEC, params)
    assert restored == d.state
    assert status["lastDecision"]["batch"] == {"from": 32, "to": params.batch_cap}  # its cap, 52
    assert status["lastDecision"]["inputs"]["desiredReplicas"] == d.desired_replicas
    types = {c["type"]: c["status"] for c in status["conditions"]}
    assert types["Ready"] == "True" and types["MetricsUnavailable"] == "False"
    # The batch moved and every pod is ready: nothing is on its way (the decision is in
    # lastDecision); Progressing follows the pods.
    assert types["Progressing"] == "False"
    # The next tick holds: the same conditions, so the step is one status write, not two.
    held = replace(d, batch_before=d.batch, replicas_before=d.replicas)
    after = decision_status(
        held, long_queue, previous_conditions=status["conditions"], generation=1, now="t2"
    )
    assert status_digest(after) == status_digest(status)


def two_quiet_pods(**budget: float) -> Observation:
    """Two pods with 8 running and no queue, with the budget window's P99s and P99.5s."""
    return Observation(
        queue_per_replica=0,
        kv_usage=0.2,
        ready_replicas=2,
        pending_replicas=0,
        running_per_replica=8,
        finished_per_s=4.0,
        rejected_per_s=0.0,
        **budget,  # type: ignore[arg-type]
    )


def test_a_spent_error_budget_shows_as_a_condition_with_the_utilization_in_force():
    params = LawParams.from_spec(SPEC, batch_mem=PLAN.max_batch_size)
    state = LoopState(batch=32, replicas=2, burst_at=50.0)  # the traffic outran the fleet
    conditions = {}
    for budget_ttft in (1.2, 3.5):
        obs = two_quiet_pods(budget_p99_ttft_seconds=budget_ttft)
        d = decide(state, obs, params, now=100.0)
        status = decision_status(d, obs, previous_conditions=None, generation=1, now="t")
        inputs = status["lastDecision"]["inputs"]
        assert inputs["budgetP99TtftSeconds"] == budget_ttft
        conditions[budget_ttft] = next(
            c for c in status["conditions"] if c["type"] == "ErrorBudgetSpent"
        )
        conditions[budget_ttft]["utilization"] = inputs["utilization"]
    kept, spent = conditions[1.2], conditions[3.5]
    assert (kept["status"], kept["utilization"]) == ("False", SPEC.scaling.target_utilization)
    assert (spent["status"], spent["utilization"]) == ("True", SPEC.scaling.breached_utilization)
    assert "TTFT 3.500s" in spent["message"] and "utilization 0.6" in spent["message"]
    assert spent["reason"] == "BudgetWindowP99AboveTarget"
    # Back under 1 % missed but not under 0.5 %: still spent, and the reason says why.
    obs = two_quiet_pods(budget_p99_ttft_seconds=1.9, budget_p995_ttft_seconds=2.6)
    d = decide(replace(state, budget_spent=True), obs, params, now=100.0)
    status = decision_status(d, obs, previous_conditions=None, generation=1, now="t")
    recovering = next(c for c in status["conditions"] if c["type"] == "ErrorBudgetSpent")
    assert (recovering["status"], recovering["reason"]) == ("True", "HalfTheBudgetNotBack")
    assert "P99.5 TTFT 2.600s" in recovering["message"]
    assert status["lastDecision"]["inputs"]["budgetP995TtftSeconds"] == 2.6
    assert status["controller"]["budgetSpent"] is True


def test_missing_metrics_set_metrics_unavailable():
    params = LawParams.from_spec(SPEC, batch_mem=PLAN.max_batch_size)
    obs = Observation(queue_per_replica=None, kv_usage=None, ready_replicas=1, pending_replicas=0)
    d = decide(LoopState(batch=8, replicas=1), obs, params, now=0)
    status = decision_status(
        d,
        obs,
        previous_conditions=None,
        generation=1,
        now="t",
        metrics_error="ConnectionError: refused",
    )
    unavailable = next(c for c in status["conditions"] if c["type"] == "MetricsUnavailable")
    assert unavailable["status"] == "True" and "refused" in unavailable["message"]


def test_one_round_is_a_constant_number_of_queries():
    assert len(round_queries([60])) == 19
    assert len(round_queries([60, 60])) == 19
    assert len(round_queries([60, 120])) == 29
    # The budget window adds its three SLO P99s (none where it is an SLO window too) and their
    # three P99.5s, half the budget.
    assert len(round_queries([60], [3600])) == 25
    assert len(round_queries([60], [60])) == 22
    for query in round_queries([60]).values():
        assert "by (namespace, service" in query


def test_parse_vector_keys_by_service_and_drops_nan():
    result = [
        {"metric": {"namespace": "a", "service": "x"}, "value": [0, "3"]},
        {"metric": {"namespace": "a", "service": "y"}, "value": [0, "NaN"]},
        {"metric": {"namespace": "a"}, "value": [0, "1"]},
    ]
    assert parse_vector(result) == {("a", "x"): 3.0}
    rnd = Round(fetched_at=0, vectors={"waiting": {("a", "x"): 3.0}, "p99:60": {}})
    assert rnd.signals(("a", "x"), 60) == ServiceSignals(waiting=3.0)
    assert math.isnan(float("nan"))


def test_lease_times_keep_a_margin_between_deadline_and_duration():
    with pytest.raises(ValueError, match="lease duration must exceed"):
        LeaseTimes(lease_duration_s=10, renew_deadline_s=10, retry_period_s=2)
    with pytest.raises(ValueError, match="renew deadline must exceed"):
        LeaseTimes(lease_duration_s=15, renew_deadline_s=2, retry_period_s=2)


def test_a_reconcile_keeps_the_batch_cap_the_loop_sized_from_observed_lengths():
    """Diagnosis 4: a spec edit must not cut the batch to the maxModelLen B_mem (256 → 51)."""
    from wok_operator.handlers import budget_in_force, validated  # imports kopf: only here

    document = yaml.safe_load((ROOT / "examples" / "production.yaml").read_text())
    spec, plan = validated(document["spec"])
    assert spec.memory.length_estimate == "observedMean"
    in_force = budget_in_force(spec, plan, {"memory": {"sequenceLength": 1500}})
    assert in_force.sequence_length == 1500
    assert in_force.max_batch_size > 4 * plan.max_batch_size
    assert budget_in_force(spec, plan, {}).max_batch_size == plan.max_batch_size
    status = memory_status(in_force)
    assert (
        status["sequenceLength"] == 1500 and status["maxBatchByMemory"] == in_force.max_batch_size
    )


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"source": "builtin:gemma-2b"}, "unknown preset 'gemma-2b'"),
        ({"source": "sim:h100", "preset": "gemma-2b"}, "unknown preset 'gemma-2b'"),
    ],
)
def test_a_model_the_operator_cannot_size_is_an_invalid_spec_before_any_pod(model, message):
    """What the CRD's enums cannot see (a builtin's name; a preset sent without the schema,
    e.g. from Python) is refused by the reconcile with the reason, which it writes to the
    Degraded condition (InvalidSpec) instead of making a Deployment."""
    from wok_operator.handlers import validated  # imports kopf: only here

    with pytest.raises(ValueError, match=message):
        validated({"model": model})


def test_a_pod_that_cannot_pull_its_image_or_keeps_crashing_shows_in_status():
    from wok_operator.loop import with_pod_failures

    def pod(name: str, statuses: dict) -> PodView:
        meta = {"uid": name, "creationTimestamp": "2026-12-07T00:00:00Z"}
        return pod_view(name, meta, {"phase": "Pending", **statuses})

    pulling = pod(
        "svc-a",
        {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "state": {
                        "waiting": {"reason": "ImagePullBackOff", "message": "no such image"}
                    },
                }
            ]
        },
    )
    crashing = pod(
        "svc-b",
        {"initContainerStatuses": [{"name": "model-export", "state": {"waiting": {
            "reason": "CrashLoopBackOff"}}}]},
    )  # fmt: skip
    creating = {"waiting": {"reason": "ContainerCreating"}}
    starting = pod("svc-c", {"containerStatuses": [{"name": "vllm", "state": creating}]})
    assert pulling.failure == "vllm: ImagePullBackOff: no such image"
    assert crashing.failure == "model-export: CrashLoopBackOff"
    assert starting.failure is None  # a slow start is not a failure

    now = "2026-12-07T00:01:00Z"
    patch = with_pod_failures({}, [starting, pulling, crashing], generation=2, now=now)
    (failing,) = patch["conditions"]
    assert (failing["type"], failing["status"]) == (cond.PODS_FAILING, "True")
    assert failing["reason"] == "ImagePullBackOff"
    assert (
        failing["message"] == "pod svc-a: vllm: ImagePullBackOff: no such image (and 1 more pod(s))"
    )
    healed = with_pod_failures(patch, [starting], generation=2, now=now)
    assert [(c["status"], c["reason"]) for c in healed["conditions"]] == [
        ("False", "NoFailingPods")
    ]
