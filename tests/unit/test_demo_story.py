"""What `wok demo` says the law did, read from its control ticks: when it first added a pod and
from how many, when that pod served, and when the P99 TTFT it saw was over the SLO."""

from __future__ import annotations

from wok import demo
from wok.cli import main
from wok.demo import what_the_law_did
from wok_sim.fleet import Tick


def tick(time_s: float, desired: int, ready: int, *, waiting: int = 0, ttft: float = 0.2) -> Tick:
    return Tick(time_s, 10.0, desired, ready, desired - ready, 256, waiting, ttft, 0.05, None, "")


def test_it_says_when_the_law_added_a_pod_when_it_served_and_how_long_ttft_was_over():
    ticks = [
        tick(0.0, 2, 2),
        tick(300.0, 2, 2),
        tick(342.0, 3, 2, waiting=19),  # 5.7 min: the first scale-up
        tick(390.0, 3, 2, waiting=82, ttft=2.3),  # 6.5 min: over the SLO
        tick(432.0, 5, 3, waiting=213, ttft=7.3),  # 7.2 min: the first new pod serves
        tick(504.0, 5, 5, ttft=6.6),  # 8.4 min: the last tick over
        tick(520.0, 5, 5),
    ]
    story = what_the_law_did(ticks, slo_ttft_s=2.0, pod_start_s=90.0)
    assert "wok starts with 2 pods, each running up to 256 requests at once" in story
    assert "It first adds a pod at 5.7 min (2 → 3)" in story
    assert "a pod takes 90 s to start, and the first new one serves from 7.2 min." in story
    assert "at most 213 waiting" in story
    assert "over the 2 s SLO from 6.5 min to 8.4 min" in story
    assert "up to 5 pods" in story


def test_a_run_without_a_scale_up_or_a_breach_says_so():
    story = what_the_law_did([tick(0.0, 1, 1), tick(60.0, 1, 1)], slo_ttft_s=2.0, pod_start_s=90.0)
    assert "wok starts with 1 pod," in story
    assert "It never needed more than 1." in story
    assert "stayed within the 2 s SLO throughout" in story


def test_the_simulated_part_prints_the_sentence_the_table_and_the_story(
    monkeypatch, tmp_path, capsys
):
    # A short ramp instead of the quarter-hour: the same wiring in seconds.
    monkeypatch.setattr(demo, "DEMO_TRACE", "script:30@1,60@1-10")
    assert main(["demo", "--no-live", "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "wok served " in out and "(static-peak)" in out and "(hpa-waiting) served" in out
    assert "wok starts with " in out and "static-peak is sized in hindsight" in out
    assert (tmp_path / "simulate-comparison.png").stat().st_size > 0
