"""The runtime's HTTP API against a live `wok runtime serve` (builtin:tiny on the CPU): the
official OpenAI client, errors in OpenAI's shape, the admin API, the metrics contract and
client disconnects."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
from runtime_harness import (
    ADMIN_TOKEN,
    KV_BYTES_PER_TOKEN,
    SMALL_KV,
    RuntimeServer,
    start_server,
)

from wok_contracts.metrics import METRICS, series_names
from wok_contracts.traces import TraceRequest
from wok_runtime.tools.bench_http import run_bench

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("api"), "--served-model-name", "tiny")
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server: RuntimeServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


# --- the OpenAI client -----------------------------------------------------------------------


def test_models_lists_the_served_name(client: openai.OpenAI):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_completion(client: openai.OpenAI):
    out = client.completions.create(
        model="tiny",
        prompt="hello world",
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].text
    assert out.usage is not None and out.usage.completion_tokens == 8
    assert out.usage.prompt_tokens > 0


def test_completion_stream_matches_the_non_streamed_text(client: openai.OpenAI):
    kwargs = dict(
        model="tiny",
        prompt="the wok",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat(client: openai.OpenAI):
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in ("length", "stop")
    assert out.usage is not None and 0 < out.usage.completion_tokens <= 6


def test_chat_stream(client: openai.OpenAI):
    messages = [{"role": "system", "content": "be concise"}, {"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, seed=1
    )
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=10,
        temperature=0,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_token_ids_in_and_out_and_seeded_sampling(client: openai.OpenAI):
    body = {"return_token_ids": True, "ignore_eos": True}
    first = client.completions.create(
        model="tiny", prompt=[11, 12, 13], max_tokens=6, temperature=1.0, seed=7, extra_body=body
    )
    again = client.completions.create(
        model="tiny", prompt=[11, 12, 13], max_tokens=6, temperature=1.0, seed=7, extra_body=body
    )
    ids = first.choices[0].model_extra["token_ids"]
    assert len(ids) == 6
    assert again.choices[0].model_extra["token_ids"] == ids


def test_stop_string_cuts_the_text(client: openai.OpenAI):
    kwargs = dict(model="tiny", prompt="once upon", temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(max_tokens=24, **kwargs).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3
    expected = full[: full.index(stop)]
    out = client.completions.create(max_tokens=24, stop=[stop], **kwargs)
    assert out.choices[0].text == expected
    assert out.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(max_tokens=24, stop=stop, stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_priority_and_tenant_are_accepted(server: RuntimeServer):
    for headers in (
        {"X-Wok-Priority": "interactive"},
        {"X-Wok-Priority": "2"},
        {"X-Wok-Tenant": "team-a"},
    ):
        r = httpx.post(
            f"{server.url}/v1/completions",
            headers=headers,
            timeout=30,
            json={"prompt": "x", "max_tokens": 2},
        )
        assert r.status_code == 200, r.text
    r = httpx.post(
        f"{server.url}/v1/completions",
        timeout=30,
        json={"prompt": "x", "max_tokens": 2, "priority": "batch"},
    )
    assert r.status_code == 200, r.text


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"prompt": 5}', 400, "prompt"),
        (b'{"prompt": "x", "max_tokens": "many"}', 400, "max_tokens"),
        (b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"prompt": "x", "max_tokens": 100000}', 400, "max_tokens"),
        (b'{"prompt": "x", "temperature": -1}', 400, "temperature"),
        (b'{"prompt": "x", "top_p": 0}', 400, "top_p"),
        (b'{"prompt": "x", "model": "gpt-17"}', 404, "model"),
        (b'{"prompt": ""}', 400, "prompt"),
        (b'{"prompt": []}', 400, "prompt"),
        (b'{"prompt": [99999999]}', 400, "prompt"),
        (b'{"prompt": [-1]}', 400, "prompt"),
        (b'{"prompt": "x", "n": 2}', 400, "n"),
        (b'{"prompt": "x", "echo": true}', 400, "echo"),
        (b'{"prompt": "x", "priority": "vip"}', 400, "priority"),
        (b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop"),
    ],
)
def test_bad_completion_requests_get_openai_errors(server: RuntimeServer, body, status, param):
    r = httpx.post(
        f"{server.url}/v1/completions",
        content=body,
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_bad_chat_requests_and_the_openai_client_sees_them(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    assert caught.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=10**5
        )
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert caught.value.code == "model_not_found"


def test_the_models_are_retrieved_by_name(client: openai.OpenAI):
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("nope")
    assert caught.value.code == "model_not_found"


CHAT = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("call", "error", "param", "code"),
    [
        (lambda c: c.chat.completions.create(model="nope", messages=CHAT),
         openai.NotFoundError, "model", "model_not_found"),
        (lambda c: c.chat.completions.create(model="tiny", messages=[]),
         openai.BadRequestError, "messages", "invalid_value"),
        (lambda c: c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "word " * 300}], max_tokens=8),
         openai.BadRequestError, "messages", "context_length_exceeded"),
        (lambda c: c.completions.create(model="tiny", prompt=list(range(1, 250)), max_tokens=8),
         openai.BadRequestError, "prompt", "context_length_exceeded"),
        (lambda c: c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=10**5),
         openai.BadRequestError, "max_tokens", "context_length_exceeded"),
        (lambda c: c.chat.completions.create(model="tiny", messages=CHAT, reasoning_effort="low"),
         openai.BadRequestError, "reasoning_effort", "invalid_value"),
        (lambda c: c.chat.completions.create(model="tiny", messages=CHAT, logprobs=True),
         openai.BadRequestError, "logprobs", "invalid_value"),
        (lambda c: c.completions.create(model="tiny", prompt="x", extra_body={"priority": 1.5}),
         openai.BadRequestError, "priority", "invalid_value"),
    ],
)  # fmt: skip
def test_each_error_is_the_class_openai_raises(client: openai.OpenAI, call, error, param, code):
    with pytest.raises(error) as caught:
        call(client)
    assert (caught.value.param, caught.value.code) == (param, code), caught.value.body
    message = caught.value.body["message"]  # type: ignore[index]
    assert ".str" not in message and ".int" not in message, message


def test_a_body_over_the_limit_is_a_413_the_client_reads(client: openai.OpenAI):
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="tiny", prompt="x" * 9_000_000)
    assert caught.value.status_code == 413 and caught.value.code == "request_too_large"


def test_the_admin_api_errors_are_openai_classes_too(server: RuntimeServer):
    admin = openai.OpenAI(base_url=server.url, api_key="wrong-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        admin.get("/admin/v1/batching", cast_to=object)
    with pytest.raises(openai.AuthenticationError):
        admin.get("/admin/v1/nothing", cast_to=object)
    admin = admin.with_options(api_key=ADMIN_TOKEN)
    with pytest.raises(openai.NotFoundError):
        admin.get("/admin/v1/nothing", cast_to=object)
    with pytest.raises(openai.UnprocessableEntityError):
        admin.put("/admin/v1/batching", cast_to=object, body={"max_batch_size": 0})


def test_the_engine_survives_bad_input(client: openai.OpenAI):
    out = client.completions.create(model="tiny", prompt="still alive", max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens >= 1


# --- admin -----------------------------------------------------------------------------------


def test_admin_needs_the_token(server: RuntimeServer):
    url = f"{server.url}/admin/v1/batching"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong-token"}).status_code == 401
    assert httpx.put(url, json={"max_batch_size": 2}).status_code == 401
    # The token is checked before the body: an invalid one is a 401 too, not a 422.
    assert httpx.put(url, json={"max_num_batched_tokens": "x"}).status_code == 401
    r = httpx.get(url, headers=AUTH)
    assert r.status_code == 200
    assert set(r.json()) == {
        "max_batch_size",
        "max_wait_ms",
        "max_num_batched_tokens",
        "max_num_batched_tokens_limit",
        "mode",
        "capacity",
        "clamped",
    }


@pytest.mark.parametrize(
    "body",
    [
        {"max_batch_size": 0},
        {"max_batch_size": "x"},
        {"max_wait_ms": -1},
        {"other": 1},
        {"max_num_batched_tokens": 0},
        {"max_num_batched_tokens": "512"},
        {"max_num_batched_tokens": True},
        {"max_num_batched_tokens": 512.0},
        {"max_num_batched_tokens": 1 << 30},
    ],
)
def test_admin_rejects_bad_values(server: RuntimeServer, body):
    r = httpx.put(f"{server.url}/admin/v1/batching", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_admin_clamps_to_the_sequences_the_kv_pool_holds(server: RuntimeServer):
    url = f"{server.url}/admin/v1/batching"
    before = httpx.get(url, headers=AUTH).json()
    # SMALL_KV holds 61 blocks of 16 tokens; a max_model_len (256) sequence needs 16 of them.
    sequences = (SMALL_KV // KV_BYTES_PER_TOKEN // 16) // (256 // 16)
    assert before["capacity"] == sequences == 3
    try:
        r = httpx.put(url, json={"max_batch_size": 5000}, headers=AUTH)
        assert r.status_code == 200
        assert r.json()["max_batch_size"] == sequences
        assert r.json()["clamped"] == {
            "max_batch_size": "5000 clamped to 3: the sequences of max_model_len=256 tokens the "
            "KV pool holds"
        }
        r = httpx.put(url, json={"max_batch_size": 2}, headers=AUTH)
        assert r.json()["max_batch_size"] == 2 and r.json()["clamped"] == {}
    finally:
        httpx.put(url, json={"max_batch_size": before["max_batch_size"]}, headers=AUTH)


def _steps_of_one_request(server: RuntimeServer, prompt: list[int]) -> float:
    """Engine steps (each observes `wok_batch_size` once) that one greedy 2-token request takes
    on an idle server: its prefill chunks, then one decode."""
    count = 'wok_batch_size_count{model_name="tiny"}'
    before = server.metrics()[count]
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return server.metrics()[count] - before


def test_admin_moves_the_step_token_budget_live(server: RuntimeServer):
    url = f"{server.url}/admin/v1/batching"
    gauge = 'wok_max_num_batched_tokens{model_name="tiny"}'
    start = httpx.get(url, headers=AUTH).json()
    limit = start["max_num_batched_tokens_limit"]
    assert start["max_num_batched_tokens"] == limit == server.metrics()[gauge]
    # Distinct prompts of 200 tokens, so that no prefix is cached.
    assert _steps_of_one_request(server, [300 + i % 50 for i in range(200)]) == 2
    try:
        r = httpx.put(url, json={"max_num_batched_tokens": 64}, headers=AUTH)
        assert r.status_code == 200 and r.json()["max_num_batched_tokens"] == 64
        assert httpx.get(url, headers=AUTH).json()["max_num_batched_tokens"] == 64
        assert server.metrics()[gauge] == 64
        assert _steps_of_one_request(server, [400 + i % 50 for i in range(200)]) == 4 + 1
        r = httpx.put(url, json={"max_num_batched_tokens": limit + 1000}, headers=AUTH)
        assert r.status_code == 200 and r.json()["max_num_batched_tokens"] == limit
    finally:
        httpx.put(url, json={"max_num_batched_tokens": limit}, headers=AUTH)
    assert server.metrics()[gauge] == limit


def _batch_histogram(server: RuntimeServer) -> dict[str, float]:
    return {k: v for k, v in server.metrics().items() if k.startswith("wok_batch_size")}


def _run_concurrently(server: RuntimeServer, n: int, max_tokens: int) -> list[int]:
    async def go() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as http:
            body = {"prompt": [20, 21, 22, 23], "max_tokens": max_tokens, "ignore_eos": True}
            rs = await asyncio.gather(
                *(http.post(f"{server.url}/v1/completions", json=body) for _ in range(n))
            )
            return [r.status_code for r in rs]

    return asyncio.run(go())


def test_admin_batch_size_caps_the_running_batch(server: RuntimeServer):
    url = f"{server.url}/admin/v1/batching"
    le2 = 'wok_batch_size_bucket{le="2.0",model_name="tiny"}'
    count = 'wok_batch_size_count{model_name="tiny"}'
    try:
        # With the cap at 32, eight concurrent requests run in batches larger than two ...
        before = _batch_histogram(server)
        assert _run_concurrently(server, 8, 24) == [200] * 8
        after = _batch_histogram(server)
        assert after[count] - before[count] > after[le2] - before[le2]
        # ... and from the step after the PUT, never more than two.
        r = httpx.put(url, json={"max_batch_size": 2}, headers=AUTH)
        assert r.status_code == 200 and r.json()["max_batch_size"] == 2
        assert server.metrics()['wok_max_batch_size{model_name="tiny"}'] == 2
        before = _batch_histogram(server)
        running_seen: list[float] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                running_seen.append(
                    server.metrics()['vllm:num_requests_running{model_name="tiny"}']
                )

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            assert _run_concurrently(server, 8, 24) == [200] * 8
        finally:
            stop.set()
            watcher.join()
        after = _batch_histogram(server)
        assert after[count] - before[count] > 0
        assert after[count] - before[count] == after[le2] - before[le2]
        assert max(running_seen) <= 2
    finally:
        httpx.put(url, json={"max_batch_size": 32}, headers=AUTH)
    # 32 is more than the KV pool holds at max_model_len: clamped to its 3 sequences.
    assert server.metrics()['wok_max_batch_size{model_name="tiny"}'] == 3


# --- disconnects -----------------------------------------------------------------------------


def _idle(server: RuntimeServer) -> bool:
    m = server.metrics()
    return (
        m['vllm:num_requests_running{model_name="tiny"}'] == 0
        and m['wok_kv_cache_blocks{model_name="tiny",state="used"}'] == 0
    )


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_aborts_and_frees_kv(server: RuntimeServer, stream: bool):
    aborted = 'vllm:request_success_total{finished_reason="abort",model_name="tiny"}'
    before = server.metrics()[aborted]
    body = json.dumps(
        {"prompt": "a long one", "max_tokens": 240, "ignore_eos": True, "stream": stream}
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # Started, not finished: the running gauge shows it.
        wait_until(lambda: server.metrics()['vllm:num_requests_running{model_name="tiny"}'] == 1)
    wait_until(lambda: server.metrics()[aborted] == before + 1)
    wait_until(lambda: _idle(server))


# --- metrics ---------------------------------------------------------------------------------


def test_every_contract_metric_is_exported(client: openai.OpenAI, server: RuntimeServer):
    client.completions.create(model="tiny", prompt="traffic", max_tokens=4)
    text = httpx.get(f"{server.url}/metrics").text
    assert text.count("# TYPE") >= len(METRICS)
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    for spec in METRICS.values():
        for name in series_names(spec):
            assert name in exported, f"{name} is not on /metrics"
    assert 'model_name="tiny"' in text
    m = server.metrics()
    assert m['vllm:generation_tokens_total{model_name="tiny"}'] > 0
    assert m['vllm:time_to_first_token_seconds_count{model_name="tiny"}'] > 0


def test_a_shared_prefix_load_is_served_from_the_prefix_cache(server: RuntimeServer):
    hits = 'vllm:prefix_cache_hits_total{model_name="tiny"}'
    queries = 'vllm:prefix_cache_queries_total{model_name="tiny"}'
    before = server.metrics()
    specs = [TraceRequest(0.0, 8, 2)] * 6
    results, _, _ = asyncio.run(
        run_bench([server.url], specs, model="tiny", max_concurrency=1, shared_prefix_len=64)
    )
    assert all(r.ok for r in results)
    after = server.metrics()
    # One at a time: every request after the first finds the 64 shared tokens (4 blocks).
    assert after[queries] - before[queries] == 6 * (64 + 8)
    assert after[hits] - before[hits] >= 5 * 64


def test_health_endpoints(server: RuntimeServer):
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "alive"}
    assert httpx.get(f"{server.url}/readyz").json() == {"status": "ready"}
