"""`engine: vllm` on the emulated cluster with a real vLLM: `kubectl apply` of the example runs
vLLM's OpenAI server (its CPU build, `make vllm-venv`) as the pod's process, Prometheus scrapes
its `vllm:` series, and the operator scales the Deployment when a burst queues in vLLM.

Minutes, not seconds: vLLM starts in 1-3 minutes on this shared CPU (imports, engine process,
warm-up), so the test waits for one pod to serve and for the scale-up decision, not for the
second pod's start."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from operator_harness import ROOT, OperatorProcess, get_json, install_crds, kubectl, wait_for

from wok_cluster.process import command_line
from wok_cluster.vllm_process import SERVER_MODULE
from wok_cluster.vllm_venv import vllm_python
from wok_cluster.waiting import wait_until
from wok_contracts.traces import TraceRequest
from wok_runtime.tools.bench_http import run_bench

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.slow(minutes=5)]

EXAMPLE = ROOT / "examples" / "vllm-tiny.yaml"
NAME = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
VLLM_START_S = 420  # a cold vLLM: 2-3 min on the loaded 2-core machine (http_profile_check.md)


@pytest.fixture
def operator(wok_cluster, wok_prometheus, wok_namespace, tmp_path) -> Iterator[OperatorProcess]:
    if vllm_python() is None:
        pytest.fail("vLLM's CPU build is not installed: run `make vllm-venv`")
    install_crds(wok_cluster.kubeconfig)
    process = OperatorProcess(
        wok_cluster.kubeconfig,
        wok_namespace,
        wok_prometheus.url,
        tmp_path / "operator.log",
        run_marker=str(wok_cluster.run_dir),
    )
    process.wait_live()
    yield process
    assert process.stop() == 0, f"operator did not exit cleanly:\n{process.log_tail()}"


def vllm_pods(kubeconfig: Path, namespace: str) -> list[dict]:
    pods = get_json(kubeconfig, "pods", "-n", namespace, "-l", f"wok.dev/service={NAME}")
    return [p for p in (pods or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def burst(url: str, stop: threading.Event) -> None:
    """A closed loop of 96 streaming clients (the pod's 32 slots, its queue of 64) until told."""
    specs = [TraceRequest(0.0, 64, 256) for _ in range(2000)]

    async def run() -> None:
        task = asyncio.create_task(run_bench([url], specs, max_concurrency=96, duration_s=240))
        while not task.done() and not stop.is_set():
            await asyncio.sleep(0.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


def test_the_vllm_example_serves_is_scraped_and_scales_under_load(
    operator, wok_cluster, wok_prometheus, wok_namespace
):
    kc, ns = wok_cluster.kubeconfig, wok_namespace
    kubectl(kc, "apply", "-n", ns, "-f", str(EXAMPLE))

    pod = wait_for(
        lambda: next((p for p in vllm_pods(kc, ns) if ready(p)), None),
        "a ready vLLM pod",
        VLLM_START_S,
    )
    # the model came from the init container's `wok model export`
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("wok-backer://"))
    argv = command_line(pid) or []
    assert SERVER_MODULE in argv and "--max-num-seqs=32" in argv, argv
    ip = pod["status"]["podIP"]
    url = f"http://{ip}:8000"
    served = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    assert served == "tiny"  # the served model name the operator rendered
    reply = httpx.post(
        f"{url}/v1/completions",
        timeout=60,
        json={"model": served, "prompt": "hello", "max_tokens": 4, "ignore_eos": True},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4
    wait_until(
        lambda: wok_prometheus.query(f'vllm:num_requests_running{{namespace="{ns}"}}'),
        timeout=60,
        what="Prometheus scraping the vLLM pod",
    )

    stop = threading.Event()
    load = threading.Thread(target=burst, args=(url, stop), daemon=True)
    load.start()
    try:
        wait_until(
            lambda: wok_prometheus.query(f'vllm:num_requests_waiting{{namespace="{ns}"}} > 0'),
            timeout=60,
            what="requests waiting in vLLM",
        )
        deployment = f"{NAME}-runtime"
        scaled = wait_for(
            lambda: (
                (d := get_json(kc, "deployment", deployment, "-n", ns))
                and d["spec"]["replicas"] >= 2
                and d
            ),
            "the operator scaling the vLLM Deployment up",
            120,
        )
        assert scaled["spec"]["replicas"] >= 2
        wait_for(lambda: len(vllm_pods(kc, ns)) >= 2, "a second vLLM pod", 60)
    finally:
        stop.set()
        load.join(timeout=30)
    wis = get_json(kc, "wis", NAME, "-n", ns)
    assert wis["status"]["replicas"] >= 2, wis["status"]
    kubectl(kc, "delete", "wis", NAME, "-n", ns, "--wait=true", "--timeout=120s")
    wait_for(lambda: not vllm_pods(kc, ns), "vLLM pods gone", 120)
