"""The ServeGen day trace: the converter's compact file and the seeded stream drawn from it."""

from __future__ import annotations

import collections
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from wok_contracts.traces import DAY_S, load_trace, read_servegen

ROOT = Path(__file__).resolve().parents[2]
CONVERTER = ROOT / "bench" / "traces" / "servegen.py"
DAY_TRACE = ROOT / "bench" / "traces" / "servegen_m_large.json"
WINDOW_S = 600
WINDOWS_PER_DAY = int(DAY_S) // WINDOW_S


def compact(tmp_path: Path, streams: list[dict], **extra: object) -> Path:
    """A compact trace of one day with these streams; lengths: prompts in [8, 10) tokens, outputs
    a quarter in [1, 2) and three quarters in [4, 5) (edges 1, 2, 3, 4, 5, 6, 7, 8, 10)."""
    trace = {
        "window_s": WINDOW_S,
        "block_s": 21600,
        "default_day": 0,
        "default_rate_scale": 1.0,
        "streams": streams,
        "edges": [1, 2, 3, 4, 5, 6, 7, 8, 10],
        "input_ppm": [[0, 0, 0, 0, 0, 0, 0, 1_000_000]] * 4,
        "output_ppm": [[250_000, 0, 0, 750_000]] * 4,
        **extra,
    }
    path = tmp_path / "day.json"
    path.write_text(json.dumps(trace))
    return path


def stream(rates: list[float], family: str, shape: float) -> dict:
    """One stream over a day: `rates` repeated window after window."""
    day = [rates[w % len(rates)] for w in range(WINDOWS_PER_DAY)]
    return {
        "rate": day,
        "family": "".join(family if r > 0 else "-" for r in day),
        "shape": [shape if r > 0 else 0.0 for r in day],
    }


def per_window(requests: list) -> collections.Counter[int]:
    return collections.Counter(int(r.arrival_s // WINDOW_S) for r in requests)


def test_the_draw_is_seeded(tmp_path):
    path = compact(tmp_path, [stream([0.1, 0.05], "G", 0.4), stream([0.02], "W", 0.6)])
    first, again = read_servegen(path, seed=3), read_servegen(path, seed=3)
    assert first == again
    assert first != read_servegen(path, seed=4)
    assert load_trace(str(path), seed=3) == first  # a .json path is a ServeGen trace


@pytest.mark.parametrize(("family", "shape"), [("G", 1.0), ("G", 0.3), ("W", 0.5)])
def test_each_window_gets_its_rate_and_idle_windows_get_nothing(tmp_path, family, shape):
    rates = [2.0, 0.0, 0.5, 1.0]  # requests per second, window after window
    requests = read_servegen(compact(tmp_path, [stream(rates, family, shape)]), seed=1)
    counts = per_window(requests)
    for offset, rate in enumerate(rates):
        windows = range(offset, WINDOWS_PER_DAY, len(rates))
        mean = statistics.fmean(counts[w] for w in windows) / WINDOW_S
        assert mean == pytest.approx(rate, rel=0.05, abs=1e-9), (offset, rate)
    assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(requests))
    assert requests[0].arrival_s >= 0 and requests[-1].arrival_s < DAY_S


def test_a_bursty_fit_is_burstier_than_poisson_at_the_same_rate(tmp_path):
    def gaps_cv(shape: float) -> float:
        requests = read_servegen(compact(tmp_path, [stream([1.0], "G", shape)]), seed=2)
        gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(requests)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    assert gaps_cv(1.0) == pytest.approx(1.0, abs=0.05)
    assert gaps_cv(0.25) == pytest.approx(2.0, rel=0.15)  # a Gamma's CV is 1 / sqrt(shape)


def test_the_rate_scale_multiplies_every_window(tmp_path):
    path = compact(tmp_path, [stream([0.3, 1.0], "G", 1.0)])
    full, tenth = read_servegen(path), read_servegen(path, rate_scale=0.1)
    assert len(tenth) / len(full) == pytest.approx(0.1, rel=0.05)


def test_lengths_come_from_the_block_pmfs(tmp_path):
    # The afternoon block (12:00-18:00) asks for long prompts, every other block short ones.
    short, long = [0, 0, 0, 0, 0, 0, 0, 1_000_000], [0, 0, 1_000_000]
    path = compact(tmp_path, [stream([1.0], "G", 1.0)], input_ppm=[short, short, long, short])
    requests = read_servegen(path, seed=5)
    afternoon = [r for r in requests if 43200 <= r.arrival_s < 64800]
    rest = [r for r in requests if not 43200 <= r.arrival_s < 64800]
    assert {r.prompt_tokens for r in afternoon} == {3}  # the bin [3, 4)
    assert {r.prompt_tokens for r in rest} == {8, 9}  # the bin [8, 10), both drawn
    outputs = collections.Counter(r.output_tokens for r in requests)
    assert set(outputs) == {1, 4}
    assert outputs[1] / len(requests) == pytest.approx(0.25, abs=0.01)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"day": 1}, "holds 1 days"),
        ({"seconds": 2 * DAY_S}, "holds 1 days"),
        ({"rate_scale": 0.0}, "positive rate scale"),
    ],
)
def test_a_span_outside_the_file_is_a_value_error(tmp_path, change, message):
    path = compact(tmp_path, [stream([1.0], "G", 1.0)])
    with pytest.raises(ValueError, match=message):
        read_servegen(path, **change)


