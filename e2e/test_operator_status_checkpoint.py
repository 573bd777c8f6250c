"""Status as the law's checkpoint, against a real kube-apiserver: a steady service's ticks write
status once, not once a tick, though the decision's inputs move at every tick; and the law goes
on from the state it holds while the body it is handed still shows the status of before."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import yaml
from kubernetes import config as kube_config
from operator_harness import install_crds, kubectl, stored_deployment

from wok_contracts.signals import PodView
from wok_operator.actuate import Kube
from wok_operator.handlers import LoopMemo, OperatorConfig, ServiceTick, Shared
from wok_operator.loop import STATUS_HEARTBEAT_S, phase
from wok_operator.signals import Round, SignalsHub

pytestmark = pytest.mark.e2e

NAME = "steady"
URL = "http://prometheus.invalid"
TICKS = 12
PODS = [PodView(f"p{i}", f"uid{i}", None, ready=True, terminating=False) for i in (1, 2)]


def steady_round(ns: str) -> Round:
    """A round that stays fresh: two pods well within the SLO."""
    key = (ns, NAME)
    values = {
        "waiting": 0.0,
        "running": 4.0,
        "kv_usage": 0.25,
        "reporting": 2.0,
        "p99_ttft:60": 0.4,
        "p99_tpot:60": 0.015,
        "finished_rate:60": 10.0,
        "rejected_rate:60": 0.0,
    }
    vectors = {name: {key: value} for name, value in values.items()}
    return Round(fetched_at=time.monotonic() + 3600.0, vectors=vectors)


@pytest.fixture
def steady_service(wok_kubeconfig, wok_namespace):
    kc, ns = wok_kubeconfig, wok_namespace
    install_crds(kc)
    service = {
        "apiVersion": "wok.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "model": {"source": "builtin:tiny"},
            "scaling": {"minReplicas": 2},
            # at its cap already: a steady service's law holds both knobs
            "batching": {"maxBatchSize": 8, "initialBatchSize": 8},
            "slo": {"ttftP99Seconds": 2.0},
            "metrics": {"prometheusUrl": URL},
        },
    }
    deployment = stored_deployment(NAME, 2)
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump_all([service, deployment]))
    status = {"status": {"batchSize": 8, "replicas": 2}}
    kubectl(kc, "patch", "wis", NAME, "-n", ns, "--subresource=status", "--type=merge",
            "-p", yaml.safe_dump(status))  # fmt: skip
    api_client = kube_config.new_client_from_config(str(kc))
    try:
        yield kc, ns, Kube.from_api_client(api_client)
    finally:
        api_client.close()


def resource_version(kc, ns: str) -> str:
    return kubectl(kc, "get", "wis", NAME, "-n", ns, "-o=jsonpath={.metadata.resourceVersion}")


def test_a_steady_services_ticks_write_status_once(steady_service):
    kc, ns, kube = steady_service
    body = yaml.safe_load(kubectl(kc, "get", "wis", NAME, "-n", ns, "-o=yaml"))
    hub = SignalsHub(windows={60}, budget_windows={3600}, rounds={URL: steady_round(ns)})
    memo = LoopMemo()
    tick = ServiceTick(
        Shared(kube=kube, config=OperatorConfig(), hub=hub),
        memo,
        NAME,
        ns,
        body,  # the body of before the first write, at every tick: a watch that lags
        logging.getLogger("test"),  # type: ignore[arg-type]
    )
    versions = []
    for _ in range(TICKS):
        asyncio.run(tick.run(PODS))
        versions.append(resource_version(kc, ns))
        assert memo.state is not None
        time.sleep(0.05)  # the law's clock is time.time(): let it move
    assert len(set(versions)) == 1, f"status written at {len(set(versions))} of {TICKS} ticks"
    written = yaml.safe_load(kubectl(kc, "get", "wis", NAME, "-n", ns, "-o=yaml"))["status"]
    assert written["lastDecision"]["inputs"], "the first tick wrote its decision"
    assert written["batchSize"] == memo.state.batch
    # The first heartbeat comes at the service's own phase of the period, not with every other.
    assert memo.last_write_at is not None
    assert time.monotonic() - memo.last_write_at >= phase((ns, NAME), STATUS_HEARTBEAT_S / 2)
