"""The Helm chart on the real apiserver: it renders and applies, and its RBAC is enough for two
operator replicas to elect a leader and run a service end to end, and no more than that."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml
from operator_harness import (
    NO_PROMETHEUS,
    ROOT,
    OperatorProcess,
    access_denials,
    get_json,
    kubectl,
    reconciled,
    service,
    wait_for,
)

from wok_cluster.kubeapi import wait_established
from wok_operator.loop import STATUS_HEARTBEAT_S

pytestmark = [pytest.mark.e2e, pytest.mark.slow(minutes=1.5)]  # started first

CHART = ROOT / "charts" / "wok"
RELEASE = "wok"  # the chart's full name is then "wok": the ServiceAccount and the roles
LEASE = ["--lease-duration=6", "--renew-deadline=4", "--retry-period=1"]


def helm_template(helm: str, namespace: str, *sets: str) -> list[dict]:
    args = [helm, "template", RELEASE, str(CHART), f"--namespace={namespace}"]
    args += ["--kube-version=1.34.4", "--include-crds", *(f"--set={s}" for s in sets)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def apply(kc: Path, docs: list[dict], *flags: str) -> str:
    return kubectl(kc, "apply", "--server-side", *flags, "-f", "-", stdin=yaml.safe_dump_all(docs))


def can_i(kc: Path, sa: str, verb: str, resource: str, namespace: str) -> bool:
    out = kubectl(kc, "auth", "can-i", verb, resource, "-n", namespace, f"--as={sa}", check=False)
    return out.strip().splitlines()[0] == "yes"


def test_lint_and_render(wok_binaries):
    helm = wok_binaries["helm"]
    lint = subprocess.run(
        [helm, "lint", str(CHART), "--kube-version=1.34.4"], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = helm_template(helm, "wok-system")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
        ]
    )
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 2 and "--all-namespaces" in args
    assert "--standalone" not in args and "--lease-name=wok-operator" in args
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Monitoring objects on request; the PrometheusRule holds the promtool-tested rules as they are.
    monitored = ["alerts.enabled=true", "metrics.podMonitor.enabled=true"]
    docs = helm_template(helm, "wok-system", *monitored)
    rules = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PrometheusRule"}
    alerts = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    recording = yaml.safe_load((CHART / "files" / "recording_rules.yaml").read_text())
    # The alerts come with the recording rules they read, in a PrometheusRule of their own.
    assert rules == {"wok": alerts, "wok-recording": recording}
    assert any(d["kind"] == "PodMonitor" for d in docs)
    # The recording rules alone, on request (the operator reads them without any alert).
    docs = helm_template(helm, "wok-system", "recordingRules.enabled=true")
    rules = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PrometheusRule"}
    assert rules == {"wok-recording": recording}
    # A single acting replica cannot be configured away: two without an election do not render.
    with pytest.raises(AssertionError, match=r"needs leaderElection\.enabled"):
        helm_template(helm, "wok-system", "leaderElection.enabled=false")


@pytest.mark.parametrize(
    ("sets", "namespace", "labels"),
    [
        (["dashboard.enabled=true"], "wok-system", {"grafana_dashboard": "1"}),
        (
            ["dashboard.enabled=true", "dashboard.namespace=monitoring", "dashboard.labels.team=a"],
            "monitoring",
            {"grafana_dashboard": "1", "team": "a"},
        ),
    ],
)
def test_the_chart_ships_the_dashboard_unchanged(wok_binaries, sets, namespace, labels):
    docs = helm_template(wok_binaries["helm"], "wok-system", *sets)
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config_map["metadata"]["namespace"] == namespace
    assert labels.items() <= config_map["metadata"]["labels"].items()
    assert config_map["data"]["wok.json"] == (CHART / "files" / "dashboard.json").read_text()


@pytest.mark.timeout(480)  # two status heartbeats, each 60 s, on a loaded machine
def test_chart_rbac_runs_two_replicas_end_to_end_and_grants_no_more(
    wok_cluster, wok_apiserver, wok_binaries, wok_namespace, tmp_path
):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    system = f"{ns}-sys"
    kubectl(kc, "create", "namespace", system)
    helm = wok_binaries["helm"]
    # The cluster-wide rendering passes the apiserver's validation; the namespaced one is installed
    # as users do (no operator pods: the operator runs below as processes, as its ServiceAccount).
    apply(kc, helm_template(helm, system, "replicas=0"), "--dry-run=server")
    install = [helm, f"--kubeconfig={kc}", "install", RELEASE, str(CHART), f"--namespace={system}"]
    install += ["--set=replicas=0", f"--set=watchNamespaces={{{ns}}}", "--wait", "--timeout=60s"]
    installed = subprocess.run(install, capture_output=True, text=True, timeout=120, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    with wok_apiserver.api() as api:
        wait_established(api, ["inferenceservices.wok.dev"], timeout=30)
    sa = f"system:serviceaccount:{system}:{RELEASE}"
    sa_kubeconfig = wok_apiserver.service_account_kubeconfig(system, RELEASE)

    # No more than it needs.
    assert can_i(kc, sa, "patch", "inferenceservices.wok.dev/status", ns)
    assert can_i(kc, sa, "update", "leases/wok-operator", system)
    for verb, resource, where in [
        ("list", "secrets", ns),  # the admin token is read by name, never listed
        ("delete", "deployments", ns),  # garbage collection deletes, the operator does not
        ("create", "pods", ns),
        ("get", "secrets", "default"),  # only the watched namespace
        ("create", "deployments", system),
        ("update", "leases/someone-else", system),
        ("update", "leases/wok-operator", ns),
    ]:
        assert not can_i(kc, sa, verb, resource, where), f"may {verb} {resource} in {where}"

    def replica(log: str) -> OperatorProcess:
        return OperatorProcess(
            sa_kubeconfig,
            ns,
            NO_PROMETHEUS,
            tmp_path / log,
            standalone=False,
            extra_args=LEASE,
            env={"POD_NAMESPACE": system},  # as the chart's Deployment sets it
            run_marker=str(wok_cluster.run_dir),
        )

    first = replica("first.log")
    second = replica("second.log")
    try:
        first.wait_live()
        second.wait_live()
        lease = wait_for(lambda: get_json(kc, "lease", "wok-operator", "-n", system), "lease")
        assert lease["spec"]["holderIdentity"]
        kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=service("chart"))
        wait_for(lambda: reconciled(kc, ns, "chart"), "reconciled as the ServiceAccount", 60)
        wait_for(
            lambda: (
                (get_json(kc, "deployment", "chart-runtime", "-n", ns) or {})
                .get("status", {})
                .get("readyReplicas")
            ),
            "the runtime pod is ready",
            120,
        )
        # A Deployment scaled by hand: the loop sees it through its watch of the Deployments (the
        # chart's list/watch) and scales it back to the law's through deployments/scale.
        kubectl(kc, "scale", "deployment", "chart-runtime", "-n", ns, "--replicas=2")
        wait_for(
            lambda: get_json(kc, "deployment", "chart-runtime", "-n", ns)["spec"]["replicas"] == 1,
            "scaled back through deployments/scale",
            2 * STATUS_HEARTBEAT_S + 30,
        )
        time.sleep(3)  # ticks: status, events, the admin token read, batch pushes
        logs = first.log.read_text() + second.log.read_text()
        assert "reconciled: batch" in logs
        assert not access_denials(logs), logs[-4000:]
        # Events are posted as the ServiceAccount: a model that cannot fit is reported on it.
        huge = {"model": {"source": "builtin:smollm2-135m"}, "runtime": {"gpuMemory": "64Mi"}}
        doc = {"apiVersion": "wok.dev/v1alpha1", "kind": "InferenceService"}
        doc |= {"metadata": {"name": "huge"}, "spec": huge}
        kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(doc))
        wait_for(
            lambda: (
                "InvalidSpec"
                in kubectl(
                    kc, "get", "events", "-n", ns, "--field-selector=involvedObject.name=huge"
                )
            ),
            "an InvalidSpec event",
            60,
        )
        logs = first.log.read_text() + second.log.read_text()
        assert not access_denials(logs), logs[-4000:]
    finally:
        kubectl(kc, "delete", "wis", "--all", "-n", ns, "--wait=true")
        for process in (first, second):
            assert process.stop() == 0, process.log_tail()
        uninstall = [helm, f"--kubeconfig={kc}", "uninstall", RELEASE, f"--namespace={system}"]
        subprocess.run([*uninstall, "--wait"], capture_output=True, timeout=120, check=True)
        assert get_json(kc, "clusterrole", f"{RELEASE}-cluster") is None
        kubectl(kc, "delete", "namespace", system, "--wait=false")
