"""The tick's act step against a real kube-apiserver: beside an external replica owner (an HPA,
KEDA, kubectl scale) a tick that read the service before the owner's last write must not carry
the older count to the Deployment; and the running operator sees a Deployment scaled by hand at
its next tick (a watch), not at its next status heartbeat."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import yaml
from kubernetes import config as kube_config
from operator_harness import (
    NO_PROMETHEUS,
    OperatorProcess,
    get_json,
    install_crds,
    kubectl,
    reconciled,
    service,
    stored_deployment,
    wait_for,
)

from wok_operator.actuate import Kube
from wok_operator.control import Decision, LoopState
from wok_operator.handlers import LoopMemo, OperatorConfig, ServiceTick, Shared
from wok_operator.loop import STATUS_HEARTBEAT_S
from wok_operator.resources import runtime_name

pytestmark = pytest.mark.e2e

NAME = "owned"


def stale_decision(replicas: int) -> Decision:
    """What a tick decides from a body read before the owner's write: the old pinned count."""
    return Decision(
        batch_before=4,
        batch=4,
        replicas_before=replicas,
        replicas=replicas,
        reason="hold",
        state=LoopState(batch=4, replicas=replicas),
    )


def deployment_replicas(kc, ns: str) -> int:
    return int(
        kubectl(
            kc, "get", "deployment", runtime_name(NAME), "-n", ns, "-o=jsonpath={.spec.replicas}"
        )
    )


@pytest.fixture
def owned_service(wok_kubeconfig, wok_namespace):
    """An InferenceService its owner has scaled to 3, and its Deployment already carrying 3 (no
    controllers run here: the objects are only stored)."""
    kc, ns = wok_kubeconfig, wok_namespace
    install_crds(kc)
    service = {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "model": {"source": "builtin:tiny"},
            "replicas": 3,
            "scaling": {"replicas": "external"},
        },
    }
    deployment = stored_deployment(NAME, 3)
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump_all([service, deployment]))
    api_client = kube_config.new_client_from_config(str(kc))
    try:
        yield kc, ns, Kube.from_api_client(api_client)
    finally:
        api_client.close()


def act(kube: Kube, ns: str, decision: Decision, *, external: bool, deployed: int) -> None:
    """One tick's act step, `deployed` being the Deployment's count as the watch shows it, and
    its writes until they land."""

    async def act_and_write() -> None:
        memo = LoopMemo()
        memo.writer.start()
        tick = ServiceTick(
            Shared(kube=kube, config=OperatorConfig()),
            memo,
            NAME,
            ns,
            {},  # type: ignore[arg-type]
            logging.getLogger("test"),  # type: ignore[arg-type]
        )
        tick.act(decision, [], deployed=deployed, external=external)
        assert await memo.writer.flush(timeout=30.0)
        await memo.writer.close(timeout=1.0)

    asyncio.run(act_and_write())


def test_a_stale_tick_beside_an_external_owner_writes_the_owners_latest_count(owned_service):
    kc, ns, kube = owned_service
    assert kube.service_replicas(NAME, ns) == 3
    act(kube, ns, stale_decision(2), external=True, deployed=3)
    assert deployment_replicas(kc, ns) == 3
    # The owner scales down meanwhile: the same stale tick carries the owner's new count.
    kubectl(kc, "scale", "wis", NAME, "-n", ns, "--replicas=1")
    act(kube, ns, stale_decision(2), external=True, deployed=3)
    assert deployment_replicas(kc, ns) == 1


def test_without_an_external_owner_the_laws_count_wins(owned_service):
    kc, ns, kube = owned_service
    act(kube, ns, stale_decision(2), external=False, deployed=3)
    assert deployment_replicas(kc, ns) == 2


def test_a_deployment_scaled_by_hand_is_set_back_at_the_next_tick(
    wok_apiserver, wok_kubeconfig, wok_namespace, tmp_path
):
    kc, ns, name = wok_kubeconfig, wok_namespace, "by-hand"
    install_crds(kc)
    operator = OperatorProcess(
        kc, ns, NO_PROMETHEUS, tmp_path / "operator.log", run_marker=str(wok_apiserver.run_dir)
    )
    try:
        operator.wait_live()
        kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=service(name))  # 1 replica, 1 s ticks
        wait_for(lambda: reconciled(kc, ns, name), "reconciled", 60)
        # The loop runs (its first status write) and has seen the Deployment at 1.
        wait_for(lambda: (get_json(kc, "wis", name, "-n", ns) or {})["status"].get("lastDecision"),
                 "the first tick", 60)  # fmt: skip
        kubectl(kc, "scale", "deployment", runtime_name(name), "-n", ns, "--replicas=2")
        scaled = time.monotonic()
        # Well inside a status heartbeat (the next is 30-60 s after the first write).
        wait_for(lambda: replicas_of(kc, ns, name) == 1, "the law's count back", 10)
        assert time.monotonic() - scaled < STATUS_HEARTBEAT_S / 6
    finally:
        kubectl(kc, "delete", "wis", "--all", "-n", ns, "--wait=true")
        assert operator.stop() == 0, operator.log_tail()


def replicas_of(kc, ns: str, name: str) -> int:
    return int((get_json(kc, "deployment", runtime_name(name), "-n", ns) or {})["spec"]["replicas"])
