"""The simulator's `rate()` (`wok_sim.prometheus.extrapolated_rate`) against Prometheus' own
engine (promtool's PromQL tests) on recorded counters scraped every 5 s: a pod present all along,
one that appears mid-window, one that leaves mid-window, and one whose counter started high."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from promql_harness import assert_promql

from wok_sim.prometheus import extrapolated_rate

pytestmark = pytest.mark.integration

SCRAPE_S = 5
WINDOW_S = 60
# Per pod, the counter at each scrape (None: the pod did not exist then); 30 scrapes, 0–145 s.
SERIES: dict[str, list[float | None]] = {
    "always": [3.0 * i for i in range(30)],
    "arrives": [None] * 14 + [7.0 * i for i in range(16)],
    "leaves": [40.0 + 2.0 * i for i in range(18)] + [None] * 12,
    "bursty": [float(i * i) for i in range(30)],
}


def promtool_values(values: list[float | None]) -> str:
    return " ".join("_" if v is None else repr(v) for v in values)


def emulated(values: list[float | None], now: float) -> float | None:
    """What the simulator's rate() reads for one series at `now`."""
    inside = [
        (SCRAPE_S * i, v)
        for i, v in enumerate(values)
        if v is not None and now - WINDOW_S < SCRAPE_S * i <= now
    ]
    if len(inside) < 2:
        return None
    (t0, first), (t1, last) = inside[0], inside[-1]
    return extrapolated_rate(first, last, t0, t1, len(inside), start=now - WINDOW_S, end=now)


def rounded(value: float) -> float:
    # PromQL's round(v, 1e-6), so that float noise in either engine cannot decide the test.
    return math.floor(value * 1e6 + 0.5) / 1e6


def test_the_emulated_rate_is_prometheus_rate(tmp_path: Path) -> None:
    series = [
        {"series": f'wok_test_total{{pod="{pod}"}}', "values": promtool_values(values)}
        for pod, values in SERIES.items()
    ]
    tests = []
    # Eval times off the scrape grid, so that Prometheus 2's closed range and the emulation's
    # left-open one hold the same samples.
    for now in (22, 63, 88, 101, 117, 142):
        expected = [
            {"labels": f'{{pod="{pod}"}}', "value": rounded(rate)}
            for pod, values in SERIES.items()
            if (rate := emulated(values, now)) is not None
        ]
        tests.append(
            {
                "expr": f"round(rate(wok_test_total[{WINDOW_S}s]), 0.000001)",
                "eval_time": f"{now}s",
                "exp_samples": expected,
            }
        )
    assert_promql(tmp_path, series, tests, interval=f"{SCRAPE_S}s")
