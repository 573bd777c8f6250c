"""The server's pure pieces: the metric-name contract and its collector, stop strings over
incremental detokenization, request validation, and the HTTP benchmark's arithmetic."""

from __future__ import annotations

import asyncio
import json
import math
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from starlette.requests import Request
from test_bench_engine import REQUIRED_KEYS

from wok_contracts import metrics as m
from wok_contracts.traces import TraceRequest
from wok_runtime.core.engine import EngineStats, StepStats
from wok_runtime.core.kv_memory import KvMemory
from wok_runtime.core.sequence import RequestMetrics
from wok_runtime.http.detokenizer import IncrementalText
from wok_runtime.http.metrics import RuntimeMetrics
from wok_runtime.http.protocol import (
    BatchingUpdate,
    ChatCompletionRequest,
    CompletionRequest,
    lone_surrogate,
)
from wok_runtime.http.serve import listen_socket
from wok_runtime.http.server import APIError, AuthFailureLog, Server
from wok_runtime.http.server_config import ServerConfig, parse_priority_classes
from wok_runtime.tools.bench_http import (
    RequestResult,
    check_loopback,
    sse_lines,
    summarize,
    trace_specs,
)

# --- metric names ----------------------------------------------------------------------------


def test_metric_names_are_the_contract():
    assert m.METRIC_NAMES == {
        "vllm:num_requests_waiting": "gauge",
        "vllm:num_requests_running": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_inference_time_seconds": "histogram",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "wok_max_batch_size": "gauge",
        "wok_max_num_batched_tokens": "gauge",
        "wok_batch_size": "histogram",
        "wok_rejected_requests": "counter",
        "wok_queue_length": "gauge",
        "wok_kv_cache_blocks": "gauge",
        "wok_kv_cache_budget_bytes": "gauge",
        "wok_kv_cache_measured_bytes": "gauge",
        "wok_batch_lane_requests_waiting": "gauge",
        "wok_batch_lane_requests_running": "gauge",
        "wok_batch_lane_pending_tokens": "gauge",
        "wok_batch_lane_kv_cache_blocks": "gauge",
        "wok_batch_lane_generation_tokens": "counter",
        "wok_batch_lane_request_success": "counter",
        "wok_batch_lane_e2e_request_latency_seconds": "histogram",
        "wok_batch_lane_rejected_requests": "counter",
        "wok_batch_lane_preemptions": "counter",
        "wok_admin_auth_failures": "counter",
    }
    assert m.series_names(m.METRICS[m.NUM_PREEMPTIONS]) == ("vllm:num_preemptions_total",)
    assert m.series_names(m.METRICS[m.BATCH_SIZE]) == (
        "wok_batch_size_bucket",
        "wok_batch_size_sum",
        "wok_batch_size_count",
    )
    for spec in m.METRICS.values():
        assert list(spec.buckets) == sorted(spec.buckets)


