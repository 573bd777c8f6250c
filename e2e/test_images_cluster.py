"""The emulated cluster running wok's images for real (the backer's container mode): the chart's
operator pod from the operator image, as the chart's ServiceAccount with an in-cluster token,
reconciles an InferenceService into a runtime pod from the runtime image that serves a
completion; a memory limit too small for the runtime is an OOM kill the pod status reports."""

from __future__ import annotations

import subprocess

import httpx
import pytest
import yaml
from operator_harness import (
    NO_PROMETHEUS,
    ROOT,
    access_denials,
    adopt_crds,
    get_json,
    kubectl,
    reconciled,
    service,
    wait_for,
)

from wok_cluster import images
from wok_cluster.netutil import free_port

# serial: image exports take both cores
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(1800)]

CHART = ROOT / "charts" / "wok"
RELEASE = "wok"
IN_CONTAINERS = {"wok.dev/backed": "true", "wok.dev/container": "true"}


@pytest.fixture(scope="module")
def current_images() -> None:
    """Both images current with the checkout (a warm rebuild: `make test` ran `make image`)."""
    try:
        images.build_all(archives=())
    except images.ImageError as error:
        pytest.fail(f"the images cannot be built here: {error}")


def _labels(prefix: str) -> list[str]:
    escaped = {key.replace(".", "\\."): value for key, value in IN_CONTAINERS.items()}
    return [f"--set-string={prefix}.{key}={value}" for key, value in escaped.items()]


def _pod(kc, ns: str, selector: str) -> dict | None:
    pods = (get_json(kc, "pods", "-n", ns, "-l", selector) or {}).get("items", [])
    return pods[0] if pods else None


def _ready(pod: dict | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_chart_operator_and_runtime_run_from_the_images(
    current_images, wok_cluster, wok_binaries, wok_namespace
):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    system = f"{ns}-sys"
    kubectl(kc, "create", "namespace", system)
    helm = wok_binaries["helm"]
    adopt_crds(kc, RELEASE, system)
    install = [helm, f"--kubeconfig={kc}", "install", RELEASE, str(CHART), f"--namespace={system}"]
    # one replica, on host ports that are free (the pods share the host's network here)
    install += ["--set=replicas=1", f"--set=watchNamespaces={{{ns}}}", "--set=logFormat=plain"]
    install += [f"--set=metrics.port={free_port()}", f"--set=healthz.port={free_port()}"]
    install += [f"--set=prometheusUrl={NO_PROMETHEUS}", *_labels("podLabels")]
    install += [*_labels("runtimePodLabels"), "--wait", "--timeout=120s"]
    installed = subprocess.run(install, capture_output=True, text=True, timeout=180, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    try:
        operator = _pod(kc, system, "app.kubernetes.io/name=wok-operator")
        assert operator is not None
        [status] = operator["status"]["containerStatuses"]
        assert status["containerID"].startswith("podman://"), status
        assert status["image"] == images.OPERATOR.tag

        kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=service("boxed"))
        wait_for(lambda: reconciled(kc, ns, "boxed"), "reconciled by the operator's image", 120)
        runtime = wait_for(
            lambda: (
                (pod := _pod(kc, ns, "app.kubernetes.io/instance=boxed")) and _ready(pod) and pod
            ),
            "the runtime pod from the runtime image is ready",
            240,
        )
        [status] = runtime["status"]["containerStatuses"]
        assert status["containerID"].startswith("podman://"), status
        assert status["image"] == images.RUNTIME.tag
        url = f"http://{runtime['status']['podIP']}:8000/v1/completions"
        body = {"prompt": [11, 12, 13], "max_tokens": 6, "ignore_eos": True}
        response = httpx.post(url, json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 6
        # the operator's own log (the backer keeps it per pod): in-cluster, and allowed all it did
        meta = operator["metadata"]
        pod_dir = f"{system}_{meta['name']}_{meta['uid'][:8]}"
        log = (wok_cluster.backer_dir / "pods" / pod_dir / "operator.log").read_text()
        assert "reconciled: batch" in log, log[-3000:]
        assert not access_denials(log), log[-3000:]
    finally:
        kubectl(kc, "delete", "wis", "--all", "-n", ns, "--wait=true", "--timeout=120s")
        uninstall = [helm, f"--kubeconfig={kc}", "uninstall", RELEASE, f"--namespace={system}"]
        subprocess.run([*uninstall, "--wait"], capture_output=True, timeout=180, check=True)
        kubectl(kc, "delete", "namespace", system, "--wait=false")
    wait_for(
        lambda: not images.podman("ps", "--format={{.Names}}").stdout.count(f"wok-{ns}"),
        "the runtime's container gone with its pod",
        120,
    )


def test_a_memory_limit_too_small_for_the_runtime_is_an_oom_kill(
    current_images, wok_cluster, wok_namespace
):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tight", "labels": IN_CONTAINERS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "runtime",
                    "image": images.RUNTIME.tag,
                    "command": ["wok"],
                    "args": ["runtime", "serve", "--model=builtin:tiny", "--host=$(POD_IP)"],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "resources": {"limits": {"memory": "48Mi", "nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    kubectl(kc, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(pod))

    def terminated() -> dict | None:
        status = (get_json(kc, "pod", "tight", "-n", ns) or {}).get("status", {})
        states = [c.get("state", {}) for c in status.get("containerStatuses", [])]
        return states[0].get("terminated") if states else None

    state = wait_for(terminated, "the runtime's container to be killed", 120)
    assert state["reason"] == "OOMKilled" and state["exitCode"] == 137, state
    assert get_json(kc, "pod", "tight", "-n", ns)["status"]["phase"] == "Failed"
