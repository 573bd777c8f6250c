"""bench/autoscaling/daytrace.py: the static fleets near wok run on wok's seeds, and the frontier
and static-peak it reports are means over those seeds only."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "autoscaling" / "daytrace.py"


@pytest.fixture(scope="module")
def daytrace() -> ModuleType:
    spec = importlib.util.spec_from_file_location("daytrace", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(policy: str, seed: int, name: str, batch: int | None, att: float, gpu_h: float) -> dict:
    replicas = int(name.removeprefix("static-")) if policy == "static" else 0
    return {
        "key": f"{policy}/{seed}",
        "policy": policy,
        "variant": replicas * 1000 + (batch or 0),
        "seed": seed,
        "name": name,
        "batch": batch,
        "attainment": att,
        "gpu_hours": gpu_h,
        "requests": 10,
        "sim_s": 1.0,
        "hourly": [],
    }


def test_the_fleets_near_wok_run_on_every_seed_and_the_others_on_the_first(daytrace):
    jobs = daytrace.static_jobs([0, 1, 2])
    by_seed = {
        seed: {divmod(j.variant, 1000) for j in jobs if j.seed == seed} for seed in (0, 1, 2)
    }
    assert by_seed[0] == set(daytrace.STATICS)
    assert by_seed[1] == by_seed[2] == set(daytrace.SEEDED_STATICS)
    assert {(2, 64), (3, 64)} <= set(daytrace.SEEDED_STATICS)
    assert [j.seed for j in jobs] == sorted(j.seed for j in jobs)  # whole seeds first


def test_static_peak_and_the_frontier_are_means_over_wok_seeds(daytrace):
    runs = [
        run("wok", 0, "wok", None, 0.999, 60.0),
        run("wok", 1, "wok", None, 0.995, 64.0),
        run("static", 0, "static-3", 64, 0.999, 72.0),
        run("static", 1, "static-3", 64, 0.993, 72.0),
        run("static", 2, "static-3", 64, 0.5, 72.0),  # a seed wok did not run
        run("static", 0, "static-2", 64, 0.93, 48.0),
        run("static", 1, "static-2", 64, 0.91, 48.0),
    ]
    s = daytrace.summary(runs)
    assert s["wok"].seeds == 2 and s["wok"].gpu_hours == pytest.approx(62.0)
    assert s["static_peak"].name == "static-3" and s["static_peak"].seeds == 2
    assert s["static_peak"].attainment == pytest.approx(0.996)
    # Halfway from static-2 (mean 92 %) to static-3 (mean 99.6 %) in GPU-hours.
    assert s["frontier_there"] == pytest.approx(0.92 + (62 - 48) / (72 - 48) * (0.996 - 0.92))
    table = daytrace.markdown(runs, "cmd")
    assert "| **wok** | 2 | 99.70 [99.50–99.90] | 62.00 [60.00–64.00]" in table
    assert "| static-3 B64 (static-peak) | 2 | 99.60 [99.30–99.90]" in table


def test_later_seeds_run_whole_before_the_remaining_rivals(daytrace, monkeypatch):
    names = [(name, batch) for _, name, batch in (*daytrace.BASELINES, *daytrace.FIELD)]
    monkeypatch.setattr(daytrace, "variants_of", lambda *_: names)
    order = [(j.policy, j.seed) for j in daytrace.jobs([0, 1, 2])]
    seeded = len(daytrace.SEEDED_STATICS)
    for seed in (1, 2):
        start = order.index(("wok", seed))
        assert order[start + 1 : start + 1 + seeded] == [("static", seed)] * seeded
    last_rival = max(i for i, (p, _) in enumerate(order) if p not in ("wok", "static"))
    assert order.index(("wok", 1)) < last_rival
    assert all(p not in ("wok", "static") for p, _ in order[-3:])


def test_a_larger_scale_runs_the_fleets_around_its_own_peak_into_its_own_files(
    daytrace, monkeypatch
):
    names = [(name, batch) for _, name, batch in (*daytrace.BASELINES, *daytrace.FIELD)]
    monkeypatch.setattr(daytrace, "variants_of", lambda *_: names)
    jobs = daytrace.jobs([0, 1], scale=3.0)
    assert {j.condition.scale for j in jobs} == {3.0}
    assert (jobs[0].policy, jobs[0].seed) == ("wok", 0)
    statics = [divmod(j.variant, 1000) for j in jobs if j.policy == "static" and j.seed == 0]
    # From 9 pods (3 × the ×1 peak of 3) down, B32 before B64, B64 two pods below the peak.
    assert {(9, 32), (8, 32), (7, 32), (6, 32), (7, 64), (6, 64), (8, 64)} <= set(statics)
    assert all(6 <= n <= 10 for n, _ in statics)
    assert statics.index((6, 32)) < statics.index((7, 64)) < statics.index((8, 64))
    seeded = {divmod(j.variant, 1000) for j in jobs if j.policy == "static" and j.seed == 1}
    assert seeded == {(8, 32), (7, 32), (7, 64), (6, 64), (6, 32)}
    assert daytrace.static_fleets(1.0) == (daytrace.STATICS, daytrace.SEEDED_STATICS)
    assert daytrace.default_out(1.0).name == "daytrace.json"
    assert daytrace.default_out(3.0).name == "daytrace_x3.json"


def test_the_rivals_run_again_on_the_seeds_asked_after_everything_else(daytrace, monkeypatch):
    names = [(name, batch) for _, name, batch in (*daytrace.BASELINES, *daytrace.FIELD)]
    monkeypatch.setattr(daytrace, "variants_of", lambda *_: names)
    rivals = len(daytrace.BASELINES) + len(daytrace.FIELD)
    jobs = daytrace.jobs([0], 1.0, [1, 2])
    again = jobs[-2 * rivals :]
    assert [j.seed for j in again] == [1] * rivals + [2] * rivals
    assert [(j.policy, j.variant) for j in again[:rivals]] == [
        (j.policy, j.variant) for j in jobs if j.seed == 0 and j.policy not in ("wok", "static")
    ]
    assert len(daytrace.jobs([0])) == len(jobs) - 2 * rivals


def test_the_table_names_its_scale(daytrace):
    runs = [run("wok", 0, "wok", None, 0.999, 60.0)]
    assert "# The law over a day: the ServeGen m-large day\n" in daytrace.markdown(runs, "cmd")
    scaled = daytrace.markdown(runs, "cmd", 3.0)
    assert "# The law over a day: the ServeGen m-large day ×3\n" in scaled
    assert "rate scale 0.1, then ×3 (" in scaled