def _stats(**changes) -> EngineStats:
    base = dict(
        num_waiting=3,
        num_running=2,
        waiting_by_priority={0: 1, 2: 2},
        kv_blocks_total=10,
        kv_blocks_used=4,
        kv_blocks_free=6,
        kv_usage=0.4,
        max_batch_size=8,
        max_num_batched_tokens=2048,
        num_preemptions_total=5,
        prefix_cache_queries=40,
        prefix_cache_hits=32,
    )
    return EngineStats(**{**base, **changes})


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_collector_exports_every_name_and_reads_the_engine_at_scrape_time():
    stats = [_stats()]
    kv = KvMemory("cuda", budget_bytes=1000, measured_bytes=1200)
    metrics = RuntimeMetrics("tiny", lambda: stats[0], priorities=(0, 1, 2), kv_memory=kv)
    metrics.observe_step(
        StepStats(
            batch_size=3,
            num_prefill_tokens=0,
            num_decode_tokens=3,
            num_preempted=0,
            step_seconds=0.01,
            num_sampled=3,
            num_running=3,
            num_waiting=0,
            max_batch_size=8,
            kv_usage=0.1,
        )
    )
    timing = RequestMetrics(
        arrival_time=10.0,
        first_scheduled_time=10.5,
        first_token_time=11.0,
        last_token_time=12.0,
        finished_time=12.0,
        num_prompt_tokens=4,
        num_output_tokens=3,
        num_preemptions=0,
    )
    metrics.observe_tokens(1, None)
    metrics.observe_tokens(2, 0.2)
    metrics.observe_finished(finish_reason="length", metrics=timing)
    metrics.reject(m.REJECT_QUEUE_FULL)
    metrics.auth_failed(m.AUTH_INVALID)
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    s = _samples(body.decode())
    for spec in m.METRICS.values():
        for name in m.series_names(spec):
            assert any(key.split("{")[0] == name for key in s), name
    assert s['vllm:num_requests_waiting{model_name="tiny"}'] == 3
    assert s['vllm:prefix_cache_queries_total{model_name="tiny"}'] == 40
    assert s['vllm:prefix_cache_hits_total{model_name="tiny"}'] == 32
    assert s['wok_queue_length{model_name="tiny",priority="1"}'] == 0  # configured, empty
    assert s['wok_queue_length{model_name="tiny",priority="2"}'] == 2
    assert s['wok_kv_cache_blocks{model_name="tiny",state="used"}'] == 4
    assert s['vllm:num_preemptions_total{model_name="tiny"}'] == 5
    assert s['vllm:time_to_first_token_seconds_sum{model_name="tiny"}'] == 1.0
    assert s['vllm:request_queue_time_seconds_sum{model_name="tiny"}'] == 0.5
    assert s['vllm:e2e_request_latency_seconds_sum{model_name="tiny"}'] == 2.0
    # (last token 12.0 - first token 11.0) / (3 tokens - 1)
    assert s['vllm:request_time_per_output_token_seconds_sum{model_name="tiny"}'] == 0.5
    assert s['vllm:request_time_per_output_token_seconds_count{model_name="tiny"}'] == 1
    assert s['vllm:inter_token_latency_seconds_count{model_name="tiny"}'] == 2
    assert s['vllm:generation_tokens_total{model_name="tiny"}'] == 3
    assert s['vllm:request_success_total{finished_reason="length",model_name="tiny"}'] == 1
    assert s['wok_rejected_requests_total{model_name="tiny",reason="queue_full"}'] == 1
    assert s['wok_admin_auth_failures_total{model_name="tiny",reason="invalid"}'] == 1
    assert s['wok_admin_auth_failures_total{model_name="tiny",reason="missing"}'] == 0
    assert s['wok_batch_size_bucket{le="4.0",model_name="tiny"}'] == 1
    assert s['wok_batch_size_bucket{le="2.0",model_name="tiny"}'] == 0
    assert s['wok_kv_cache_budget_bytes{device="cuda",model_name="tiny"}'] == 1000
    assert s['wok_kv_cache_measured_bytes{device="cuda",model_name="tiny"}'] == 1200
    assert s['wok_max_num_batched_tokens{model_name="tiny"}'] == 2048
    stats[0] = _stats(max_batch_size=2, max_num_batched_tokens=512)
    live = _samples(metrics.render()[0].decode())
    assert live['wok_max_batch_size{model_name="tiny"}'] == 2
    assert live['wok_max_num_batched_tokens{model_name="tiny"}'] == 512


