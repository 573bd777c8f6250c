"""The Kopf handlers: reconcile each InferenceService, and run its control loop.

Handlers are short and idempotent; the work is in pure functions (`resources`, `budget`, `loop`,
`control`). Results go to status. Blocking Kubernetes calls run in threads, pod admin calls are
async, and each service has its own daemon, so a slow service never delays another. A tick reads
only memory (Kopf's indexes of the pods and Deployments, the shared Prometheus round) and hands
its writes to the service's `writer.ServiceWriter`, so a slow apiserver never delays a tick.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from wok_contracts.signals import PodView, ServiceSignals
from wok_operator import conditions as cond
from wok_operator import metrics
from wok_operator.actuate import Kube, push_batch_size
from wok_operator.api import GROUP, PLURAL, VERSION, InferenceServiceSpec
from wok_operator.budget import MemoryBudget, plan_for_spec, sequence_length
from wok_operator.control import Decision, LawParams, LoopState
from wok_operator.fixed_batch import (
    EngineBatch,
    engine_batch_after,
    law_batch_mem,
    with_engine_batch,
)
from wok_operator.leader import Candidate
from wok_operator.loop import (
    STATUS_HEARTBEAT_S,
    TickResult,
    control_tick,
    decision_status,
    held_tick,
    memory_status,
    phase,
    pod_view,
    resume_state,
    state_from_status,
    status_digest,
    status_write_cause,
    with_batch_lane,
    with_kv_budget,
    with_pod_failures,
)
from wok_operator.resources import (
    MANAGED_BY,
    SERVICE_LABEL,
    admin_secret,
    desired_batching_configmap,
    desired_deployment,
    desired_pod_monitor,
    desired_service,
    selector_text,
)
from wok_operator.signals import HeldSignals, SignalsHub, carry_over, recheck_due
from wok_operator.vllm_pod import engine_batch_size
from wok_operator.writer import ServiceWriter

T = TypeVar("T")


@dataclass
class OperatorConfig:
    """Operator-wide settings (from `wok operator run`), kept in Kopf's memo."""

    prometheus_url: str | None = None
    extra_pod_labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Shared:
    """Clients shared by all handlers (in memo, never in globals)."""

    kube: Kube
    config: OperatorConfig
    hub: SignalsHub = field(default_factory=SignalsHub)
    http: httpx.AsyncClient | None = None
    leadership: Candidate | None = None  # None: a single replica (--standalone)
    # Whether the PodMonitor CRD exists, and when that was read (`pod_monitors_present`).
    pod_monitors: tuple[bool, float] | None = None


#: How long the finding that the PodMonitor CRD exists is trusted, and that it does not: a
#: reconcile read it every time (1,000 GETs when 1,000 services resume); a CRD installed after
#: the operator started is seen within the shorter.
POD_MONITORS_PRESENT_S = 300.0
POD_MONITORS_MISSING_S = 30.0


def pod_monitors_present(wok: Shared, now: float | None = None) -> bool:
    """Whether the cluster serves PodMonitors, read again only when the last finding is old."""
    now = time.monotonic() if now is None else now
    found = wok.pod_monitors
    due = recheck_due(
        found, now, present_s=POD_MONITORS_PRESENT_S, missing_s=POD_MONITORS_MISSING_S
    )
    if found is None or due:
        found = wok.pod_monitors = (wok.kube.has_pod_monitors(), now)
    return found[0]


def shared(memo: Any) -> Shared:
    return memo.wok


def ensure_leading(wok: Shared) -> None:
    """Before any write: a replica that lost the lease exits here instead of acting."""
    if wok.leadership is not None:
        wok.leadership.ensure_holds()


def budget_in_force(
    spec: InferenceServiceSpec,
    plan: MemoryBudget,
    status: Any,
    signals: ServiceSignals | None = None,
    *,
    held_length: int | None = None,
) -> MemoryBudget:
    """B_mem for the lengths being served: with `lengthEstimate: observedMean`, the observed
    mean, else (a quiet window, a tick without a fresh round, or a reconcile, which sees no
    signals) the length the loop last used, `held_length`, or without one (a reconcile, a new
    process) the length it last recorded in status; clipping with the maxModelLen plan would cut
    the batch at every spec edit (256 → 51 in examples/production.yaml). Status is a checkpoint
    that lags the loop by its writes (over a minute at 1,000 services): read on a held tick, it
    gave a maxModelLen cap (221) between fresh ticks at the observed mean's (256), and the batch
    went 256 → 221 → 256 with every stale round."""
    recorded = ((status or {}).get("memory") or {}).get("sequenceLength")
    last_length = recorded if held_length is None else held_length
    mean = signals.mean_sequence_tokens if signals is not None else None
    length = sequence_length(spec.memory, mean, last_length)
    if length == plan.sequence_length:
        return plan
    return plan_for_spec(spec, sequence_length=length)


