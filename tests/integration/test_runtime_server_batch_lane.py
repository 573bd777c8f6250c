"""The batch lane against a live `wok runtime serve` (builtin:tiny on the CPU): how a request is
marked, that a full batch queue refuses only batch work while online requests pass, that a
preempted batch request still answers exactly what it would have alone, and that the vLLM
series the operator scales on never count batch work."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from runtime_harness import RuntimeServer, start_server

from wok_runtime.core.scheduler import ONLINE_IDLE_GRACE_S

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # bounds queue seconds: alone

MODEL = '{model_name="builtin:tiny"}'


def _body(max_tokens: int, **extra: object) -> dict:
    prompt = [20 + i % 200 for i in range(8)]
    return {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **extra}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(
        tmp_path_factory.mktemp("batch-lane"),
        "--max-batch-size", "2", "--batch-queue-size", "3", "--batch-lane-max-batch-size", "2",
    )  # fmt: skip
    # The warm-up request is online work: past the idle grace, the batch lane may use every slot.
    time.sleep(ONLINE_IDLE_GRACE_S)
    yield srv
    assert srv.stop() == 0, srv.log()


def test_marking_by_body_or_header_and_counted_apart(server: RuntimeServer):
    before = server.metrics()
    url = f"{server.url}/v1/completions"
    r = httpx.post(url, json=_body(5, priority="batch"), timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(url, json=_body(7), headers={"X-Wok-Lane": "batch"}, timeout=30)
    assert r.status_code == 200, r.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True}
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json={**chat, "priority": "batch"}, timeout=30
    )
    assert r.status_code == 200, r.text
    r = httpx.post(url, json=_body(2), headers={"X-Wok-Lane": "offline"}, timeout=30)
    assert r.status_code == 400 and "X-Wok-Lane" in r.json()["error"]["message"]
    after = server.metrics()

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert delta(f"wok_batch_lane_generation_tokens_total{MODEL}") == 15
    assert delta(f"vllm:generation_tokens_total{MODEL}") == 0
    assert delta(f"vllm:e2e_request_latency_seconds_count{MODEL}") == 0
    assert delta(f"wok_batch_lane_e2e_request_latency_seconds_count{MODEL}") == 3


def test_a_full_batch_queue_refuses_only_batch_and_online_passes_untouched(
    server: RuntimeServer,
):
    """Two slots, a batch queue of three: of 8 long batch requests 2 run, 3 wait and 3 are
    refused; then online requests arrive while the backlog is full and are served at once."""
    before = server.metrics()

    async def main() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=180) as http:
            url = f"{server.url}/v1/completions"

            async def until(sample: str) -> None:
                deadline = time.monotonic() + 30
                while sample not in (await http.get(f"{server.url}/metrics")).text:
                    assert time.monotonic() < deadline, f"never saw {sample}"
                    await asyncio.sleep(0.01)

            def post_batch() -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(http.post(url, json=_body(150, priority="batch")))

            batch = [post_batch() for _ in range(2)]
            await until(f"wok_batch_lane_requests_running{MODEL} 2.0")
            batch += [post_batch() for _ in range(6)]  # 3 queue, 3 are refused
            await until(f"wok_batch_lane_requests_waiting{MODEL} 3.0")
            online = await asyncio.gather(*(http.post(url, json=_body(10)) for _ in range(4)))
            return await asyncio.gather(*batch), online

    batch, online = asyncio.run(main())
    after = server.metrics()
    refused = [r for r in batch if r.status_code == 429]
    assert len(refused) == 3  # 2 running + 3 queued of 8
    assert all(r.headers["retry-after"].isdigit() for r in refused)
    assert "batch queue full" in refused[0].json()["error"]["message"]
    assert [r.status_code for r in batch if r.status_code != 429] == [200] * 5
    assert [r.status_code for r in online] == [200] * 4
    # Online is never held up by the backlog: admitted at once, by preempting batch work.
    assert all(float(r.headers["x-wok-queue-seconds"]) < 1.0 for r in online)
    assert all(r.headers["x-wok-preemptions"] == "0" for r in online)
    key = 'wok_rejected_requests_total{model_name="builtin:tiny",reason="queue_full"}'
    assert after[key] == before[key]
    batch_key = key.replace("wok_rejected", "wok_batch_lane_rejected")
    assert after[batch_key] - before[batch_key] == 3
    assert after[f"wok_batch_lane_preemptions_total{MODEL}"] > before.get(
        f"wok_batch_lane_preemptions_total{MODEL}", 0.0
    )


def test_a_preempted_batch_request_answers_as_if_alone(tmp_path: Path):
    server = start_server(tmp_path, "--max-batch-size", "1")
    try:
        url = f"{server.url}/v1/completions"
        body = _body(150, temperature=0, return_token_ids=True)
        alone = httpx.post(url, json=body, timeout=60).json()["choices"][0]

        async def main() -> httpx.Response:
            async with httpx.AsyncClient(timeout=180) as http:
                batch = asyncio.create_task(http.post(url, json={**body, "priority": "batch"}))
                running = f"wok_batch_lane_requests_running{MODEL} 1.0"
                while running not in (await http.get(f"{server.url}/metrics")).text:
                    await asyncio.sleep(0.01)
                for _ in range(3):  # one slot: each online request takes it from the batch
                    r = await http.post(url, json=_body(8))
                    assert r.status_code == 200
                return await batch

        answer = asyncio.run(main())
        assert answer.status_code == 200
        assert int(answer.headers["x-wok-preemptions"]) >= 1
        choice = answer.json()["choices"][0]
        assert (choice["token_ids"], choice["text"]) == (alone["token_ids"], alone["text"])
    finally:
        assert server.stop() == 0, server.log()
