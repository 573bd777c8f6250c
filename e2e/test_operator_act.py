"""The tick's act step against a real kube-apiserver: beside an external replica owner (an HPA,
KEDA, kubectl scale) a tick that read the service before the owner's last write must not carry
the older count to the Deployment."""

from __future__ import annotations

import asyncio
import logging

import pytest
import yaml
from kubernetes import config as kube_config
from operator_harness import install_crds, kubectl, stored_deployment

from wok_operator.actuate import Kube
from wok_operator.control import Decision, LoopState
from wok_operator.handlers import LoopMemo, OperatorConfig, ServiceTick, Shared
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


def act(kube: Kube, ns: str, decision: Decision, *, external: bool) -> None:
    tick = ServiceTick(
        Shared(kube=kube, config=OperatorConfig()),
        LoopMemo(),
        NAME,
        ns,
        {},  # type: ignore[arg-type]
        logging.getLogger("test"),  # type: ignore[arg-type]
    )
    asyncio.run(tick.act(decision, [], heartbeat=True, external=external))


def test_a_stale_tick_beside_an_external_owner_writes_the_owners_latest_count(owned_service):
    kc, ns, kube = owned_service
    assert kube.service_replicas(NAME, ns) == 3
    act(kube, ns, stale_decision(2), external=True)
    assert deployment_replicas(kc, ns) == 3
    # The owner scales down meanwhile: the same stale tick carries the owner's new count.
    kubectl(kc, "scale", "wis", NAME, "-n", ns, "--replicas=1")
    act(kube, ns, stale_decision(2), external=True)
    assert deployment_replicas(kc, ns) == 1


def test_without_an_external_owner_the_laws_count_wins(owned_service):
    kc, ns, kube = owned_service
    act(kube, ns, stale_decision(2), external=False)
    assert deployment_replicas(kc, ns) == 2