def validated(spec: Any) -> tuple[InferenceServiceSpec, MemoryBudget]:
    """The spec and its budget, or ValueError with the message a user needs."""
    try:
        parsed = InferenceServiceSpec.model_validate(dict(spec))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"invalid spec at {where or 'spec'}: {first['msg']}") from None
    return parsed, plan_for_spec(parsed)


# --- pods, indexed so that a tick costs no API call ----------------------------------------------


@kopf.index("pods", labels={"app.kubernetes.io/managed-by": MANAGED_BY})
def runtime_pods(
    name: str, namespace: str, labels: kopf.Labels, meta: kopf.Meta, status: kopf.Status, **_: Any
) -> dict[tuple[str, str], PodView]:
    return {(namespace, labels.get(SERVICE_LABEL, "")): pod_view(name, dict(meta), dict(status))}


@kopf.index("deployments", labels={"app.kubernetes.io/managed-by": MANAGED_BY})
def runtime_replicas(
    namespace: str, labels: kopf.Labels, spec: kopf.Spec, **_: Any
) -> dict[tuple[str, str], int]:
    """Each runtime Deployment's spec.replicas, from the watch: a `kubectl scale` of it is seen at
    the next tick, without a read per tick."""
    return {(namespace, labels.get(SERVICE_LABEL, "")): int(spec.get("replicas") or 0)}


# --- reconcile: desired state ---------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str,
    body: kopf.Body,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    wok = shared(memo)
    ensure_leading(wok)
    generation = meta.get("generation")
    conditions = list(status.get("conditions") or [])
    try:
        parsed, plan = validated(spec)
    except ValueError as error:
        # Passes the schema but cannot work: say what to change, create nothing.
        patch.status["conditions"] = cond.set_condition(
            conditions, cond.DEGRADED, True, "InvalidSpec", str(error), generation=generation
        )
        patch.status["observedGeneration"] = generation
        kopf.warn(body, reason="InvalidSpec", message=str(error))
        metrics.RECONCILE_ERRORS.inc()
        return
    plan = budget_in_force(parsed, plan, status)
    params = LawParams.from_spec(parsed, batch_mem=law_batch_mem(parsed, plan))
    state = state_from_status(dict(status), parsed, params)
    batch, replicas = params.clip_batch(state.batch), params.clip_replicas(state.replicas)
    engine_batch = engine_batch_size(parsed, batch) if parsed.engine == "vllm" else None

    secret = admin_secret(name, namespace, secrets.token_urlsafe(32))
    kopf.adopt(secret, owner=body)
    created_secret = wok.kube.create_once(secret)
    owned = [
        desired_batching_configmap(name, namespace, batch),
        desired_deployment(
            name,
            namespace,
            parsed,
            budget=plan,
            replicas=replicas,
            extra_pod_labels=wok.config.extra_pod_labels,
            engine_batch=engine_batch,
        ),
        desired_service(name, namespace),
    ]
    if pod_monitors_present(wok):
        owned.append(desired_pod_monitor(name, namespace))
    for obj in owned:
        kopf.adopt(obj, owner=body)
        wok.kube.apply(obj)
    logger.info(
        "reconciled: batch %d (memory cap %d), replicas %d%s",
        batch,
        plan.max_batch_size,
        replicas,
        ", admin token created" if created_secret else "",
    )
    conditions = cond.set_condition(
        conditions, cond.DEGRADED, False, "SpecValid", generation=generation
    )
    conditions = cond.set_condition(
        conditions,
        cond.PROGRESSING,
        True,
        "Reconciled",
        f"runtime Deployment applied for generation {generation}",
        generation=generation,
    )
    patch.status.update(
        {
            "observedGeneration": generation,
            "memory": memory_status(plan),
            "batchSize": batch,
            "engineBatchSize": engine_batch,
            "replicas": replicas,
            "selector": selector_text(name),
            "conditions": conditions,
        }
    )


# --- the control loop: one daemon per InferenceService -------------------------------------------