def test_a_file_that_is_not_a_compact_trace_is_a_value_error(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"window_s": 600}))
    with pytest.raises(ValueError, match="not a compact ServeGen trace"):
        read_servegen(path)


def test_the_committed_day_swings_between_night_and_day():
    # A tenth of the default rate (a tenth of the draws); the swing does not depend on it.
    default = json.loads(DAY_TRACE.read_text())["default_rate_scale"]
    requests = read_servegen(DAY_TRACE, seed=0, rate_scale=default / 10)
    hours = collections.Counter(int(r.arrival_s // 3600) for r in requests)
    assert sorted(hours) == list(range(24))
    rates = [10 * hours[h] / 3600 for h in range(24)]  # at the default scale
    assert max(rates) / min(rates) >= 2.5  # its trough before dawn, its peak in the evening
    assert min(rates) >= 8 and max(rates) <= 35  # requests per second: a few pods at the peak
    assert 500 <= statistics.median(r.prompt_tokens for r in requests) <= 1000


def test_the_converter_keeps_the_busiest_clients_and_merges_the_rest(tmp_path):
    source = tmp_path / "m-test"
    source.mkdir()
    windows = 2 * WINDOWS_PER_DAY
    for client, rate in ((0, 0.5), (1, 3.0), (2, 0.25)):
        rows = [
            f"{w * WINDOW_S},{rate if w % 2 else 0},1.5,Weibull,0.6,2.0"
            if client == 1
            else f"{w * WINDOW_S},{rate},1.0,Gamma,0.9,1.1"
            for w in range(windows)
        ]
        (source / f"chunk-{client}-trace.csv").write_text("\n".join(rows) + "\n")
    pmf = {str(b * 21600): {"input_tokens": "{100: 1.0}", "output_tokens": "{7: 0.5, 20: 0.5}"}
           for b in range(8)}  # fmt: skip
    for client in (0, 2):  # client 1's dataset is absent, as ServeGen's largest ones are
        (source / f"chunk-{client}-dataset.json").write_text(json.dumps(pmf))
    out = tmp_path / "compact.json"
    done = subprocess.run(
        [sys.executable, str(CONVERTER), str(source), str(out), "--days", "1", "--clients", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "absent: chunk-1-dataset.json" in done.stderr
    trace = json.loads(out.read_text())
    busiest, merged = trace["streams"]
    assert busiest["clients"] == ["chunk-1"] and busiest["family"][:2] == "-W"
    assert busiest["shape"][:2] == [0.0, 0.6] and len(busiest["rate"]) == WINDOWS_PER_DAY
    assert merged["clients"] == ["chunk-0", "chunk-2"] and set(merged["rate"]) == {0.75}
    requests = read_servegen(out, seed=0)
    assert {r.prompt_tokens for r in requests} <= set(range(91, 108))  # the bin that holds 100
    assert len(requests) / DAY_S == pytest.approx(0.75 + 1.5, rel=0.05)
