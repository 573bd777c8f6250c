"""The harness's kubeconfigs work with the machine's kubectl, and ServiceAccount identities get
exactly what RBAC grants them: the operator's least-privilege RBAC can be tested for real."""

from __future__ import annotations

import pytest

from wok_cluster.binaries import kubectl
from wok_cluster.kubeapi import KubeApi, KubeError

pytestmark = pytest.mark.integration


def test_kubectl_lists_the_gpu_nodes(wok_cluster):
    result = kubectl(wok_cluster.kubeconfig, "get", "nodes", "-o", "name")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == [f"node/{n}" for n in wok_cluster.node_names]
    gpus = kubectl(
        wok_cluster.kubeconfig,
        "get",
        "node",
        wok_cluster.node_names[0],
        "-o",
        "jsonpath={.status.allocatable.nvidia\\.com/gpu}",
    )
    assert gpus.stdout == "8"


def test_service_account_kubeconfig_is_bound_by_rbac(wok_apiserver, wok_namespace):
    ns = wok_namespace
    with wok_apiserver.api() as admin:
        admin.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "reader"}})
        admin.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
            },
        )
        admin.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
            {
                "metadata": {"name": "reader-reads-pods"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
            },
        )
    kubeconfig = wok_apiserver.service_account_kubeconfig(ns, "reader")
    with KubeApi.from_kubeconfig(kubeconfig) as reader:
        assert reader.get(f"/api/v1/namespaces/{ns}/pods")["items"] == []
        for denied in (
            lambda: reader.get(f"/api/v1/namespaces/{ns}/secrets"),
            lambda: reader.get("/api/v1/namespaces/default/pods"),
            lambda: reader.create(
                f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "nope"}}
            ),
        ):
            with pytest.raises(KubeError) as error:
                denied()
            assert error.value.status == 403
            assert f"system:serviceaccount:{ns}:reader" in error.value.message
    can_i = kubectl(kubeconfig, "auth", "can-i", "list", "pods", "-n", ns)
    assert (can_i.returncode, can_i.stdout.strip()) == (0, "yes")
    cannot = kubectl(kubeconfig, "auth", "can-i", "delete", "pods", "-n", ns)
    assert (cannot.returncode, cannot.stdout.strip()) == (1, "no")