@dataclass
class LoopMemo:
    """Per-service, per-process: the law's state, what each pod has confirmed, and what status
    last said. Status is the state's checkpoint, read back only while `state` is None: when this
    process starts, which is also when a replica becomes the leader (one that loses the lease
    exits, `leader.py`)."""

    state: LoopState | None = None
    applied: dict[str, int] = field(default_factory=dict)  # pod uid → batch size confirmed
    last_digest: tuple[Any, ...] | None = None  # `loop.status_digest` of the last write
    last_write_at: float | None = None  # time.monotonic() of the last status write (submitted)
    # The last scale handed to the writer, and the count the Deployment showed then: until the
    # watch shows the Deployment moving, the same scale is not sent again.
    scaled_to: int | None = None
    scaled_from: int | None = None
    admin_token: str | None = None  # read once; a pod that refuses it has it read again
    signals: HeldSignals | None = None  # the last signals a round had (`signals.carry_over`)
    sequence_length: int | None = None  # the L of B_mem the last tick used (`budget_in_force`)
    engine_batch: int | None = None  # engine: vllm: the --max-num-seqs the pods were given
    last_tick: TickResult | None = None  # the last tick that had a round (`loop.held_tick`)
    writer: ServiceWriter = field(default_factory=ServiceWriter)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0, initial_delay=1.0)
async def control_loop(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str,
    spec: kopf.Spec,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    runtime_pods: kopf.Index[tuple[str, str], PodView],
    runtime_replicas: kopf.Index[tuple[str, str], int],
    **_: Any,
) -> None:
    wok = shared(memo)
    key = (namespace, name)
    loop_memo = LoopMemo(writer=ServiceWriter(f"{namespace}/{name}"))
    loop_memo.writer.start()
    try:
        # Each service ticks at its own phase of the interval, not with every other at once.
        interval = float(spec.get("scaling", {}).get("intervalSeconds", 5))
        await stopped.wait(phase(key, interval))
        while not stopped:
            interval = float(spec.get("scaling", {}).get("intervalSeconds", 5))
            started = time.monotonic()
            with metrics.CONTROL_LOOP_SECONDS.time():
                try:
                    pods = list(runtime_pods.get(key, []))
                    deployed = next(iter(runtime_replicas.get(key, [])), None)
                    tick = ServiceTick(wok, loop_memo, name, namespace, body, logger)
                    await tick.run(pods, deployed=deployed)
                except (ApiException, httpx.HTTPError, OSError) as error:
                    metrics.RECONCILE_ERRORS.inc()
                    logger.warning("control tick failed, retrying next tick: %s", error)
                    kopf.warn(body, reason="ControlTickFailed", message=str(error)[:500])
            await stopped.wait(max(0.1, interval - (time.monotonic() - started)))
    finally:
        # The last checkpoint lands before the daemon ends (within Kopf's cancellation timeout);
        # a deleted service's writes end at their 404.
        await loop_memo.writer.close(timeout=5.0)
        # The daemon ends when the service is deleted: its series must not outlive it.
        metrics.forget_service(key)


