"""Trace readers and rate scaling of the fleet simulator."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from wok_contracts.traces import (
    OVERLAY_JITTER_S,
    TraceRequest,
    clip_to_model,
    cut_window,
    load_trace,
    parse_splice,
    parse_window,
    poisson,
    read_azure,
    read_mooncake,
    scale_rate,
    splice,
    uniform_poisson,
)

AZURE_HEAD = Path(__file__).parents[1] / "data" / "azure_llm_2023_code_head.csv"


def test_azure_reader_on_the_real_trace_head():
    rows = read_azure(AZURE_HEAD)
    assert len(rows) == 400
    assert rows[0] == TraceRequest(0.0, 4808, 10)
    assert rows[1].arrival_s == pytest.approx(0.052)  # 18:17:04.03196 - 18:17:03.97996
    assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(rows))
    assert len(read_azure(AZURE_HEAD, limit=7)) == 7


def test_mooncake_reader(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [
        {"timestamp": 3000, "input_length": 10, "output_length": 2},
        {"timestamp": 1000, "input_length": 5, "output_length": 1, "hash_ids": [1]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert read_mooncake(path) == [TraceRequest(0.0, 5, 1, (1,)), TraceRequest(2.0, 10, 2)]
    assert load_trace(str(path)) == read_mooncake(path)


@pytest.mark.parametrize(
    ("name", "text", "reader"),
    [
        ("bad.csv", "a,b\n1,2\n", read_azure),
        ("bad.jsonl", '{"timestamp": 1}\n', read_mooncake),
        ("empty.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", read_azure),
    ],
)
def test_malformed_traces_are_value_errors(tmp_path, name, text, reader):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        reader(path)


def test_a_missing_trace_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_trace(str(tmp_path / "nope.csv"))


def test_poisson_is_seeded_and_has_its_rate():
    a = poisson(10.0, 200.0, seed=4)
    assert a == poisson(10.0, 200.0, seed=4)
    assert a != poisson(10.0, 200.0, seed=5)
    assert len(a) == pytest.approx(2000, rel=0.07)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in a)


def test_uniform_poisson_has_its_rate_and_lengths_and_arrivals_that_ignore_the_lengths():
    requests = uniform_poisson(4000, rate=10.0, prompt_tokens=(3, 9), output_tokens=(4, 4), seed=1)
    assert requests[0].arrival_s == 0.0
    assert 9.0 < len(requests) / requests[-1].arrival_s < 11.0
    assert {r.prompt_tokens for r in requests} == set(range(3, 10))
    assert {r.output_tokens for r in requests} == {4}
    fixed = uniform_poisson(4000, rate=10.0, prompt_tokens=(5, 5), output_tokens=(1, 1), seed=1)
    assert [r.arrival_s for r in fixed] == [r.arrival_s for r in requests]
    assert fixed != uniform_poisson(4000, rate=10.0, prompt_tokens=(5, 5), output_tokens=(1, 1))
    burst = uniform_poisson(5, rate=math.inf, prompt_tokens=(1, 1), output_tokens=(1, 1))
    assert burst == [TraceRequest(0.0, 1, 1)] * 5
    with pytest.raises(ValueError, match="rate"):
        uniform_poisson(1, rate=0.0, prompt_tokens=(1, 1), output_tokens=(1, 1))


def test_compress_divides_arrival_times():
    rows = [TraceRequest(0.0, 1, 1), TraceRequest(30.0, 2, 3)]
    assert scale_rate(rows, 3.0, mode="compress") == [
        TraceRequest(0.0, 1, 1),
        TraceRequest(10.0, 2, 3),
    ]


def test_overlay_keeps_the_clock_and_adds_jittered_copies():
    rows = read_azure(AZURE_HEAD)
    span = rows[-1].arrival_s
    scaled = scale_rate(rows, 2.5, mode="overlay", seed=1)
    # 1.5 copies on average: one each, plus one more for about half of them.
    assert len(scaled) == pytest.approx(2.5 * len(rows), rel=0.05)
    assert min(r.arrival_s for r in scaled) >= 0.0 and max(r.arrival_s for r in scaled) <= span
    assert sorted(r.arrival_s for r in scaled) == [r.arrival_s for r in scaled]
    originals = {(r.prompt_tokens, r.output_tokens) for r in rows}
    assert {(r.prompt_tokens, r.output_tokens) for r in scaled} == originals
    assert scaled == scale_rate(rows, 2.5, mode="overlay", seed=1)
    # Every copy sits within the jitter of some original with its lengths.
    by_lengths: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        by_lengths.setdefault((r.prompt_tokens, r.output_tokens), []).append(r.arrival_s)
    for r in scaled:
        times = by_lengths[(r.prompt_tokens, r.output_tokens)]
        assert min(abs(r.arrival_s - t) for t in times) <= OVERLAY_JITTER_S + 1e-9


def test_overlay_copies_do_not_pile_up_at_the_trace_ends():
    # A steady 2 req/s for 120 s: copies jittered past either end come back inside the span
    # (reflected), so the first and last 10 s hold about as many as any other 10 s.
    rows = [TraceRequest(i * 0.5, 100, 10) for i in range(241)]
    scaled = scale_rate(rows, 4.0, mode="overlay", seed=3)
    span = rows[-1].arrival_s
    at_ends = sum(r.arrival_s in (0.0, span) for r in scaled)
    assert at_ends <= 4  # the two originals and their copies' rare exact hits, not a pile
    per_bin = [sum(10 * k <= r.arrival_s < 10 * (k + 1) for r in scaled) for k in range(12)]
    middle = sum(per_bin[3:9]) / 6
    assert 0.75 * middle <= per_bin[0] <= 1.25 * middle
    assert 0.75 * middle <= per_bin[-1] <= 1.25 * middle


@pytest.mark.parametrize(
    ("factor", "mode"), [(0.0, "compress"), (-1.0, "overlay"), (0.5, "overlay"), (2.0, "x")]
)
def test_bad_scaling_is_a_value_error(factor, mode):
    with pytest.raises(ValueError):
        scale_rate([TraceRequest(0.0, 1, 1)], factor, mode=mode)


def test_clip_to_model():
    rows = [TraceRequest(0.0, 100, 5), TraceRequest(1.0, 10, 60), TraceRequest(2.0, 3, 0)]
    clipped, count = clip_to_model(rows, 64)
    assert clipped == [
        TraceRequest(0.0, 63, 1),  # prompt to max_model_len - 1, output to what fits
        TraceRequest(1.0, 10, 54),
        TraceRequest(2.0, 3, 1),  # at least one token is always generated
    ]
    assert count == 3


def test_scripts_parse():
    rows = load_trace("script:10@2,10@2-0", seed=3)
    assert all(0 <= r.arrival_s < 20 for r in rows)
    with pytest.raises(ValueError, match="SECONDS@RATE"):
        load_trace("script:abc")
    with pytest.raises(ValueError, match="poisson:RATE:SECONDS"):
        load_trace("poisson:3")


def test_prefix_blocks_survive_clipping_and_compression_and_copies_share_only_shared_ones():
    rows = [
        TraceRequest(0.0, 1500, 5, (0, 1, 2)),
        TraceRequest(10.0, 1100, 5, (0, 3, 4)),
        TraceRequest(20.0, 600, 5, (5, 6)),
    ]
    assert [r.hash_ids for r in clip_to_model(rows, 4096)[0]] == [r.hash_ids for r in rows]
    assert [r.hash_ids for r in scale_rate(rows, 2.0, mode="compress")] == [
        r.hash_ids for r in rows
    ]
    scaled = scale_rate(rows, 3.0, mode="overlay", seed=1)
    copies = [r for r in scaled if r not in rows]
    assert len(copies) == 6
    # Block 0 is the only one two requests share: a copy keeps it, and nothing else.
    new_ids = [i for r in copies for i in r.hash_ids if i != 0]
    assert min(new_ids) > 6 and len(new_ids) == len(set(new_ids)) == 2 + 2 + 2 + 2 + 2 + 2
    assert sorted(r.hash_ids[0] == 0 for r in copies) == [False] * 2 + [True] * 4


def test_splice_shifts_the_mix_inside_its_window_and_keeps_the_arrivals():
    short = [TraceRequest(float(t), 100, 10, (t,)) for t in range(10)]
    long = [TraceRequest(0.0, 8000, 500), TraceRequest(0.0, 6000, 300)]
    out = splice(short, long, 3.0, 6.0, seed=1)
    assert [r.arrival_s for r in out] == [r.arrival_s for r in short]
    inside = [r for r in out if 3.0 <= r.arrival_s < 6.0]
    assert {r.prompt_tokens for r in inside} == {8000, 6000}
    assert all(r.hash_ids == () for r in inside)
    assert [r for r in out if not 3.0 <= r.arrival_s < 6.0] == short[:3] + short[6:]


@pytest.mark.parametrize(
    "text", ["trace.jsonl@600", "trace.jsonl@a-b", "trace.jsonl", "t.jsonl@600-300"]
)
def test_a_bad_splice_is_a_value_error(text):
    with pytest.raises(ValueError, match="splice"):
        start_s, end_s = parse_splice(text)[1:]
        splice([TraceRequest(0.0, 1, 1)], [TraceRequest(0.0, 1, 1)], start_s, end_s)
    assert parse_splice("a@b.jsonl@600-1200") == ("a@b.jsonl", 600.0, 1200.0)


def test_a_window_keeps_the_arrivals_inside_it_on_a_clock_that_starts_there():
    requests = [TraceRequest(t, 10, 5) for t in (0.0, 99.9, 100.0, 150.0, 199.99, 200.0)]
    cut = cut_window(requests, 100.0, 200.0)
    assert [r.arrival_s for r in cut] == pytest.approx([0.0, 50.0, 99.99])
    assert all((r.prompt_tokens, r.output_tokens) == (10, 5) for r in cut)
    with pytest.raises(ValueError, match="0 <= START < END"):
        cut_window(requests, 200.0, 100.0)


@pytest.mark.parametrize(
    ("text", "window"),
    [("8h-13h", (28800.0, 46800.0)), ("600-1200", (600.0, 1200.0)), ("30m-90m", (1800.0, 5400.0))],
)
def test_a_window_reads_seconds_minutes_or_hours(text, window):
    assert parse_window(text) == window


@pytest.mark.parametrize("text", ["8h", "13h-8h", "a-b", "5-5", "-1-2", "1-infh"])
def test_a_bad_window_is_a_clear_error(text):
    with pytest.raises(ValueError, match="bad window"):
        parse_window(text)
