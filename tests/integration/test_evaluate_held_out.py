"""`wok evaluate --trace PATH`: the held-out protocol on trace files the project has never seen,
one in each format the readers take, written here; and a stopped run that resumes from its
journal without running a finished simulation again."""

from __future__ import annotations

import json
import random
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from wok.cli import main
from wok_sim.evaluation_matrix import SEEDS, STATIC, WARM_UP_S, Condition, Job
from wok_sim.evaluation_runner import run_job
from wok_sim.fleet_search import FleetSearch

pytestmark = pytest.mark.integration

SPAN_S = 600.0  # scored from WARM_UP_S (300 s): half of it counts
RATE = 0.8  # requests/s: a fleet of one or two pods, so each simulation is short


def arrivals(seed: int) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens): Poisson arrivals with chat-like lengths."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while (t := t + rng.expovariate(RATE)) < SPAN_S:
        out.append((t, rng.randint(64, 1024), rng.randint(16, 256)))
    return out


def azure(folder: Path) -> Path:
    start = datetime(2024, 5, 1, 9, 0, 0)
    rows = [
        f"{(start + timedelta(seconds=t)).isoformat(sep=' ')},{p},{o}" for t, p, o in arrivals(1)
    ]
    path = folder / "held_out_azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def mooncake(folder: Path) -> Path:
    lines = [
        json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o})
        for t, p, o in arrivals(2)
    ]
    path = folder / "held_out_mooncake.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def servegen(folder: Path) -> Path:
    """A compact ServeGen day whose only busy windows are its first two (600 s each)."""
    windows = 144
    rates = [RATE / 2, RATE / 2] + [0.0] * (windows - 2)
    trace = {
        "window_s": 600,
        "block_s": 21600,
        "default_day": 0,
        "default_rate_scale": 1.0,
        "streams": [
            {
                "rate": rates,
                "family": "".join("G" if r > 0 else "-" for r in rates),
                "shape": [0.5 if r > 0 else 0.0 for r in rates],
            }
        ],
        "edges": [16, 64, 256, 1024],
        "input_ppm": [[200_000, 500_000, 300_000]] * 4,
        "output_ppm": [[500_000, 500_000, 0]] * 4,
    }
    path = folder / "held_out_servegen.json"
    path.write_text(json.dumps(trace))
    return path


def evaluate(out: Path, trace: str, *extra: str) -> dict:
    args = ["evaluate", "--trace", trace, "--policies", "wok", "--baselines", "none"]
    assert main([*args, "--slo", "loose", "--jobs", "1", "--out", str(out), *extra]) == 0
    (report,) = out.glob("evaluation-*.json")
    return json.loads(report.read_text())


@pytest.mark.parametrize(
    ("write", "scales", "asked"),
    [(azure, "@1,1.5", (1.0, 1.5)), (mooncake, "", (1.0,)), (servegen, "@1.5", (1.5,))],
)
def test_a_trace_file_in_each_format_is_scored_like_the_matrix(
    write, scales: str, asked: tuple[float, ...], tmp_path: Path
) -> None:
    trace = write(tmp_path)
    report = evaluate(tmp_path / "out", f"{trace}{scales}")
    assert report["warm_up_s"] == WARM_UP_S
    verdicts = report["verdicts"]
    # One condition per scale, the law on every seed, judged against a frontier of its own.
    assert [(v["condition"]["trace"], v["condition"]["scale"]) for v in verdicts] == [
        (str(trace), scale) for scale in asked
    ]
    assert all(v["policy"]["seeds"] == len(SEEDS) for v in verdicts)
    runs = report["runs"]
    for scale in asked:
        statics = {r["name"] for r in runs if r["policy"] == STATIC and r["scale"] == scale}
        assert statics, f"no static fleet at ×{scale}"
        # The frontier found its saturated end: some static fleet serves (nearly) everything.
        best = max(r["attainment"] for r in runs if r["policy"] == STATIC and r["scale"] == scale)
        assert best >= 0.999
    text = (tmp_path / "out" / f"evaluation-{trace.stem}-loose.md").read_text()
    assert f"| {trace.name} ×{asked[-1]:g}, 90 s start, loose SLOs | wok |" in text