@dataclass
class ServiceTick:
    """One tick of one service's loop: observe → decide → record → act. The pure middle
    (`loop.control_tick`) is the one the fleet simulator runs; the steps around it are the I/O."""

    wok: Shared
    memo: LoopMemo
    name: str
    namespace: str
    body: kopf.Body
    logger: kopf.Logger

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    async def run(self, pods: list[PodView], *, deployed: int | None) -> None:
        """`deployed`: the Deployment's replica count as the watch last showed it (None: not seen
        yet)."""
        try:
            spec, plan = validated(self.body.get("spec", {}))
        except ValueError:
            return  # reconcile reports it as Degraded; there is nothing to control
        status = dict(self.body.get("status") or {})
        if "batchSize" not in status:
            return  # not reconciled yet
        signals, metrics_error, late = await self.observe(spec)
        plan = budget_in_force(spec, plan, status, signals, held_length=self.memo.sequence_length)
        self.memo.sequence_length = plan.sequence_length
        batch_mem = law_batch_mem(spec, plan)
        params = LawParams.from_spec(spec, batch_mem=batch_mem)
        state = resume_state(self.memo.state, status, spec, params)
        last, now = self.memo.last_tick, time.time()
        if late and last is not None and metrics_error is not None:
            result = held_tick(last, state, pods, params=params, now=now, why=metrics_error)
        else:
            result = control_tick(spec, state, signals, pods, batch_mem=batch_mem, now=now)
            self.memo.last_tick = result
        export_service_metrics(self.key, spec, result)
        ensure_leading(self.wok)
        engine = None
        if spec.engine == "vllm":
            running = self.memo.engine_batch or status.get("engineBatchSize")
            engine = engine_batch_after(spec, result.decision.batch, running)
        self.record(status, plan, result, metrics_error, spec=spec, engine=engine, pods=pods)
        external = spec.scaling.replicas == "external"
        self.act(result.decision, pods, deployed=deployed, external=external, engine=engine)
        if engine is not None and engine.roll:
            self.roll(spec, plan, result.decision.replicas, engine.size)
        self.memo.state = result.decision.state  # the tick is done: the next one starts here
        if engine is not None:
            self.memo.engine_batch = engine.size

    def roll(
        self, spec: InferenceServiceSpec, plan: MemoryBudget, replicas: int, batch: int
    ) -> None:
        """`applyToEngine: restart`: the Deployment again with the law's batch as the pods'
        --max-num-seqs; its rolling update (one pod more, none less) restarts them one by one."""
        deployment = desired_deployment(
            self.name,
            self.namespace,
            spec,
            budget=plan,
            replicas=replicas,
            extra_pod_labels=self.wok.config.extra_pod_labels,
            engine_batch=batch,
        )
        kopf.adopt(deployment, owner=self.body)
        self.memo.writer.submit("engine-batch", kube_write(self.wok.kube.apply, deployment))
        kopf.event(
            self.body,
            type="Normal",
            reason="EngineBatchRolled",
            message=f"the vLLM pods roll to --max-num-seqs={batch}",
        )

    async def observe(self, spec: InferenceServiceSpec) -> tuple[ServiceSignals, str | None, bool]:
        """The service's signals, or why there are none, and whether the round is only late
        (`signals.only_late`)."""
        url = spec.metrics.prometheus_url or self.wok.config.prometheus_url
        if not url:
            return ServiceSignals(), "no Prometheus URL configured", False
        window, budget_window = spec.slo.window_seconds, spec.slo.budget_window_seconds
        rnd = await self.wok.hub.get(
            url,
            self.key,
            window=window,
            budget_window=budget_window,
            max_age_s=spec.scaling.interval_seconds,
        )
        if rnd.error is not None:
            metrics.TICKS_WITHOUT_SIGNALS.inc()
            return ServiceSignals(), rnd.error, rnd.late
        fresh = rnd.signals(self.key, window, budget_window)
        signals, self.memo.signals = carry_over(
            fresh, rnd.fetched_at, self.memo.signals, max_age_s=spec.scaling.interval_seconds
        )
        return signals, None, False

    def record(
        self,
        status: dict[str, Any],
        plan: MemoryBudget,
        result: TickResult,
        metrics_error: str | None,
        *,
        spec: InferenceServiceSpec | None = None,
        engine: EngineBatch | None = None,
        pods: list[PodView] | None = None,
    ) -> None:
        """The status to the writer first (so a reconcile in between renders the new numbers),
        and an Event per knob that moved (Kopf posts Events from its own queue)."""
        decision = result.decision
        now = cond.now_iso()
        generation = self.body.get("metadata", {}).get("generation")
        patch = decision_status(
            decision,
            result.observation,
            previous_conditions=status.get("conditions"),
            generation=generation,
            now=now,
            metrics_error=metrics_error,
        )
        patch = with_kv_budget(
            patch, result.signals or ServiceSignals(), generation=generation, now=now
        )
        if result.backlog is not None:
            patch = with_batch_lane(patch, result.backlog, now=now)
        patch["memory"] = memory_status(plan)
        patch = with_pod_failures(patch, pods or [], generation=generation, now=now)
        if spec is not None and engine is not None:
            patch = with_engine_batch(
                patch, spec, law_batch=decision.batch, engine=engine, generation=generation, now=now
            )
        digest = status_digest(patch)
        last = self.memo.last_write_at
        since_write = None if last is None else time.monotonic() - last
        cause = status_write_cause(
            digest,
            self.memo.last_digest,
            decided_change=decision.changed,
            since_write_s=since_write,
        )
        if cause is not None:
            self.memo.writer.submit(
                "status", kube_write(self.wok.kube.patch_status, self.name, self.namespace, patch)
            )
            written_at = time.monotonic()
            if last is None:  # the first heartbeat comes at the service's phase of the period
                written_at -= phase(self.key, STATUS_HEARTBEAT_S / 2)
            self.memo.last_digest, self.memo.last_write_at = digest, written_at
            metrics.STATUS_WRITES.labels(cause=cause).inc()
        for knob, before, after in (
            ("batch", decision.batch_before, decision.batch),
            ("replicas", decision.replicas_before, decision.replicas),
        ):
            if after != before:
                direction = "up" if after > before else "down"
                metrics.DECISIONS.labels(knob=knob, direction=direction).inc()
                # A decision is an Event whatever the posting level (which keeps the handlers'
                # INFO logs out of the apiserver).
                kopf.event(
                    self.body,
                    type="Normal",
                    reason=f"{knob.capitalize()}Changed",
                    message=decision.reason,
                )

    def act(
        self,
        decision: Decision,
        pods: list[PodView],
        *,
        deployed: int | None,
        external: bool = False,
        engine: EngineBatch | None = None,
    ) -> None:
        """The world follows the decision, through the writer: the ConfigMap, the Deployment's
        replicas (when the watch shows them elsewhere: someone may have scaled by hand; the law's
        number wins), the pods."""
        kube, memo = self.wok.kube, self.memo
        if decision.batch != decision.batch_before:
            memo.writer.submit(
                "batch", kube_write(kube.set_batch_size, self.name, self.namespace, decision.batch)
            )
        target = decision.replicas
        if deployed == target:
            memo.scaled_to = memo.scaled_from = None
        elif deployed is not None and (memo.scaled_to, memo.scaled_from) != (target, deployed):
            # With an external owner (an HPA, KEDA, kubectl scale), the writer rereads its count
            # before it writes: a tick that read the service before the owner's last write never
            # carries the older count back.
            write = (
                kube_write(kube.scale_to_owner, self.name, self.namespace)
                if external
                else kube_write(kube.scale, self.name, self.namespace, target)
            )
            memo.writer.submit("replicas", write)
            memo.scaled_to, memo.scaled_from = target, deployed
        # vLLM pods have no admin API: their batch is fixed (`fixed_batch`).
        todo = [] if engine is not None else pods_to_push(memo, pods, decision.batch)
        if todo and self.wok.http is not None:
            # Latest wins: a newer batch replaces one not pushed yet.
            memo.writer.submit("pods", lambda: self.push(todo, decision.batch))

    async def push(self, pods: list[PodView], batch: int) -> None:
        """The batch size to every pod in `pods`; a pod that misses it is retried next tick."""
        memo, http = self.memo, self.wok.http
        if http is None or http.is_closed:
            return  # the operator is stopping (its cleanup closed the client): nothing to retry
        if memo.admin_token is None:
            memo.admin_token = await kube_call(self.wok.kube.admin_token, self.name, self.namespace)
        results = await push_batch_size(http, [p.ip for p in pods if p.ip], memo.admin_token, batch)
        for pod in pods:
            outcome = results.get(pod.ip or "")
            if isinstance(outcome, int):
                memo.applied[pod.uid] = batch
                if outcome != batch:
                    self.logger.info(
                        "pod %s clamped batch %d to its capacity %d", pod.name, batch, outcome
                    )
            else:
                if "401" in outcome:  # a token refused (the Secret made anew?) is read again
                    memo.admin_token = None
                self.logger.warning(
                    "pod %s missed batch %d (%s); retry next tick", pod.name, batch, outcome
                )
                kopf.warn(self.body, reason="BatchPushFailed", message=f"pod {pod.name}: {outcome}")


