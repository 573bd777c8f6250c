"""Real `wok runtime serve --device sim` processes: the load delay, exact output lengths, the
profile's step time, the TPOT histogram, rejected and timed-out requests in
`wok_rejected_requests_total`, the live batch cap, and no torch in the process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from runtime_harness import ADMIN_TOKEN, RuntimeServer, free_port

from wok_contracts.metrics import REJECT_QUEUE_FULL, REJECT_QUEUE_TIMEOUT
from wok_contracts.profile import StepProfile, load_profile

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # times the simulated load: alone

NAME = "sim-test"
LABEL = f'model_name="{NAME}"'
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def slow_profile(tmp_path: Path, **costs: float) -> Path:
    """The Llama-3-8B profile with step costs large enough to time on a busy 2-core machine."""
    profile: StepProfile = replace(load_profile("sim:llama-3-8b-80g"), name="slow", **costs)
    path = tmp_path / "slow.json"
    path.write_text(profile.to_json())
    return path


def start_sim(
    tmp_path: Path, profile: Path | str, *args: str, load_s: float = 0.0
) -> RuntimeServer:
    """Starts the server and returns once it listens (not once it is ready)."""
    port = free_port()
    token_file = tmp_path / f"admin-token-{port}"
    token_file.write_text(ADMIN_TOKEN + "\n")
    argv = [
        sys.executable, "-m", "wok.cli", "runtime", "serve", "--device", "sim",
        "--profile", str(profile), "--sim-load-seconds", str(load_s),
        "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port),
        "--admin-token-file", str(token_file), "--log-level", "warning", *args,
    ]  # fmt: skip
    log_path = tmp_path / f"server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    server = RuntimeServer(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, server.log()
        try:
            httpx.get(f"{server.url}/healthz", timeout=2)
            return server
        except httpx.HTTPError:
            time.sleep(0.05)
    server.stop()
    raise AssertionError(f"the server did not listen within 60 s:\n{server.log()}")


def wait_ready(server: RuntimeServer, timeout: float = 30.0) -> float:
    """Seconds until /readyz answered 200."""
    started = time.monotonic()
    while time.monotonic() < started + timeout:
        if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"not ready within {timeout} s:\n{server.log()}")


def complete(url: str, max_tokens: int, **extra: object) -> httpx.Response:
    body = {"prompt": [11, 12, 13, 14], "max_tokens": max_tokens, "ignore_eos": True, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


async def complete_many(url: str, n: int, max_tokens: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as http:
        body = {"prompt": [11, 12, 13, 14], "max_tokens": max_tokens, "ignore_eos": True}
        return await asyncio.gather(
            *(http.post(f"{url}/v1/completions", json=body) for _ in range(n))
        )


def mean_tpot(server: RuntimeServer) -> tuple[float, float]:
    m = server.metrics()
    key = "vllm:request_time_per_output_token_seconds"
    return m[f"{key}_sum{{{LABEL}}}"], m[f"{key}_count{{{LABEL}}}"]


def test_not_ready_while_loading_then_exact_lengths_and_no_torch(tmp_path: Path) -> None:
    # a load long enough that the two early requests land inside it on a loaded machine
    server = start_sim(tmp_path, "sim:llama-3-8b-80g", load_s=4.0)
    try:
        started = time.monotonic()
        readyz = httpx.get(f"{server.url}/readyz")
        assert readyz.status_code == 503 and readyz.json() == {"status": "starting"}
        early = complete(server.url, 5)
        assert early.status_code == 503 and early.json()["error"]["code"] == "loading"
        wait_ready(server)
        assert 3.5 < time.monotonic() - started < 10.0  # the 4 s load, from about when it listened
        r = complete(server.url, 50, return_token_ids=True)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 50
        assert r.json()["usage"]["completion_tokens"] == 50
        text = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7},
            timeout=30,
        )
        assert text.status_code == 200 and text.json()["usage"]["completion_tokens"] == 7
        maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
        assert "libtorch" not in maps
        assert server.rss_bytes() < 150 * 2**20
    finally:
        assert server.stop() == 0, server.log()


def test_step_time_matches_the_profile_and_tpot_is_exported(tmp_path: Path) -> None:
    profile = slow_profile(tmp_path, a_s=0.02, b_s_per_seq=0.01)
    p = load_profile(profile)
    server = start_sim(tmp_path, profile)
    try:
        wait_ready(server)
        assert mean_tpot(server) == (0, 0)  # the warm-up is not a request
        # One request alone: every decode step is a batch of one.
        assert complete(server.url, 21).status_code == 200
        total, count = mean_tpot(server)
        alone = p.step_seconds(1, 0, 4 + 10)  # the context term is a rounding error here
        assert count == 1 and total == pytest.approx(alone, rel=0.15)
        # Four at once: the same steps carry four decodes each.
        responses = asyncio.run(complete_many(server.url, 4, 21))
        assert {r.status_code for r in responses} == {200}
        total4, count4 = mean_tpot(server)
        assert count4 == 5
        four = p.step_seconds(4, 0, 4 * 14)
        assert (total4 - total) / 4 == pytest.approx(four, rel=0.15)
        # One output token has no time per output token: not observed.
        assert complete(server.url, 1).status_code == 200
        assert mean_tpot(server)[1] == 5
        m = server.metrics()
        assert m[f'vllm:request_success_total{{finished_reason="length",{LABEL}}}'] == 6
    finally:
        assert server.stop() == 0, server.log()


def test_rejected_and_timed_out_requests_are_counted(tmp_path: Path) -> None:
    # One slot, a queue of two, a 0.5 s queue timeout, and 0.1 s steps: a 30-token request holds
    # the slot for 3 s, so the two queued ones time out and a fourth finds the queue full.
    profile = slow_profile(tmp_path, a_s=0.1)
    server = start_sim(
        tmp_path, profile, "--max-batch-size", "1", "--max-queue", "2", "--queue-timeout", "0.5"
    )
    try:
        wait_ready(server)

        async def main() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as http:
                body = {"prompt": [5, 6], "ignore_eos": True}
                url = f"{server.url}/v1/completions"
                long = asyncio.create_task(http.post(url, json={**body, "max_tokens": 30}))
                await asyncio.sleep(0.3)  # the long one holds the slot
                queued = [asyncio.create_task(http.post(url, json={**body, "max_tokens": 2}))
                          for _ in range(2)]  # fmt: skip
                await asyncio.sleep(0.1)
                full = await http.post(url, json={**body, "max_tokens": 2})
                rest = await asyncio.gather(*queued, long)
                return [full.status_code, *(r.status_code for r in rest)]

        assert asyncio.run(main()) == [429, 503, 503, 200]
        m = server.metrics()
        rejected = "wok_rejected_requests_total"
        assert m[f'{rejected}{{{LABEL},reason="{REJECT_QUEUE_FULL}"}}'] == 1
        assert m[f'{rejected}{{{LABEL},reason="{REJECT_QUEUE_TIMEOUT}"}}'] == 2
        # Misses are counted once, there: the latency histograms hold the one answered request.
        for histogram in ("time_to_first_token", "e2e_request_latency"):
            assert m[f"vllm:{histogram}_seconds_count{{{LABEL}}}"] == 1
    finally:
        assert server.stop() == 0, server.log()


def test_the_admin_api_moves_the_batch_cap_live(tmp_path: Path) -> None:
    profile = slow_profile(tmp_path, a_s=0.05)
    server = start_sim(tmp_path, profile, "--max-batch-size", "2")
    try:
        wait_ready(server)

        def peak_running(n: int) -> int:
            peak = 0
            stop = threading.Event()

            def watch() -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, int(server.metrics()[f"vllm:num_requests_running{{{LABEL}}}"]))
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                responses = asyncio.run(complete_many(server.url, n, 15))
            finally:
                stop.set()
                watcher.join()
            assert {r.status_code for r in responses} == {200}
            return peak

        assert peak_running(6) == 2
        r = httpx.put(f"{server.url}/admin/v1/batching", json={"max_batch_size": 6}, headers=AUTH)
        assert r.status_code == 200 and r.json()["max_batch_size"] == 6
        assert peak_running(6) == 6
        assert server.metrics()[f"wok_max_batch_size{{{LABEL}}}"] == 6
    finally:
        assert server.stop() == 0, server.log()