def test_a_stopped_run_resumes_from_its_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = mooncake(tmp_path)
    journal = tmp_path / "runs.jsonl"
    whole = evaluate(tmp_path / "whole", str(trace), "--journal", str(journal))
    lines = journal.read_text().splitlines()
    # Stopped halfway, killed while writing a line: the first half kept, the next line cut.
    kept = len(lines) // 2
    planted = json.loads(lines[0]) | {"attainment": 0.123456789}
    journal.write_text("\n".join([json.dumps(planted), *lines[1:kept]]) + "\n" + lines[kept][:20])
    capsys.readouterr()
    resumed = evaluate(tmp_path / "resumed", str(trace), "--journal", str(journal))
    # The progress says what the journal gave back and which simulation finished last.
    err = capsys.readouterr().err
    assert re.search(r"first seed \(\d+ from the journal\)", err)
    assert "held_out_mooncake.jsonl ×1 seed" in err
    again = journal.read_text().splitlines()
    assert len(again) == len(lines)  # the other half run once each, the cut line again
    key = ("policy", "seed", "name", "batch")
    assert {tuple(json.loads(line)[k] for k in key) for line in again} == {
        tuple(json.loads(line)[k] for k in key) for line in lines
    }
    runs = {tuple(r[k] for k in key): r["attainment"] for r in resumed["runs"]}
    assert runs[tuple(planted[k] for k in key)] == round(0.123456789, 6)  # read back, not rerun
    others = {tuple(r[k] for k in key): r["attainment"] for r in whole["runs"]}
    assert {k: v for k, v in runs.items() if k != tuple(planted[k] for k in key)} == {
        k: v for k, v in others.items() if k != tuple(planted[k] for k in key)
    }


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("load.txt", "hello\n", "unknown format '.txt', want .csv (Azure LLM trace CSV)"),
        ("load.csv", "a,b\n1,2\n", "is not an Azure LLM trace CSV"),
        ("load.jsonl", '{"ts": 1}\n', "is not a Mooncake trace line"),
        ("load.json", "{}", "is not a compact ServeGen trace"),
        ("short.jsonl", '{"timestamp": 0, "input_length": 9, "output_length": 9}\n', "spans 0 s"),
    ],
)
def test_a_file_that_is_not_a_trace_is_one_clear_line(
    name: str, text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text(text)
    args = ["evaluate", "--trace", str(tmp_path / name), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bisection_finds_the_frontier_a_linear_sweep_finds_on_a_real_trace() -> None:
    """The Mooncake excerpt at tight SLOs, B32: attainment rises with every pod up to 9 (from
    38 % at one); at 10 the routing draw costs half a point (98.72 → 98.25 %): monotone in N up
    to the draw, and exact where it is. The search keeps the same pod counts as a sweep over
    every N, in fewer simulations."""
    condition = Condition("mooncake", 1.0, 90.0, "tight")
    sweep = {n: run_job(Job(condition, SEEDS[0], STATIC, n * 1000 + 32)) for n in range(1, 13)}
    curve = [sweep[n].attainment for n in range(1, 13)]
    assert curve[:9] == sorted(curve[:9])
    low, high = 0.90, 0.98
    search = FleetSearch(12, 2, low, high)
    while probes := search.next_probes():
        for n in probes:
            search.add(n, sweep[n].attainment)
    first = max(n for n, a in enumerate(curve, 1) if a < low)
    peak = next(n for n, a in enumerate(curve, 1) if a >= high)
    assert search.span() == range(first, peak + 1) == range(3, 9)
    assert len(search.seen) < len(sweep)


def test_static_peak_searched_by_bisection_picks_what_every_variant_would(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`wok simulate --policy static-peak`: the smallest fleet at 99 %, at its B, is the same
    whether every replica count of every B runs or the search probes them."""
    import wok_sim.cli

    args = ["simulate", "--trace", "poisson:40:60", "--policy", "static-peak", "--json"]
    picked, simulations = [], []
    for searched in (wok_sim.cli.SEARCHED, ()):
        monkeypatch.setattr(wok_sim.cli, "SEARCHED", searched)
        assert main([*args, "--jobs", "1"]) == 0
        out, err = capsys.readouterr()
        picked.append(json.loads(out)["policies"]["static-peak"])
        simulations.append(int(re.search(r"(\d+) simulations", err).group(1)))
    keys = ("slo_attainment", "gpu_hours", "batch_size", "p99_ttft_s")
    assert [{k: p[k] for k in keys} for p in picked[:1]] == [{k: picked[1][k] for k in keys}]
    assert picked[0]["slo_attainment"] >= 0.99
    assert simulations[0] < simulations[1]