def test_the_batch_lane_never_shows_in_the_vllm_series():
    """The operator sums the vLLM series (and wok_rejected_requests) to scale for the online
    lane: batch work has its own wok_batch_lane_* series and leaves those untouched."""
    stats = _stats(
        num_waiting=0,
        num_running=1,
        batch_waiting=40,
        batch_running=7,
        batch_kv_blocks=3,
        batch_preemptions_total=9,
        batch_pending_tokens=1234,
    )
    metrics = RuntimeMetrics("tiny", lambda: stats, priorities=(0, 1, 2))
    timing = RequestMetrics(
        arrival_time=10.0,
        first_scheduled_time=10.5,
        first_token_time=11.0,
        last_token_time=14.0,
        finished_time=14.0,
        num_prompt_tokens=4,
        num_output_tokens=5,
        num_preemptions=2,
    )
    metrics.observe_tokens(1, None, lane="batch")
    metrics.observe_tokens(4, 3.0, lane="batch")
    metrics.observe_finished(finish_reason="length", metrics=timing, lane="batch")
    metrics.reject(m.REJECT_QUEUE_FULL, lane="batch")
    s = _samples(metrics.render()[0].decode())
    model = '{model_name="tiny"}'
    untouched = [
        "vllm:generation_tokens_total",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:prompt_tokens_total",
        'vllm:request_success_total{finished_reason="length",model_name="tiny"}',
        'wok_rejected_requests_total{model_name="tiny",reason="queue_full"}',
    ]
    assert [s[k if "{" in k else k + model] for k in untouched] == [0] * len(untouched)
    assert (s[f"vllm:num_requests_waiting{model}"], s[f"vllm:num_requests_running{model}"]) == (
        0,
        1,
    )
    batch = {
        "wok_batch_lane_requests_waiting": 40,
        "wok_batch_lane_requests_running": 7,
        "wok_batch_lane_pending_tokens": 1234,
        "wok_batch_lane_kv_cache_blocks": 3,
        "wok_batch_lane_preemptions_total": 9,
        "wok_batch_lane_generation_tokens_total": 5,
        "wok_batch_lane_e2e_request_latency_seconds_sum": 4.0,
        'wok_batch_lane_request_success_total{finished_reason="length",model_name="tiny"}': 1,
        'wok_batch_lane_rejected_requests_total{model_name="tiny",reason="queue_full"}': 1,
    }
    assert {k: s[k if "{" in k else k + model] for k in batch} == batch


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def test_the_lane_comes_from_the_body_or_the_lane_header_never_the_priority_header():
    engine = SimpleNamespace(vocab_size=10, stats=lambda: _stats())
    config = ServerConfig(served_model_name="m")
    server = Server(engine, config, RuntimeMetrics("m", engine.stats))
    assert server.route(_request({}), None) == ("online", 1)
    assert server.route(_request({}), "batch") == ("batch", 2)  # the class keeps its number
    assert server.route(_request({}), "online") == ("online", 1)
    assert server.route(_request({}), 2) == ("online", 2)
    assert server.route(_request({"X-Wok-Lane": "batch"}), None) == ("batch", 1)
    assert server.route(_request({"X-Wok-Lane": "Online"}), "batch") == ("online", 2)
    assert server.route(_request({"X-Wok-Priority": "batch"}), None) == ("online", 2)
    assert server.route(_request({"X-Wok-Priority": "0"}), "batch") == ("batch", 0)
    classes = ServerConfig(served_model_name="m", priority_classes={"high": 0, "low": 5})
    server = Server(engine, classes, RuntimeMetrics("m", engine.stats))
    assert server.route(_request({}), "batch") == ("batch", 1)  # not a class: the default
    with pytest.raises(APIError, match="X-Wok-Lane: use online or batch") as caught:
        server.route(_request({"X-Wok-Lane": "offline"}), None)
    assert caught.value.status == 400
    with pytest.raises(APIError, match="a lane: online or batch"):
        server.route(_request({}), "bulk")
    # Unicode digits that int() cannot read ("²" is a digit to str.isdigit) are a 400, not a 500.
    with pytest.raises(APIError, match="unknown priority") as caught:
        server.route(_request({}), "²")
    assert caught.value.status == 400


# --- stop strings ----------------------------------------------------------------------------

VOCAB = ["he", "llo", " wo", "rld", "!", " st", "op", "\ufffd"]


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def test_text_without_stops_is_released_as_it_comes():
    text = IncrementalText(decode, [])
    assert text.add([0]) == "he"
    assert text.add([1, 2]) == "llo wo"
    assert text.add([3], final=True) == "rld"
    assert text.text == "hello world" and not text.stopped


