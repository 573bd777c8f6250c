"""Status as the law's checkpoint, against a real kube-apiserver: a steady service's ticks write
status once, not once a tick, though the decision's inputs move at every tick; the law goes on
from the state it holds while the body it is handed still shows the status of before; and an
apiserver that answers seconds late delays no tick, while the checkpoint still lands."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import config as kube_config
from operator_harness import install_crds, kubectl, stored_deployment
from prometheus_client import REGISTRY
from slow_proxy import SlowProxy

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
    # A round has a vector for each of its queries, empty where no series answered: these say
    # it read the SLO and budget windows.
    vectors |= {"p99:60": {}, "p995:3600": {}}
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


def steady_tick(kc, ns: str, kube: Kube, memo: LoopMemo) -> ServiceTick:
    body = yaml.safe_load(kubectl(kc, "get", "wis", NAME, "-n", ns, "-o=yaml"))
    hub = SignalsHub(windows={60}, budget_windows={3600}, answered={URL: steady_round(ns)})
    return ServiceTick(
        Shared(kube=kube, config=OperatorConfig(), hub=hub),
        memo,
        NAME,
        ns,
        body,  # the body of before the first write, at every tick: a watch that lags
        logging.getLogger("test"),  # type: ignore[arg-type]
    )


def test_a_steady_services_ticks_write_status_once(steady_service):
    kc, ns, kube = steady_service
    memo = LoopMemo()
    tick = steady_tick(kc, ns, kube, memo)

    async def ticks() -> list[str]:
        memo.writer.start()
        versions = []
        for _ in range(TICKS):
            await tick.run(PODS, deployed=2)
            assert await memo.writer.flush(timeout=10.0)
            versions.append(await asyncio.to_thread(resource_version, kc, ns))
            assert memo.state is not None
            await asyncio.sleep(0.05)  # the law's clock is time.time(): let it move
        await memo.writer.close(timeout=1.0)
        return versions

    versions = asyncio.run(ticks())
    assert len(set(versions)) == 1, f"status written at {len(set(versions))} of {TICKS} ticks"
    written = yaml.safe_load(kubectl(kc, "get", "wis", NAME, "-n", ns, "-o=yaml"))["status"]
    assert written["lastDecision"]["inputs"], "the first tick wrote its decision"
    assert written["batchSize"] == memo.state.batch
    # The first heartbeat comes at the service's own phase of the period, not with every other.
    assert memo.last_write_at is not None
    assert time.monotonic() - memo.last_write_at >= phase((ns, NAME), STATUS_HEARTBEAT_S / 2)


DELAY_S = 1.5  # per chunk a client sends: a fresh TLS connection waits it three times


def lag_count() -> float:
    sample = "wok_operator_write_lag_seconds_count"
    return REGISTRY.get_sample_value(sample, {"kind": "status"}) or 0.0


def kubeconfig_through_a_proxy(kubeconfig: Path, to: Path, delay_s: float) -> SlowProxy:
    """A SlowProxy to the apiserver, and at `to` the kubeconfig whose server it is (the
    apiserver's certificate names 127.0.0.1, so TLS verifies as before)."""
    config = yaml.safe_load(kubeconfig.read_text())
    (cluster,) = config["clusters"]
    apiserver = urlsplit(cluster["cluster"]["server"])
    proxy = SlowProxy((apiserver.hostname or "", apiserver.port or 443), delay_s)
    cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    to.write_text(yaml.safe_dump(config))
    return proxy


def test_a_slow_apiserver_delays_no_tick_and_the_checkpoint_lands(steady_service, tmp_path):
    kc, ns, _ = steady_service
    kubectl(kc, "scale", "deployment", f"{NAME}-runtime", "-n", ns, "--replicas=1")
    before = resource_version(kc, ns)
    slow_kc = tmp_path / "slow.kubeconfig"
    with kubeconfig_through_a_proxy(Path(kc), slow_kc, DELAY_S):
        api_client = kube_config.new_client_from_config(str(slow_kc))
        slow = Kube.from_api_client(api_client)
        memo = LoopMemo()
        tick = steady_tick(kc, ns, slow, memo)

        async def ticks() -> tuple[list[float], str, float]:
            memo.writer.start()
            took = []
            for _ in range(3):
                started = time.monotonic()
                await tick.run(PODS, deployed=1)  # the law keeps 2: a scale to write too
                took.append(time.monotonic() - started)
            in_flight = await asyncio.to_thread(resource_version, kc, ns)
            lags = lag_count()
            assert await memo.writer.flush(timeout=60.0), f"still pending: {memo.writer.pending}"
            await memo.writer.close(timeout=1.0)
            return took, in_flight, lags

        lags_before = lag_count()
        took, in_flight, lags_in_flight = asyncio.run(ticks())
    api_client.close()
    assert max(took) < DELAY_S / 3, f"ticks took {took} behind a {DELAY_S} s apiserver"
    assert in_flight == before and lags_in_flight == lags_before, "no write had landed yet"
    written = yaml.safe_load(kubectl(kc, "get", "wis", NAME, "-n", ns, "-o=yaml"))["status"]
    assert written["lastDecision"]["inputs"], "the checkpoint landed"
    assert written["batchSize"] == memo.state.batch and written["replicas"] == memo.state.replicas
    assert lag_count() == lags_before + 1  # one write: the ticks after the first had no news
    deployed = kubectl(kc, "get", "deployment", f"{NAME}-runtime", "-n", ns,
                       "-o=jsonpath={.spec.replicas}")  # fmt: skip
    assert deployed == "2"
