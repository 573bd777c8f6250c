"""bench/autoscaling/hourly_fleet.py: wok's GPU-hours over the hourly fleet's, seed by seed, the
goal judged on the means, and the search's windows held against the whole day."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "autoscaling"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the script imports bench/autoscaling/daytrace.py beside it
    try:
        spec = importlib.util.spec_from_file_location("hourly_fleet", BENCH / "hourly_fleet.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def hours(replicas: list[int], met: list[int], window: list[float]) -> list[dict]:
    return [
        {
            "arrived": 100,
            "met": m,
            "ready": float(n),
            "pending": 0.0,
            "replicas": n,
            "batch": 64,
            "window": w,
            "probes": [[n, 64, w], [n - 1, 64, 0.5]],
        }
        for n, m, w in zip(replicas, met, window, strict=True)
    ]


def run(bench: ModuleType, policy: str, seed: int, att: float, gpu_h: float, rows: list) -> dict:
    return {
        "key": bench.key(policy, 1.0, seed),
        "policy": policy,
        "scale": 1.0,
        "seed": seed,
        "attainment": att,
        "gpu_hours": gpu_h,
        "search_s": 1.0,
        "hourly": rows,
    }


def test_the_goal_is_judged_on_the_means_of_the_seeds_both_ran(bench: ModuleType):
    rows = hours([1, 2], [100, 99], [1.0, 0.995])
    runs = [
        run(bench, "hourly", 0, 0.995, 40.0, rows),
        run(bench, "wok", 0, 0.999, 41.0, rows),
        run(bench, "hourly", 1, 0.993, 40.0, rows),
        run(bench, "wok", 1, 0.999, 43.0, rows),
        run(bench, "wok", 2, 0.999, 90.0, rows),  # no hourly fleet on seed 2: not counted
    ]
    assert [h["seed"] for h, _ in bench.pairs(runs, 1.0)] == [0, 1]
    assert bench.share(runs[0], runs[1]) == pytest.approx(41.0 / 40.0)
    text = bench.markdown(runs, "cmd")
    assert "| **mean of 2** | 99.40 | 40.00 | 99.90 | 42.00 | 105.0 % | |" in text
    assert "**met**" in text  # 42 / 40 = 105 %, at the goal
    runs[3]["gpu_hours"] = 43.2
    assert "**not met**" in bench.markdown(runs, "cmd")


def test_the_window_gap_is_the_largest_hour_and_counts_the_hours_under_99(bench: ModuleType):
    rows = hours([1, 2, 2], [100, 98, 99], [0.999, 0.99, 0.9905])
    gap, under, added = bench.window_gap({"hourly": rows})
    assert gap == pytest.approx(1.0)  # 99 % in the window, 98 % in the day
    assert (under, added) == (1, [])
    rows[1] |= {"day_searched": 0.985, "met": 100, "replicas": 3}  # settled: one pod more
    gap, under, added = bench.window_gap({"hourly": rows, "added": [1]})
    assert gap == pytest.approx(0.5)  # against the first day, not the settled one
    assert (under, added) == (1, [1])


def test_runs_from_takes_daytraces_wok_and_prefers_a_settled_hourly_fleet(bench, tmp_path):
    daytrace = tmp_path / "daytrace_x3.json"
    daytrace.write_text(
        json.dumps(
            {
                "scale": 3.0,
                "runs": [
                    {"key": "wok/0/0", "policy": "wok", "seed": 0, "gpu_hours": 1.0},
                    {"key": "static/7064/0", "policy": "static", "seed": 0, "gpu_hours": 2.0},
                ],
            }
        )
    )
    runs = bench.runs_from(daytrace, [])
    assert [(r["key"], r["scale"], r["gpu_hours"]) for r in runs] == [("wok/x3/0", 3.0, 1.0)]
    assert bench.runs_from(daytrace, runs) == runs
    searched = run(bench, "hourly", 0, 0.995, 40.0, [])
    other = tmp_path / "hourly_fleet.json"
    other.write_text(json.dumps({"runs": [searched | {"gpu_hours": 41.0, "added": [3]}]}))
    merged = bench.runs_from(other, [searched])
    assert [(r["gpu_hours"], r["added"]) for r in merged] == [(41.0, [3])]
    assert bench.runs_from(daytrace, merged)[0]["gpu_hours"] == 41.0
