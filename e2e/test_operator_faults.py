"""Restarts and faults: a kill -9 mid-reconcile loses nothing and duplicates nothing, a restarted
operator continues from status, and a Prometheus outage holds the loop until metrics return.
(Two replicas: test_operator_ha.py.)"""

from __future__ import annotations

import signal
import time

import pytest
from operator_harness import (
    NO_PROMETHEUS,
    OperatorProcess,
    condition,
    get_json,
    install_crds,
    kubectl,
    reconciled,
    service,
    wait_for,
)

pytestmark = pytest.mark.e2e


def test_kill_9_mid_reconcile_then_a_new_operator_converges(wok_cluster, wok_namespace, tmp_path):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    install_crds(kc)
    first = OperatorProcess(
        kc, ns, NO_PROMETHEUS, tmp_path / "first.log", run_marker=str(wok_cluster.run_dir)
    )
    first.wait_live()
    names = [f"svc-{i}" for i in range(4)]
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin="---\n".join(service(n) for n in names))
    wait_for(lambda: get_json(kc, "deployment", "svc-0-runtime", "-n", ns), "first deployment")
    first.kill9()

    # A previous decision in status (batch 10, not the initial 4) must survive the restart.
    kubectl(
        kc,
        "patch",
        "wis",
        "svc-0",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"batchSize": 10}}',
    )

    second = OperatorProcess(
        kc, ns, NO_PROMETHEUS, tmp_path / "second.log", run_marker=str(wok_cluster.run_dir)
    )
    try:
        second.wait_live()
        for name in names:
            wait_for(lambda n=name: reconciled(kc, ns, n), f"{name} reconciled", 60)
        for kind in ("deployments", "services", "secrets", "configmaps"):
            items = get_json(kc, kind, "-n", ns, "-l", "app.kubernetes.io/managed-by=wok-operator")
            per_service = [i["metadata"]["labels"]["wok.dev/service"] for i in items["items"]]
            assert sorted(per_service) == sorted(names), f"{kind}: {per_service}"
        # Let the restarted loop tick a few times: it continues from status, no reset to 4.
        time.sleep(3)
        wis = get_json(kc, "wis", "svc-0", "-n", ns)
        assert wis["status"]["batchSize"] == 10
        configmap = get_json(kc, "configmap", "svc-0-batching", "-n", ns)
        assert configmap["data"]["maxBatchSize"] == "10"
    finally:
        kubectl(kc, "delete", "wis", "--all", "-n", ns, "--wait=true")
        assert second.stop() == 0, second.log_tail()


def test_prometheus_outage_holds_then_resumes(wok_cluster, wok_namespace, tmp_path):
    from wok_cluster.prometheus import Prometheus

    kc, ns = wok_cluster.kubeconfig, wok_namespace
    install_crds(kc)
    # A Prometheus of this test's own, so stopping it disturbs no other test.
    prometheus = Prometheus(wok_cluster.control_plane, tmp_path / "prometheus").start()
    operator = OperatorProcess(
        kc, ns, prometheus.url, tmp_path / "operator.log", run_marker=str(wok_cluster.run_dir)
    )
    try:
        operator.wait_live()
        kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=service("watched"))

        def metrics_unavailable() -> str | None:
            wis = get_json(kc, "wis", "watched", "-n", ns)
            return (condition(wis, "MetricsUnavailable") or {}).get("status")

        wait_for(lambda: metrics_unavailable() == "False", "metrics flowing", 120)
        before = get_json(kc, "wis", "watched", "-n", ns)["status"]

        prometheus.stop()
        wait_for(lambda: metrics_unavailable() == "True", "MetricsUnavailable=True", 30)
        held = get_json(kc, "wis", "watched", "-n", ns)["status"]
        assert held["lastDecision"]["reason"].startswith("holding")
        assert (held["batchSize"], held["replicas"]) == (before["batchSize"], before["replicas"])
        message = condition(get_json(kc, "wis", "watched", "-n", ns), "MetricsUnavailable")
        # refused once it is gone; 503 while it shuts down (the round that saw it first may fall
        # in that second on a loaded machine): either way the message names why
        reasons = ("Connection", "refused", "503")
        assert any(reason in message["message"] for reason in reasons), message["message"]

        prometheus.start()
        wait_for(lambda: metrics_unavailable() == "False", "metrics flowing again", 60)
    finally:
        kubectl(kc, "delete", "wis", "--all", "-n", ns, "--wait=true")
        assert operator.stop() == 0, operator.log_tail()
        prometheus.stop()


def test_an_operator_that_crashes_in_native_code_leaves_its_threads_in_the_log(
    wok_cluster, wok_namespace, tmp_path
):
    """An abort (SIGABRT, as a failing C library raises it) leaves every thread's Python stack
    in the log, not only an exit status of -6."""
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    install_crds(kc)
    operator = OperatorProcess(
        kc, ns, NO_PROMETHEUS, tmp_path / "operator.log", run_marker=str(wok_cluster.run_dir)
    )
    operator.wait_live()
    operator.popen.send_signal(signal.SIGABRT)
    assert operator.popen.wait(30) == -signal.SIGABRT
    log = operator.log.read_text(errors="replace")
    assert "Fatal Python error: Aborted" in log
    assert "Current thread" in log or "Thread 0x" in log, log[-2000:]
