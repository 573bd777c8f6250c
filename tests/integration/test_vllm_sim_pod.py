"""The fake vLLM pod (cluster/wok_cluster/vllm_sim.py): the operator's rendered `vllm serve`
arguments, mapped as the pod backer maps them, start a real `wok runtime serve --device sim
--as-vllm` process that answers as vLLM 0.32 over real HTTP: `/health` (503 while it loads),
exactly vLLM's metric series (none of wok's), the batch held at `--max-num-seqs`, a 503 past
`--max-num-queued-reqs` counted in `vllm:admission_rejections_total`, and no admin API."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml
from runtime_harness import RuntimeServer, free_port

from wok_cluster.vllm_sim import sim_vllm_argv
from wok_contracts.metrics import VLLM_SERIES
from wok_contracts.profile import load_profile
from wok_operator import api
from wok_operator.vllm_pod import vllm_args
from wok_runtime.http.server_config import VLLM_QUEUE_OVERFLOW

pytestmark = [pytest.mark.integration]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm-tiny.yaml"
NAME = "fake-vllm"
SEQS, QUEUE = 2, 1  # --max-num-seqs 2, --max-num-queued-reqs 3


def rendered_args(port: int) -> list[str]:
    """The operator's arguments for the example at a batch of 2 and a queue of 1 (its port moved
    off 8000, which the machine's other work may hold)."""
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec["batching"] |= {"maxBatchSize": SEQS, "initialBatchSize": SEQS}
    spec["queue"] = {"maxLength": QUEUE}
    args = vllm_args(
        api.InferenceServiceSpec.model_validate(spec), max_num_seqs=SEQS, served_name=NAME
    )
    return [f"--port={port}" if a.startswith("--port=") else a for a in args]


@pytest.fixture
def fake_pod(tmp_path: Path) -> RuntimeServer:
    # 50 ms a step, so that two 200-token answers hold the batch for seconds; a short load
    profile = replace(load_profile("sim:llama-3-8b-80g"), name="slow", a_s=0.05, load_seconds=2.0)
    profile_path = tmp_path / "slow.json"
    profile_path.write_text(profile.to_json())
    port = free_port()
    argv = sim_vllm_argv(
        ["vllm", "serve"], rendered_args(port), pod_ip="127.0.0.1", profile=str(profile_path)
    )
    assert argv[:3] == ["wok", "runtime", "serve"]
    argv = [sys.executable, "-m", "wok.cli", *argv[1:], "--log-level=warning"]
    log_path = tmp_path / "fake-vllm.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    server = RuntimeServer(proc, f"http://127.0.0.1:{port}", log_path)
    yield server
    server.stop()


def wait_health(server: RuntimeServer) -> list[int]:
    """The /health answers until the first 200."""
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log()
        try:
            seen.append(httpx.get(f"{server.url}/health", timeout=2).status_code)
        except httpx.HTTPError:
            time.sleep(0.05)
            continue
        if seen[-1] == 200:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"/health never answered 200 ({seen[-5:]}):\n{server.log()}")


def series(server: RuntimeServer) -> dict[str, float]:
    """/metrics as sample name (labels dropped, values summed) -> value."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
            out[name] = out.get(name, 0.0) + value
    return out


def test_the_fake_vllm_pod_answers_as_vllm(fake_pod: RuntimeServer):
    seen = wait_health(fake_pod)
    assert 503 in seen, f"/health answered {seen}: the load was not seen"
    assert set(series(fake_pod)) == VLLM_SERIES

    answers: list[int] = []

    def long_request() -> None:
        body = {"model": NAME, "prompt": [11, 12, 13], "max_tokens": 200, "ignore_eos": True}
        url = f"{fake_pod.url}/v1/completions"
        answers.append(httpx.post(url, json=body, timeout=120).status_code)

    threads = [threading.Thread(target=long_request) for _ in range(SEQS + QUEUE)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = series(fake_pod)
        if now["vllm:num_requests_running"] == SEQS and now["vllm:num_requests_waiting"] == QUEUE:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the batch never filled: {now}")
    body = {"model": NAME, "prompt": [11], "max_tokens": 4}
    refused = httpx.post(f"{fake_pod.url}/v1/completions", json=body, timeout=30)
    assert refused.status_code == 503
    assert refused.json()["error"]["message"] == VLLM_QUEUE_OVERFLOW
    after = series(fake_pod)
    assert after["vllm:admission_rejections_total"] == 1
    # the batch stays at --max-num-seqs: no admin API moves it
    assert httpx.get(f"{fake_pod.url}/admin/v1/batching", timeout=10).status_code == 403
    assert after["vllm:num_requests_running"] == SEQS
    for thread in threads:
        thread.join(timeout=120)
    assert answers == [200] * (SEQS + QUEUE)
    assert series(fake_pod)["vllm:request_success_total"] == SEQS + QUEUE