def pods_to_push(memo: LoopMemo, pods: list[PodView], batch: int) -> list[PodView]:
    """The ready pods that have not confirmed `batch` (and forget the pods that are gone)."""
    live = {pod.uid for pod in pods}
    memo.applied = {uid: b for uid, b in memo.applied.items() if uid in live}
    return [p for p in pods if p.ready and p.ip and memo.applied.get(p.uid) != batch]


async def kube_call(call: Callable[..., T], *args: Any) -> T:
    """A blocking Kubernetes call of a control loop, in a thread, timed by call: how long the
    apiserver takes to answer each kind of write."""
    with metrics.KUBE_CALL_SECONDS.labels(call=call.__name__).time():
        return await asyncio.to_thread(call, *args)


def kube_write(call: Callable[..., Any], *args: Any) -> Callable[[], Awaitable[None]]:
    """`call(*args)` as a write for the service's writer, sent when its turn comes."""

    async def write() -> None:
        await kube_call(call, *args)

    return write


def export_service_metrics(
    key: tuple[str, str], spec: InferenceServiceSpec, result: TickResult
) -> None:
    obs, decision = result.observation, result.decision
    metrics.export_service(
        key,
        slos={
            "ttft": (spec.slo.ttft_p99_seconds, obs.p99_ttft_seconds, obs.budget_p99_ttft_seconds),
            "tpot": (spec.slo.tpot_p99_seconds, obs.p99_tpot_seconds, obs.budget_p99_tpot_seconds),
            "e2e": (spec.slo.e2e_p99_seconds, obs.p99_seconds, obs.budget_p99_seconds),
        },
        batch=decision.batch,
        replicas=decision.replicas,
    )
