"""Pure pieces of the harness: kubelet-style expansion, volume path rewriting, node manifests,
the Prometheus scrape config."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from wok.cli import build_parser
from wok_cluster.backed_pod import emulate_gpu
from wok_cluster.devenv import operator_argv
from wok_cluster.expand import expand, field_ref
from wok_cluster.kubeapi import crd_established
from wok_cluster.netutil import LISTEN_PORTS, claim_pod_octet, free_port, require_loopback
from wok_cluster.nodes import gpu_node, pod_cidr
from wok_cluster.prometheus import scrape_config
from wok_cluster.volumes import rewrite

pytestmark = pytest.mark.unit  # pure code: no cluster, no process

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "b"}},
    "spec": {"nodeName": "wok-gpu-0"},
    "status": {"podIP": "127.1.0.7"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--host=$(POD_IP)", "--host=127.1.0.7"),
        ("$(UNDEFINED)", "$(UNDEFINED)"),
        ("$$(POD_IP)", "$(POD_IP)"),
        ("cost $5", "cost $5"),
        ("$(POD_IP", "$(POD_IP"),
        ("$(A)$(POD_IP)", "x127.1.0.7"),
    ],
)
def test_expand_follows_the_kubelet(text, expected):
    assert expand(text, {"POD_IP": "127.1.0.7", "A": "x"}) == expected


def test_field_refs():
    assert field_ref(POD, "status.podIP") == "127.1.0.7"
    assert field_ref(POD, "metadata.namespace") == "ns"
    assert field_ref(POD, "metadata.labels['a']") == "b"
    with pytest.raises(ValueError):
        field_ref(POD, "spec.containers")


def test_rewrite_maps_paths_under_mounts_only():
    mounts = {"/etc/wok/admin": Path("/tmp/p/admin"), "/etc/wok": Path("/tmp/p/etc")}
    assert rewrite("/etc/wok/admin/token", mounts) == "/tmp/p/admin/token"
    assert rewrite("--token-file=/etc/wok/admin/token", mounts) == "--token-file=/tmp/p/admin/token"
    assert rewrite("/etc/wok/other", mounts) == "/tmp/p/etc/other"
    assert rewrite("/etc/wokish", mounts) == "/etc/wokish"
    assert rewrite("--port=8000", mounts) == "--port=8000"


def test_nodes_have_gpus_and_loopback_pod_cidrs():
    node = gpu_node(3, gpus=8, octet=42)
    assert node["spec"]["podCIDR"] == "127.42.3.0/24"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    with pytest.raises(ValueError):
        pod_cidr(255, 42)


def test_pod_networks_avoid_busy_loopback_ranges(monkeypatch):
    monkeypatch.setattr("random.shuffle", lambda choices: choices.sort(key=lambda x: x != 77))
    with socket.socket() as busy:
        busy.bind(("127.77.0.1", 0))
        busy.listen()
        octet, claim = claim_pod_octet()  # 77 is tried first, unless something listens in it
        claim.close()
    assert octet != 77
    assert 2 <= octet <= 254


def test_clusters_that_start_together_never_share_a_pod_network(monkeypatch):
    # The worst draw: every cluster tries the same networks in the same order, before any of
    # them has a pod listening (two test workers starting their clusters at once).
    monkeypatch.setattr("random.shuffle", lambda choices: None)
    claims = [claim_pod_octet() for _ in range(3)]
    try:
        assert len({octet for octet, _ in claims}) == 3
    finally:
        for _, claim in claims:
            claim.close()
    again, claim = claim_pod_octet()  # a closed claim frees its network
    claim.close()
    assert again == claims[0][0]


def test_only_loopback_is_allowed():
    assert require_loopback("127.1.0.1") == "127.1.0.1"
    for address in ("10.96.0.1", "192.168.1.1", "example.com"):
        with pytest.raises(ValueError):
            require_loopback(address)


def test_scrape_config_keeps_annotated_loopback_pods():
    config = scrape_config(
        api_server="https://127.0.0.1:6443", ca_file=Path("ca"), token_file=Path("t")
    )
    relabel = config["scrape_configs"][0]["relabel_configs"]
    keeps = {r["source_labels"][0]: r["regex"] for r in relabel if r["action"] == "keep"}
    assert keeps["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == "true"
    assert keeps["__meta_kubernetes_pod_ip"] == r"127\..+"
    targets = {r["target_label"] for r in relabel if r["action"] == "replace"}
    assert {"__address__", "__metrics_path__", "namespace", "pod", "service"} <= targets


def test_a_cuda_runtime_pod_runs_on_the_emulated_nodes_cpu():
    assert emulate_gpu(["runtime", "serve", "--device=cuda", "--kv-cache-bytes=9"]) == [
        "runtime",
        "serve",
        "--device=cpu",
        "--kv-cache-bytes=9",
    ]
    assert emulate_gpu(["--device", "cuda:0", "--x"]) == ["--device", "cpu", "--x"]
    assert emulate_gpu(["--device=sim", "--profile=sim:x"]) == ["--device=sim", "--profile=sim:x"]


def test_wok_dev_operator_runs_the_operator_with_the_dev_clusters_flags():
    state = {"prometheus": "http://127.0.0.1:9099", "kubeconfig": "/k"}
    argv = operator_argv(state, namespace="team-a", liveness_port=8123, extra=["--verbose"])
    args = build_parser().parse_args(argv)  # the operator's own parser accepts them all
    assert (args.namespace, args.prometheus_url) == (["team-a"], "http://127.0.0.1:9099")
    assert args.pod_label == ["wok.dev/backed=true"]
    assert (args.standalone, args.metrics_port) == (True, 0)
    assert args.liveness == "http://127.0.0.1:8123/healthz"
    assert args.log_format == "plain" and args.verbose
    dev = build_parser().parse_args(["dev", "operator", "-n", "x", "--", "--verbose"])
    assert (dev.namespace, dev.operator_args) == ("x", ["--", "--verbose"])


def test_a_crd_without_conditions_yet_is_not_established_rather_than_an_error():
    # what a CRD looks like a moment after its create, on a loaded apiserver
    assert not crd_established({"metadata": {"name": "x"}})
    assert not crd_established({"status": {"conditions": None}})
    names_accepted = {"type": "NamesAccepted", "status": "True"}
    assert not crd_established({"status": {"conditions": [names_accepted]}})
    established = {"type": "Established", "status": "True"}
    assert crd_established({"status": {"conditions": [names_accepted, established]}})


def test_listening_ports_avoid_the_ephemeral_range_and_each_worker_has_its_own(monkeypatch):
    ephemeral = range(32768, 61000)  # the kernel's default ip_local_port_range
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert all(free_port() in LISTEN_PORTS for _ in range(50))
    assert not set(LISTEN_PORTS) & set(ephemeral)
    drawn = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        drawn[worker] = {free_port() for _ in range(50)}
    assert not drawn["gw0"] & drawn["gw1"] and not drawn["gw1"] & drawn["gw2"]
    assert not drawn["gw0"] & drawn["gw2"]
    assert all(port in LISTEN_PORTS for ports in drawn.values() for port in ports)
