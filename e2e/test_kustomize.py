"""The kustomize base (deploy/kustomize): the chart rendered, never a second copy that drifts;
`kubectl kustomize` builds it, and an overlay of it (another namespace, no operator pods) applies
to the real apiserver with every reference following the namespace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from operator_harness import get_json, kubectl

from wok_cluster import kustomize_base
from wok_cluster.kubeapi import wait_established

pytestmark = [pytest.mark.e2e]

BASE = kustomize_base.BASE


def build(kc: Path, directory: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(kubectl(kc, "kustomize", str(directory))) if doc]


def test_the_base_is_the_chart_rendered(wok_binaries):
    assert kustomize_base.RENDERED.read_text() == kustomize_base.render(wok_binaries["helm"]), (
        "deploy/kustomize/wok.yaml differs from the chart: run `make kustomize`"
    )


def test_an_overlay_of_the_base_applies_to_the_cluster(
    wok_cluster, wok_apiserver, wok_namespace, tmp_path
):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    base = build(kc, BASE)
    kinds = sorted(d["kind"] for d in base)
    assert kinds == sorted(
        [
            "Namespace",
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
    assert {d["metadata"].get("namespace", "wok-system") for d in base} == {"wok-system"}
    # A user's overlay: its own namespace, the operator scaled to zero (its pods are not the
    # subject here: e2e/test_images_cluster.py runs them).
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    patch = {"op": "replace", "path": "/spec/replicas", "value": 0}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "resources": [os.path.relpath(BASE, overlay)],
        "patches": [
            {"target": {"kind": "Deployment", "name": "wok"}, "patch": yaml.safe_dump([patch])}
        ],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    built = build(kc, overlay)
    [namespace] = [d for d in built if d["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == ns
    docs = [d for d in built if d["kind"] != "Namespace"]  # the test's namespace exists
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "wok", "namespace": ns}]
    # The base's namespace enforces the restricted Pod Security level: the operator's pods meet
    # it (the apiserver warns about a Deployment whose pods would not).
    labels = [f"{key}={value}" for key, value in namespace["metadata"]["labels"].items()]
    kubectl(kc, "label", "--overwrite", "namespace", ns, *labels)
    stdin = yaml.safe_dump_all(docs)
    try:
        flags = ["--server-side", "--force-conflicts"]
        applied = kubectl(kc, "apply", *flags, "-f", "-", stdin=stdin, check=False)
        assert "serverside-applied" in applied and "PodSecurity" not in applied, applied
        with wok_apiserver.api() as api:
            wait_established(api, ["inferenceservices.wok.dev"], timeout=30)
        deployment = get_json(kc, "deployment", "wok", "-n", ns)
        assert deployment["spec"]["replicas"] == 0
        assert get_json(kc, "pdb", "wok", "-n", ns)["spec"]["maxUnavailable"] == 1
        lease_role = get_json(kc, "role", "wok-leader-election", "-n", ns)
        assert lease_role["rules"][1]["resourceNames"] == ["wok-operator"]
    finally:
        # Everything but the CRD, which the cluster's other modules use.
        rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
        kubectl(kc, "delete", "--ignore-not-found", "-f", "-", stdin=yaml.safe_dump_all(rest))