def test_a_stop_string_across_tokens_is_never_shown():
    text = IncrementalText(decode, ["o wor", "zzz"])
    shown = text.add([0]) + text.add([1]) + text.add([2])
    assert "o w" not in shown  # held back: it may be the start of the stop string
    shown += text.add([3])
    assert text.stopped
    assert shown == "hell" == text.text
    assert text.add([4]) == ""


def test_the_earliest_stop_wins_and_the_tail_is_flushed_at_the_end():
    text = IncrementalText(decode, ["!", "llo"])
    assert text.add([0, 1, 2, 3, 4]) == "he"
    assert text.stopped
    text = IncrementalText(decode, ["xyz"])
    assert text.add([0, 1]) == "hel"
    assert text.add([], final=True) == "lo"


def test_an_incomplete_character_is_held_back():
    text = IncrementalText(decode, [])
    assert text.add([0, 7]) == "he"
    assert text.add([1], final=True) == "\ufffdllo"


# --- request validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "max_tokens": 0},
        {"prompt": "x", "temperature": 2.5},
        {"prompt": "x", "top_p": 0},
        {"prompt": "x", "n": 3},
        {"prompt": [-1]},
        {"prompt": []},
        {"prompt": ["a", "b"]},
        {"prompt": "x", "stop": ["a"] * 5},
        {"prompt": "x", "temperature": math.nan},
        # As strict as the OpenAI API's JSON types: nothing is coerced.
        {"prompt": "x", "max_tokens": "4"},
        {"prompt": "x", "max_tokens": 4.0},
        {"prompt": "x", "stream": "yes"},
        {"prompt": "x", "echo": 0},
        {"prompt": [1, True]},
        {"prompt": "x", "stop": 5},
        # Asked for, not implemented: refused rather than ignored.
        {"prompt": "x", "logprobs": 1},
        {"prompt": "x", "best_of": 2},
        {"prompt": "x", "best_of": True},
        {"prompt": "x", "presence_penalty": 0.1},
        {"prompt": "\ud800"},
    ],
)
def test_invalid_completion_requests_are_refused(body):
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate(body)


def test_requests_accept_openai_shapes():
    assert CompletionRequest.model_validate({"prompt": [[1, 2]], "stop": "x"}).stop_strings() == [
        "x"
    ]
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "max_completion_tokens": 3,
            "unknown_field": 1,
        }
    )
    assert chat.messages[0].text() == "ab"
    with pytest.raises(ValidationError):
        BatchingUpdate.model_validate({"max_batch_size": 2, "typo": 1})
    for strict in ({"max_batch_size": True}, {"max_batch_size": "8"}):
        with pytest.raises(ValidationError):
            BatchingUpdate.model_validate(strict)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt": ["a", "b"]}, "a list of 2 prompts is not supported"),
        ({"prompt": "x", "stop": ["a"] * 5}, "at most 4 stop strings are supported, got 5"),
        ({"prompt": "x", "logprobs": 2}, "not supported by this server: leave logprobs out"),
        ({"prompt": "x\udfff"}, "prompt holds a lone UTF-16 surrogate"),
    ],
)
def test_refusals_read_plainly(body, says):
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate(body)
    assert says in caught.value.errors()[0]["msg"]


def test_lone_surrogates_are_found_with_their_path():
    assert lone_surrogate({"a": ["ok", {"b": "x\ud800"}]}) == "a.1.b"
    assert lone_surrogate({"\udc00": 1}) == "a field name"
    assert lone_surrogate({"a": "\U0001f600 paired"}) is None


def test_failed_admin_logins_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture):
    now = [0.0]
    failures = AuthFailureLog(interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="wok.runtime.server"):
        for i in range(300):  # 300 guesses in 3 s
            now[0] = i / 100
            failures.failed("10.0.0.7", "invalid")
        now[0] = 12.0
        failures.failed("10.0.0.7", "missing")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("admin API: 1 failed authentication(s)")
    assert lines[1].startswith("admin API: 300 failed authentication(s)")  # 299 held, + 1
    assert "10.0.0.7: missing bearer token" in lines[1]


