"""`wok profile --url`: reading a server's size from its metrics, and step samples from the gaps
between the tokens it streams (the pure part; the HTTP part runs in bench/vllm/http_profile_check.py
against real servers)."""

from __future__ import annotations

import pytest

from wok_runtime.tools.bench_http import RequestResult
from wok_runtime.tools.http_profiler import (
    Injection,
    Timeline,
    parse_server_facts,
    request_overhead,
    shape_samples,
    stream_gaps,
)
from wok_runtime.tools.profiler import fit_step_costs

# Lines as vLLM 0.32's CPU server and wok's runtime print them (labels abridged to the ones read)
VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",\
num_gpu_blocks="2048",swap_space="0"} 1.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
"""
WOK_METRICS = """\
wok_max_num_batched_tokens{model_name="tiny"} 2048.0
wok_kv_cache_blocks{model_name="tiny",state="free"} 8000.0
wok_kv_cache_blocks{model_name="tiny",state="used"} 192.0
"""


def test_vllm_cache_config_gives_the_kv_pool():
    facts = parse_server_facts("tiny", 512, VLLM_METRICS)
    assert facts.engine == "vllm"
    assert (facts.block_size, facts.kv_capacity_tokens) == (128, 2048 * 128)
    assert facts.max_num_batched_tokens is None  # vLLM does not export it: a flag gives it


def test_wok_metrics_give_the_pool_and_the_step_budget():
    facts = parse_server_facts("tiny", 512, WOK_METRICS)
    assert facts.engine == "wok"
    assert facts.kv_capacity_tokens == (8000 + 192) * 16
    assert facts.max_num_batched_tokens == 2048


def test_a_server_without_either_metrics_says_nothing():
    facts = parse_server_facts("m", None, "")
    assert (facts.engine, facts.kv_capacity_tokens, facts.max_num_batched_tokens) == (
        "openai",
        None,
        None,
    )


def test_a_merged_chunk_counts_as_its_steps():
    line = Timeline(0.0, [1.0, 1.01, 1.05], [1, 1, 4])
    gaps = stream_gaps(line)
    assert [round(g.seconds, 4) for g in gaps] == [0.01, 0.01]
    assert [g.token for g in gaps] == [1, 5]


def synthetic_background(decodes, context, *, a, b, c, d, tokens, inject):
    """Streams of a server whose steps cost exactly a + b·decodes + c·prefill + d·context, with
    prompts injected before the given background tokens: (timelines, injections)."""
    t, times, injections = 0.0, [], []
    for j in range(tokens):
        prefill = inject.get(j, 0)
        before = t
        t += a + b * decodes + c * prefill + d * (decodes * (context + j) + prefill)
        times.append(t)
        if prefill:  # sent during the step before; its token streams a little after the step's
            injections.append(Injection(prefill, before - 0.001, t + 0.0003))
    lines = [Timeline(0.0, times, [1] * tokens) for _ in range(decodes)]
    return lines, injections


def test_gaps_of_a_known_server_fit_back_its_costs():
    costs = {"a": 0.004, "b": 0.0005, "c": 0.0002, "d": 2e-6}
    samples = []
    for decodes in (1, 4, 16):
        for context in (64, 256):
            inject = {20: 32, 40: 128, 60: 32, 80: 128}
            lines, injections = synthetic_background(
                decodes, context, tokens=100, inject=inject, **costs
            )
            got = shape_samples(lines, injections, context=context)
            assert [s.prefill_tokens for s in got] == [0, 32, 128]
            assert got[1].repeats == 2
            samples += got
    fit = fit_step_costs(samples)
    # the context of a shape is its median token's: the fit is close, not exact
    assert fit.a_s == pytest.approx(costs["a"], rel=0.1)
    assert fit.b_s_per_seq == pytest.approx(costs["b"], rel=0.1)
    assert fit.c_s_per_prefill_token == pytest.approx(costs["c"], rel=0.05)
    assert fit.median_abs_rel_error < 0.02


def test_an_injection_the_background_did_not_share_is_dropped():
    lines, _ = synthetic_background(2, 64, a=0.01, b=0, c=0, d=0, tokens=30, inject={})
    got = shape_samples(lines, [Injection(64, 98.0, 99.0)], context=64)
    assert [s.prefill_tokens for s in got] == [0]


def test_bunched_tokens_keep_the_mean_step():
    # a late chunk then an early one: the median gap is 4 ms, the steps take 10 ms on average
    times = [0.01 * j + (0.008 if j % 2 else 0.0) for j in range(40)]
    got = shape_samples([Timeline(0.0, times, [1] * 40)], [], context=16)
    assert got[0].seconds == pytest.approx(0.01, rel=0.05)


def test_a_background_without_timed_steps_is_an_error():
    with pytest.raises(ValueError, match="no timed steps"):
        shape_samples([Timeline(0.0, [0.1, 0.2], [1, 1])], [], context=8)


def lone(e2e_s: float, token_times: list[float], status: int = 200) -> tuple[float, RequestResult]:
    result = RequestResult(status=status, ttft_s=token_times[0], e2e_s=e2e_s)
    result.token_times = token_times
    return (0.0, result)


def test_a_lone_request_s_time_outside_its_steps_is_the_request_overhead():
    # a 10 ms prefill step; outside the steps: 8, 10 and 6 ms; the median
    lones = [lone(0.048, [0.012, 0.022, 0.042]), lone(0.052, [0.020, 0.052]), lone(0.016, [0.012])]
    assert request_overhead(lones, prefill_step_s=0.010) == pytest.approx(0.008)


def test_no_lone_request_answered_is_an_error():
    with pytest.raises(RuntimeError, match="per-request cost"):
        request_overhead([lone(0.05, [0.01], status=503)], prefill_step_s=0.01)
