"""The sentence `wok simulate` prints before its table: the law, the cheapest fixed fleet and the
HPA on the queue, each with its share within every SLO and its GPU-hours, read from the rows."""

from __future__ import annotations

import dataclasses

from wok_sim.fleet import Tick
from wok_sim.report import PolicyResult, headline


def row(name: str, share: float, gpu_hours: float, *, pods: int = 2, batch: int | None = None):
    tick = Tick(0.0, 1.0, pods, pods, 0, batch or 8, 0, 0.5, 0.05, 3.0, "")
    return PolicyResult(
        name=name, batch_size=batch, requests=1000, slo_attainment=share, ttft_attainment=share,
        tpot_attainment=1.0, e2e_attainment=share, p99_ttft_s=0.5, p99_tpot_s=0.05,
        p99_e2e_s=3.0, gpu_hours=gpu_hours, gpu_hours_per_1k_tokens=0.01, output_tokens=100_000,
        scale_events=0, flips=0, max_queue=0, rejected=0, timeouts=0, dropped=0,
        clipped_requests=0, wall_seconds=0.1, steps=10, timeline=(tick,),
    )  # fmt: skip


WOK = row("wok", 0.988, 4.71)
PEAK = row("static-peak", 0.995, 5.73, pods=32, batch=32)
HPA = row("hpa-waiting", 0.783, 11.1, batch=32)


def test_the_sentence_names_the_law_the_fixed_fleet_and_the_hpa():
    sentence = headline([WOK, row("sign-step", 0.05, 1.0), PEAK, HPA], target=0.99)
    assert sentence == (
        "wok served 98.8 % of requests within every SLO on 4.71 GPU-hours; the cheapest fixed "
        "fleet that reaches 99 % (static-peak) needs 32 pods at batch 32, 5.73 GPU-hours, for "
        "99.5 %; the HPA on the queue (hpa-waiting) served 78.3 % on 11.10 GPU-hours."
    )


def test_a_fixed_fleet_short_of_the_target_is_said_to_be():
    short = dataclasses.replace(PEAK, slo_attainment=0.97)
    sentence = headline([WOK, short], target=0.99)
    assert (
        "no fixed fleet tried reaches 99 % (static-peak's best: 32 pods at batch 32, 97.0 %)"
        in sentence
    )
    assert "HPA" not in sentence


def test_a_run_of_one_policy_speaks_of_that_policy_alone():
    assert headline([HPA], target=0.99) == (
        "hpa-waiting served 78.3 % of requests within every SLO on 11.10 GPU-hours."
    )