def test_priority_classes_and_server_config():
    assert parse_priority_classes("interactive=0, standard=1,batch=2") == {
        "interactive": 0,
        "standard": 1,
        "batch": 2,
    }
    for bad in ("a", "a=x", "=1", "a=-1", "a=²"):
        with pytest.raises(ValueError):
            parse_priority_classes(bad)
    with pytest.raises(ValueError):
        ServerConfig(served_model_name="m", admin_token="short")
    with pytest.raises(ValueError):
        ServerConfig(served_model_name="m", drain_seconds=-1)
    with pytest.raises(ValueError):
        ServerConfig(served_model_name="m", unready_seconds=float("nan"))
    assert ServerConfig(served_model_name="m").max_priority == 2


# --- the HTTP benchmark's arithmetic ---------------------------------------------------------


def test_trace_replay_is_relative_sped_up_and_clipped(tmp_path: Path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:05.9799600,100,700\n"
    )
    specs = trace_specs(str(trace), n=10, speedup=2.0, max_input_len=256, max_output_len=64)
    assert specs == [TraceRequest(0.0, 256, 10), TraceRequest(1.0, 100, 64)]


def test_only_loopback_targets():
    assert check_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_loopback("http://localhost:1")
    with pytest.raises(ValueError):
        check_loopback("http://10.1.2.3:8000")
    with pytest.raises(ValueError):
        check_loopback("ftp://127.0.0.1")


def test_summary_keys_and_goodput():
    ok = RequestResult(
        status=200,
        ttft_s=0.1,
        e2e_s=1.0,
        output_tokens=10,
        expected_tokens=10,
        token_times=[0.1 * i for i in range(1, 11)],
    )
    slow = RequestResult(status=200, ttft_s=0.1, e2e_s=9.0, output_tokens=10, expected_tokens=10)
    report = summarize(
        [ok, slow, RequestResult(status=429), RequestResult(status=503)],
        2.0,
        mean_batch_size=3.0,
        slo_e2e_s=5.0,
    )
    # The engine benchmark's keys, plus what only HTTP can see.
    assert report.keys() >= REQUIRED_KEYS | {"rejected", "goodput_per_s"}
    assert report["requests_per_s"] == 1.0
    assert report["goodput_per_s"] == 0.5
    assert report["rejected"] == 1 and report["unavailable"] == 1
    assert report["e2e_p99_s"] == 9.0 and report["e2e_p50_s"] == 1.0
    assert report["tpot_p50_s"] == pytest.approx(0.1)
    assert report["tpot_p99_s"] == pytest.approx(8.9 / 9)  # the slow one


# --- chat prompts ----------------------------------------------------------------------------


def _tokenizer(template: str | None):
    import tokenizers

    from wok_runtime.core.tokenizer import Tokenizer

    return Tokenizer(
        tokenizers.Tokenizer(tokenizers.models.BPE()), eos_token_id=None, chat_template=template
    )


def test_chat_prompt_uses_the_template_or_the_documented_fallback():
    from wok_runtime.http.protocol import ChatMessage
    from wok_runtime.http.server import APIError, _format_chat_prompt

    messages = [
        ChatMessage(role="system", content="be concise"),
        ChatMessage(role="user", content="hi"),
    ]
    assert _format_chat_prompt(_tokenizer(None), messages, True) == (
        "<|system|>\nbe concise\n<|user|>\nhi\n<|assistant|>\n"
    )
    own = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    assert _format_chat_prompt(_tokenizer(own), messages, True) == "[system]be concise[user]hi"
    broken = "{{ raise_exception('no system role') }}"
    with pytest.raises(APIError) as caught:
        _format_chat_prompt(_tokenizer(broken), messages, True)
    assert caught.value.status == 400


