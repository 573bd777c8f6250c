"""The Helm chart on the real apiserver: it renders and applies, its values schema refuses bad
values, its RBAC is enough for two operator replicas to elect a leader and run a service end to
end (and no more than that), and `helm upgrade` brings a new CRD field to the apiserver."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from operator_harness import (
    CRD,
    NO_PROMETHEUS,
    ROOT,
    OperatorProcess,
    access_denials,
    adopt_crds,
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


def helm_template(helm: str, namespace: str, *sets: str, chart: Path = CHART) -> list[dict]:
    args = [helm, "template", RELEASE, str(chart), f"--namespace={namespace}"]
    args += ["--kube-version=1.34.4", "--include-crds", *(f"--set={s}" for s in sets)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def run_helm(helm: str, kc: Path, *args: str) -> str:
    """`helm` against the cluster; its output, or the test fails with it."""
    result = subprocess.run(
        [helm, f"--kubeconfig={kc}", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


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
            "PodDisruptionBudget",
        ]
    )
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 2 and "--all-namespaces" in args
    assert "--standalone" not in args and "--lease-name=wok-operator" in args
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The CRD is a template (Helm upgrades it), the generated file as it is, kept on uninstall.
    [crd] = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    generated = yaml.safe_load(CRD.read_text())
    meta = crd.pop("metadata")
    assert crd == {k: v for k, v in generated.items() if k != "metadata"}
    assert meta["name"] == generated["metadata"]["name"]
    assert meta["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE
    kinds = {d["kind"] for d in helm_template(helm, "wok-system", "crds.install=false")}
    assert "CustomResourceDefinition" not in kinds
    unkept = helm_template(helm, "wok-system", "crds.keep=false")
    [crd] = [d for d in unkept if d["kind"] == "CustomResourceDefinition"]
    assert "annotations" not in crd["metadata"]
    # A drain takes one operator replica at a time; a single replica has no budget to keep.
    [budget] = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    single = helm_template(helm, "wok-system", "replicas=1")
    assert not any(d["kind"] == "PodDisruptionBudget" for d in single)
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
    ("value", "refusal"),
    [
        ("replicaCount=2", "additional properties 'replicaCount' not allowed"),  # a typo
        ("leaderElection.leaseDuration=15", "additional properties 'leaseDuration' not allowed"),
        ("replicas=-1", "minimum"),
        ("logFormat=yaml", "value must be one of"),
        ("metrics.port=70000", "maximum"),
        ("prometheusUrl=prometheus:9090", "does not match pattern"),
        ("watchNamespaces={Team-A}", "does not match pattern"),
        ("crds.install=maybe", "got string, want boolean"),
    ],
)
def test_the_values_schema_refuses_bad_values(wok_binaries, value, refusal):
    """values.schema.json: `helm lint` fails on the value, and so does `helm template` (Helm's
    client-side install: the check runs before anything reaches an apiserver; a refused `helm
    upgrade --install` on the cluster is in the CRD upgrade test below)."""
    helm = wok_binaries["helm"]
    lint = [helm, "lint", str(CHART), "--kube-version=1.34.4", f"--set={value}"]
    linted = subprocess.run(lint, capture_output=True, text=True, timeout=60)
    assert linted.returncode != 0 and refusal in linted.stdout + linted.stderr, linted.stdout
    with pytest.raises(AssertionError, match="values don't meet the specifications of the schema"):
        helm_template(helm, "wok-system", value)


def test_notes_say_what_was_installed_and_where_to_look(wok_binaries, wok_cluster):
    helm, kc = wok_binaries["helm"], wok_cluster.kubeconfig
    install = ["install", RELEASE, str(CHART), "--dry-run=server", "--namespace=ops"]
    install += ["--set=watchNamespaces={a,b}", "--set=crds.install=false"]
    notes = run_helm(helm, kc, *install).split("NOTES:", 1)[1]
    assert "release wok in namespace ops" in notes
    assert "watches the namespaces a, b." in notes
    assert "kubectl -n ops logs deployment/wok" in notes
    assert "kubectl apply --server-side -f crds/" in notes  # the CRD is theirs to apply


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
    apply(kc, helm_template(helm, system), "--dry-run=server")
    adopt_crds(kc, RELEASE, system)
    install = [helm, f"--kubeconfig={kc}", "install", RELEASE, str(CHART), f"--namespace={system}"]
    install += ["--set=replicas=0", f"--set=watchNamespaces={{{ns}}}", "--wait", "--timeout=60s"]
    installed = subprocess.run(install, capture_output=True, text=True, timeout=120, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert f"watches the namespaces {ns}." in installed.stdout  # NOTES.txt
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
        # The runtime pods' disruption budget, applied as the ServiceAccount, covers the pod.
        wait_for(
            lambda: (
                (get_json(kc, "pdb", "chart-runtime", "-n", ns) or {})
                .get("status", {})
                .get("expectedPods")
                == 1
            ),
            "the disruption budget counts the runtime pod",
            60,
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
        # crds.keep: the CRD, and so every InferenceService, outlives the release.
        assert get_json(kc, "crd", "inferenceservices.wok.dev") is not None
        kubectl(kc, "delete", "namespace", system, "--wait=false")


def chart_with_a_new_field(tmp_path: Path) -> Path:
    """The chart as a release that adds a field to the CRD's spec would ship it."""
    chart = tmp_path / "wok"
    shutil.copytree(CHART, chart)  # the CRD's symlink copied as the file it points to
    crd_file = chart / "files" / "crds" / CRD.name
    crd = yaml.safe_load(crd_file.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["upgradeProbe"] = {"type": "string", "description": "added by an upgrade"}
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def test_helm_upgrade_brings_a_new_crd_field_to_the_apiserver(
    wok_cluster, wok_apiserver, wok_binaries, wok_namespace, tmp_path
):
    """Helm never upgrades a chart's crds/: an upgrade that adds a field left the old schema in
    place, and the apiserver refused or pruned the new field in every object. The CRD is a
    template of the release, so the upgrade carries the field, and a value the schema refuses
    changes nothing."""
    kc, ns, helm = wok_cluster.kubeconfig, wok_namespace, wok_binaries["helm"]
    release, system = "wok-crd-upgrade", f"{ns}-sys"
    kubectl(kc, "create", "namespace", system)
    upgrade = ["upgrade", "--install", release, f"--namespace={system}", "--set=replicas=0"]
    upgrade += [f"--set=watchNamespaces={{{ns}}}"]
    # An unknown key is refused before anything is installed.
    typo = [helm, f"--kubeconfig={kc}", *upgrade, str(CHART), "--set=replicaCount=1"]
    refused = subprocess.run(typo, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "'replicaCount' not allowed" in refused.stderr
    assert run_helm(helm, kc, "list", f"--namespace={system}", "--short") == ""
    adopt_crds(kc, release, system)
    run_helm(helm, kc, *upgrade, str(CHART))
    with wok_apiserver.api() as api:
        wait_established(api, ["inferenceservices.wok.dev"], timeout=30)
    probe = {"apiVersion": "wok.dev/v1alpha1", "kind": "InferenceService"}
    probe |= {"metadata": {"name": "probe", "namespace": ns}}
    probe |= {"spec": {"model": {"source": "builtin:tiny"}, "upgradeProbe": "kept"}}
    try:
        # The field is unknown to the first chart's CRD: the apiserver refuses it (kubectl's
        # strict validation), or prunes it where a client does not ask for strict.
        unknown = kubectl(kc, "apply", "-f", "-", stdin=yaml.safe_dump(probe), check=False)
        assert 'unknown field "spec.upgradeProbe"' in unknown, unknown
        kubectl(kc, "apply", "--validate=ignore", "-f", "-", stdin=yaml.safe_dump(probe))
        assert "upgradeProbe" not in get_json(kc, "wis", "probe", "-n", ns)["spec"]
        newer = chart_with_a_new_field(tmp_path)
        refused = subprocess.run(
            [helm, f"--kubeconfig={kc}", *upgrade, str(newer), "--set=replicas=-1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode != 0 and "minimum" in refused.stderr, refused.stderr
        run_helm(helm, kc, *upgrade, str(newer))
        crd = get_json(kc, "crd", "inferenceservices.wok.dev")
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert "upgradeProbe" in schema["properties"]["spec"]["properties"]
        kubectl(kc, "apply", "-f", "-", stdin=yaml.safe_dump(probe))
        assert get_json(kc, "wis", "probe", "-n", ns)["spec"]["upgradeProbe"] == "kept"
    finally:
        kubectl(kc, "delete", "wis", "probe", "-n", ns, "--ignore-not-found", "--wait=true")
        # Back to the checkout's CRD for the modules after this one, then gone (the CRD kept).
        run_helm(helm, kc, *upgrade, str(CHART))
        run_helm(helm, kc, "uninstall", release, f"--namespace={system}", "--wait")
        kubectl(kc, "delete", "namespace", system, "--wait=false")
