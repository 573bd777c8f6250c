"""Backpressure against live servers: overload (429/503, never a crash), queue timeouts, the
SIGTERM drain, and the per-tenant KV share. Each case needs its own server flags."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from runtime_harness import KV_BYTES_PER_TOKEN, RuntimeServer, start_server

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # races a 0.1 s queue timeout: alone


def _prompt(n: int) -> list[int]:
    return [20 + i % 200 for i in range(n)]


async def _complete(
    http: httpx.AsyncClient, url: str, max_tokens: int, *, tenant: str | None = None
) -> tuple[int, dict, dict]:
    headers = {"X-Wok-Tenant": tenant} if tenant else {}
    body = {"prompt": _prompt(8), "max_tokens": max_tokens, "ignore_eos": True}
    r = await http.post(f"{url}/v1/completions", json=body, headers=headers)
    return r.status_code, dict(r.headers), r.json()


def test_overload_gets_429_or_503_and_the_server_stays_up(tmp_path: Path):
    # Capacity: 4 running + 8 queued. 120 clients (10x) in a closed loop for 10 s.
    server = start_server(
        tmp_path, "--max-batch-size", "4", "--max-queue", "8", "--queue-timeout", "2"
    )
    try:
        rss_start = server.rss_bytes()
        rss_peak = rss_start
        statuses: dict[int, int] = {}
        incomplete: list[dict] = []
        missing_retry_after = 0
        retry_afters: set[int] = set()
        messages: set[str] = set()
        deadline = time.monotonic() + 10.0

        async def client() -> None:
            nonlocal missing_retry_after
            async with httpx.AsyncClient(timeout=60) as http:
                while time.monotonic() < deadline:
                    status, headers, body = await _complete(http, server.url, 16)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status == 200:
                        choice = body["choices"][0]
                        if body["usage"]["completion_tokens"] != 16 or choice["finish_reason"] != (
                            "length"
                        ):
                            incomplete.append(body)
                    elif status == 429:
                        messages.add(body["error"]["message"])
                        retry_after = headers.get("retry-after", "")
                        missing_retry_after += int(not retry_after.isdigit())
                        retry_afters.add(int(retry_after) if retry_after.isdigit() else -1)
                        await asyncio.sleep(0.05)
                    else:
                        assert set(body["error"]) == {"message", "type", "param", "code"}

        async def sample_rss() -> None:
            nonlocal rss_peak
            while time.monotonic() < deadline:
                rss_peak = max(rss_peak, server.rss_bytes())
                await asyncio.sleep(0.5)

        async def main() -> None:
            await asyncio.gather(sample_rss(), *(client() for _ in range(120)))

        asyncio.run(main())
        assert server.proc.poll() is None, server.log()
        assert set(statuses) <= {200, 429, 503}, statuses
        assert statuses.get(200, 0) > 0 and statuses.get(429, 0) > 0, statuses
        assert not incomplete
        assert missing_retry_after == 0
        assert retry_afters <= {1, 2}, retry_afters  # clipped to [1 s, the queue timeout]
        # Said once: "queue full (8 waiting, max 8); retry after 1 s".
        assert all(re.fullmatch(r"queue full \(8 waiting, max 8\); retry after [12] s", m)
                   for m in messages), messages  # fmt: skip
        assert rss_peak < rss_start + 300 * 2**20, (rss_start, rss_peak)
        m = server.metrics()
        rejected = m['wok_rejected_requests_total{model_name="builtin:tiny",reason="queue_full"}']
        assert rejected == statuses[429]
        # Still serving after the storm.
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "ok", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        assert server.stop() == 0, server.log()


def test_queue_timeout_is_a_503_naming_the_reason(tmp_path: Path):
    # Also a server without an admin token: its admin API is disabled (403), with or without one.
    server = start_server(
        tmp_path, "--max-batch-size", "1", "--queue-timeout", "0.1", admin_token=None
    )
    try:
        for headers in ({}, {"Authorization": "Bearer anything-at-all"}):
            r = httpx.get(f"{server.url}/admin/v1/batching", headers=headers)
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
        assert "admin API disabled" in server.log()

        async def main() -> list[tuple[int, dict, dict]]:
            async with httpx.AsyncClient(timeout=60) as http:
                # The long one holds the only slot well past the shorts' 0.1 s in the queue
                # (240 steps of the tiny model: a quarter of a second even at 1 ms a step).
                long = asyncio.create_task(_complete(http, server.url, 240))
                await asyncio.sleep(0.1)
                short = [_complete(http, server.url, 2) for _ in range(3)]
                return [*(await asyncio.gather(*short)), await long]

        results = asyncio.run(main())
        assert results[-1][0] == 200
        timed_out = [body for status, _, body in results[:-1] if status == 503]
        assert timed_out, results
        # Like a 429: when to try again (clients, the openai one too, wait that long).
        for status, headers, _ in results[:-1]:
            assert status != 503 or headers.get("retry-after", "").isdigit(), headers
        assert timed_out[0]["error"]["code"] == "queue_timeout"
        assert "queue" in timed_out[0]["error"]["message"]
        m = server.metrics()
        key = 'wok_rejected_requests_total{model_name="builtin:tiny",reason="queue_timeout"}'
        assert m[key] == len(timed_out)
    finally:
        assert server.stop() == 0, server.log()


def test_sigterm_drains_in_flight_requests_then_exits_0(tmp_path: Path):
    server = start_server(tmp_path, "--drain-seconds", "60")
    results: list[tuple[int, dict, dict]] = []

    async def in_flight() -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            results.extend(
                await asyncio.gather(*(_complete(http, server.url, 100) for _ in range(4)))
            )

    runner = threading.Thread(target=asyncio.run, args=(in_flight(),))
    runner.start()
    deadline = time.monotonic() + 30
    while server.metrics()['vllm:num_requests_running{model_name="builtin:tiny"}'] < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # Draining: not ready, and new work is refused with 503 while the old work finishes.
    assert httpx.get(f"{server.url}/readyz").status_code == 503
    refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": "late", "max_tokens": 2})
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "draining"
    runner.join(120)
    assert server.proc.wait(60) == 0, server.log()
    assert [status for status, _, _ in results] == [200] * 4
    outcomes = [
        (b["choices"][0]["finish_reason"], b["usage"]["completion_tokens"]) for _, _, b in results
    ]
    assert outcomes == [("length", 100)] * 4


def test_an_idle_server_answers_draining_until_its_endpoints_can_drop_it(tmp_path: Path):
    # A load balancer still sends requests for a moment after the pod turns unready: they must
    # get a retryable 503, not a refused connection, until --unready-seconds has passed.
    server = start_server(tmp_path, "--drain-seconds", "30", "--unready-seconds", "2")
    server.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    time.sleep(0.2)  # the handler runs on the server's loop
    answers = []
    while time.monotonic() - signalled < 1.5:
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        answers.append((r.status_code, r.json()["error"]["code"]))
        time.sleep(0.1)
    assert answers and set(answers) == {(503, "draining")}, answers
    assert server.proc.wait(30) == 0, server.log()
    assert time.monotonic() - signalled >= 2.0


def _tenant_run(server: RuntimeServer) -> tuple[list[int], int, float]:
    """Tenant B (priority batch) holds a long request; tenant A (interactive, which ranks above
    B and so may evict it) floods. Returns the statuses, B's preemptions and the total."""
    key = 'vllm:num_preemptions_total{model_name="builtin:tiny"}'
    before = server.metrics()[key]

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=180) as http:

            def post(tenant: str, priority: str, max_tokens: int) -> Any:
                body = {"prompt": _prompt(8), "max_tokens": max_tokens, "ignore_eos": True}
                headers = {"X-Wok-Tenant": tenant, "X-Wok-Priority": priority}
                return http.post(f"{server.url}/v1/completions", json=body, headers=headers)

            b = asyncio.create_task(post("b", "batch", 56))
            running = 'vllm:num_requests_running{model_name="builtin:tiny"} 1.0'
            while running not in (await http.get(f"{server.url}/metrics")).text:
                await asyncio.sleep(0.01)
            return await asyncio.gather(b, *(post("a", "interactive", 40) for _ in range(6)))

    responses = asyncio.run(main())
    b_preemptions = int(responses[0].headers["x-wok-preemptions"])
    return [r.status_code for r in responses], b_preemptions, server.metrics()[key] - before


@pytest.mark.parametrize(("share", "b_evicted"), [("0.5", False), ("1.0", True)])
def test_tenant_kv_share_queues_instead_of_evicting(tmp_path: Path, share, b_evicted):
    # 40 blocks of 4 tokens. B grows to 64 tokens (16 blocks), each of A's six to 48 (12
    # blocks): 72 for A. Without a share A outgrows the pool and evicts B (ranked lowest); with
    # a share of 0.5 tenant A is held to 20 blocks, waits or preempts only its own, and B is
    # never evicted.
    server = start_server(
        tmp_path,
        "--tenant-kv-share",
        share,
        "--block-size",
        "4",
        "--kv-cache-bytes",
        str(40 * 4 * KV_BYTES_PER_TOKEN),
        "--max-model-len",
        "64",
    )
    try:
        statuses, b_preemptions, total = _tenant_run(server)
        assert statuses == [200] * 7
        assert (b_preemptions > 0) == b_evicted, (b_preemptions, total)
    finally:
        assert server.stop() == 0, server.log()