def test_incremental_text_is_the_full_decode_and_decodes_a_window_only():
    from wok_runtime.core.builtin import ensure_builtin_tokenizer
    from wok_runtime.core.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(ensure_builtin_tokenizer("tiny"))
    ids = tokenizer.encode("naïve café — 東京 🍜 " * 40)
    decoded = 0

    def counting_decode(part: list[int]) -> str:
        nonlocal decoded
        decoded += len(part)
        return tokenizer.decode(part)

    text = IncrementalText(counting_decode, [])
    shown = "".join(text.add([t]) for t in ids) + text.add([], final=True)
    assert shown == tokenizer.decode(ids)
    assert "\ufffd" not in shown
    assert decoded < 12 * len(ids)  # re-decoding everything each time would be len² / 2


def test_the_kv_budget_and_the_measured_room_differ_past_ten_percent():
    assert not KvMemory("cuda", 1000, 1100).differs()
    assert not KvMemory("cuda", 1000, 900).differs()
    assert KvMemory("cuda", 1000, 1101).differs()
    assert KvMemory("cuda", 1000, 899).differs()
    # The simulated accelerator has no bytes: no KV byte gauges at all.
    body = RuntimeMetrics("sim", _stats).render()[0].decode()
    assert m.KV_CACHE_BUDGET_BYTES not in body and m.KV_CACHE_MEASURED_BYTES not in body


# --- the engine-to-loop bridge ----------------------------------------------------------------


def test_one_engine_step_wakes_the_event_loop_once_for_all_its_requests():
    """8 requests' first tokens come from one step: one loop wake-up delivers all of them, each
    to its own handler. The step runs on the loop's thread here, so no delivery can slip in
    between two outputs and the count is exact."""
    import asyncio

    from wok_runtime.core.engine import EngineConfig, LLMEngine
    from wok_runtime.core.model_runner import ModelRunner
    from wok_runtime.core.sampling_params import SamplingParams

    runner = ModelRunner.from_source(
        "builtin:tiny", kv_cache_bytes=32 * 16 * 4096, block_size=16, max_model_len=64
    )
    engine = LLMEngine(runner, EngineConfig(max_batch_size=8))
    server = Server(engine, ServerConfig(served_model_name="m"), RuntimeMetrics("m", engine.stats))

    async def one_step() -> tuple[int, list[list[int]]]:
        loop = asyncio.get_running_loop()
        wakeups = 0
        schedule = loop.call_soon_threadsafe

        def counting(*args: object) -> object:
            nonlocal wakeups
            wakeups += 1
            return schedule(*args)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        tracked = [
            server.submit([10 + i, 20, 30], params, priority=1, tenant=None) for i in range(8)
        ]
        assert engine.step()
        outputs = [await asyncio.wait_for(t.queue.get(), 5) for t in tracked]
        step_wakeups = wakeups
        for t in tracked:
            server.abort(t)
        engine.step()  # the aborts free the KV blocks
        return step_wakeups, [out.new_token_ids for out in outputs]

    wakeups, new_ids = asyncio.run(one_step())
    assert wakeups == 1
    assert [len(ids) for ids in new_ids] == [1] * 8


@pytest.mark.parametrize("chat", [False, True])
def test_a_streamed_chunk_from_the_template_is_the_models_json_byte_for_byte(chat: bool):
    from wok_runtime.http import protocol as p
    from wok_runtime.http.openai_routes import _ChunkRenderer, _sse

    def make_chunk(new: str, ids: list[int] | None, reason: str | None, first: bool) -> object:
        if chat:
            delta = p.ChatDelta(role="assistant", content="") if first else p.ChatDelta(content=new)
            choice = p.ChatChunkChoice(delta=delta, finish_reason=reason, token_ids=ids)
            return p.ChatCompletionChunk(id="c-1", created=7, model='m "q"', choices=[choice])
        choice = p.CompletionChoice(text=new, finish_reason=reason, token_ids=ids)
        return p.CompletionResponse(id="c-1", created=7, model="m", choices=[choice])

    renderer = _ChunkRenderer(make_chunk)  # type: ignore[arg-type]
    texts = ["", "a", ' "quoted" \\ back', "\n\t\r\b\f\x00\x1f\x7f", "é€😀\u2028\ufffd"]
    texts.append("".join(map(chr, range(0x800))))
    for new in texts:
        assert renderer.event(new, None, None) == _sse(make_chunk(new, None, None, False))  # type: ignore[arg-type]
    for ids in ([], [0], [5, 6], list(range(40))):
        assert renderer.event("é", ids, None) == _sse(make_chunk("é", ids, None, False))  # type: ignore[arg-type]
    for ids, reason in (([5, 6], None), (None, "stop"), ([7], "length")):
        assert renderer.event("x", ids, reason) == _sse(make_chunk("x", ids, reason, False))  # type: ignore[arg-type]
    # A model name that holds the marker cannot be templated: every chunk is built.
    marked = _ChunkRenderer(
        lambda new, ids, reason, first: p.CompletionResponse(
            id="c", created=1, model=_ChunkRenderer._TEXT, choices=[p.CompletionChoice(text=new)]
        )
    )
    for ids in (None, [3]):
        event = json.loads(marked.event("hi", ids, None)[len("data: ") :])
        assert event["choices"][0]["text"] == "hi"


