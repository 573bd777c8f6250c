"""The engine thread never dies silently, against a live `wok runtime serve` whose scheduler is
made to fail (scheduler_fault.py, a fault injection): a post-processing fault fails only its
step's request with a 500 and a message; a scheduling fault fails the request in flight the same
way, refuses new ones with a 503, and turns /healthz and /readyz 503 so the kubelet restarts the
pod."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from runtime_harness import start_server

pytestmark = pytest.mark.integration

FAULT_LAUNCHER = (str(Path(__file__).with_name("scheduler_fault.py")),)


def complete(url: str, prompt: str = "hello") -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


def test_engine_faults_fail_their_requests_and_a_dead_loop_fails_the_probe(tmp_path: Path):
    trigger = tmp_path / "fault"
    server = start_server(
        tmp_path, launcher=FAULT_LAUNCHER, env={"WOK_TEST_FAULT_FILE": str(trigger)}
    )
    try:
        assert complete(server.url).status_code == 200

        trigger.write_text("postprocess")
        failed = complete(server.url)
        assert failed.status_code == 500, failed.text
        error = failed.json()["error"]
        assert error["code"] == "engine_error"
        assert "injected post-processing fault" in error["message"]
        assert httpx.get(f"{server.url}/healthz").status_code == 200  # the loop goes on
        assert complete(server.url).status_code == 200

        trigger.write_text("schedule")
        failed = complete(server.url)
        assert failed.status_code == 500, failed.text
        assert "injected scheduler fault" in failed.json()["error"]["message"]
        for probe in ("healthz", "readyz"):
            answer = httpx.get(f"{server.url}/{probe}")
            assert answer.status_code == 503
            assert answer.json()["status"] == "failed"
            assert "injected scheduler fault" in answer.json()["detail"]
        refused = complete(server.url)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "engine_failed"
        assert "the engine loop cannot continue" in server.log()
    finally:
        server.stop()