def test_a_request_still_gets_its_tokens_after_another_event_loop_has_submitted():
    """One mailbox per loop: a second loop's request must not strand the first loop's outputs."""
    import asyncio
    import threading

    from wok_runtime.core.engine import EngineConfig, LLMEngine
    from wok_runtime.core.model_runner import ModelRunner
    from wok_runtime.core.sampling_params import SamplingParams

    runner = ModelRunner.from_source(
        "builtin:tiny", kv_cache_bytes=32 * 16 * 4096, block_size=16, max_model_len=64
    )
    engine = LLMEngine(runner, EngineConfig(max_batch_size=8))
    server = Server(engine, ServerConfig(served_model_name="m"), RuntimeMetrics("m", engine.stats))
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    async def submit_elsewhere() -> None:
        server.submit([7, 8], params, priority=1, tenant=None)

    async def first() -> list[int]:
        tracked = server.submit([10, 20, 30], params, priority=1, tenant=None)
        other = threading.Thread(target=asyncio.run, args=(submit_elsewhere(),))
        other.start()
        other.join()
        assert engine.step()  # both requests' only token: both finish
        out = await asyncio.wait_for(tracked.queue.get(), 5)
        assert out.finished
        return out.new_token_ids

    assert len(asyncio.run(first())) == 1


def test_the_listening_socket_says_it_is_tcp_so_that_connections_get_nodelay():
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; on one made with
    # proto 0 every answer written in two parts waited 40 ms for a delayed ACK.
    sock = listen_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        sock.listen()
        client = socket.create_connection(sock.getsockname())
        accepted, _ = sock.accept()
        with client, accepted:
            assert accepted.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def test_sse_lines_end_only_at_line_feeds_not_at_unicode_line_separators() -> None:
    # a detokenized chunk holding U+2028 and U+0085, and a UTF-8 character cut between reads
    event = 'data: {"text": "a\u2028b\u0085c é"}'.encode()
    parts = [event[:20], event[20:-2], event[-2:] + b"\r\n\r\ndata: [DONE]\n"]

    async def collect() -> list[str]:
        return [line async for line in sse_lines(_chunks(parts))]

    lines = asyncio.run(collect())
    assert lines == [event.decode(), "", "data: [DONE]"]
    assert json.loads(lines[0].removeprefix("data: "))["text"] == "a\u2028b\u0085c é"


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool", "developer"])
@pytest.mark.parametrize("content", [None, "hi"])
def test_the_chat_schema_says_which_messages_need_content_as_the_validator_does(
    role: str, content: str | None
) -> None:
    import jsonschema_rs

    schema = ChatCompletionRequest.model_json_schema()
    message = {"role": role} if content is None else {"role": role, "content": content}
    body = {"model": "m", "messages": [message]}
    try:
        ChatCompletionRequest.model_validate(body)
        accepted = True
    except ValidationError:
        accepted = False
    assert jsonschema_rs.validator_for(schema).is_valid(body) == accepted
