"""The Dynamo SLA planner port (aggregated) against upstream's own tests.

Transcribed from ai-dynamo/dynamo: the load-predictor unit tests of
`dynamo.planner.core.load.predictors` (TestConstantPredictor, TestProphetPredictorTimestamp,
TestProphetPredictorMultipleStepSizes; predictors at 260b6ae9412cea46626b25b11407fbebd30e5cb0)
and TestAggRegressionModel of `dynamo.planner.core.perf_model.agg` (agg.py at
518a70279da932774915f3b039b6978f9b1057f8), whose model is trained on the exact plane
wall = 0.001·prefill + 0.0001·decode_kv + 0.001 s, used here as the wall-time function.
Prophet is replaced by a fake that records the frame it is asked to predict (as upstream's
tests patch it with a mock)."""

from __future__ import annotations

import math
import sys
import types
from datetime import timedelta
from typing import ClassVar

import pytest

from wok_contracts.profile import load_profile
from wok_sim import dynamo
from wok_sim.dynamo import (
    ConstantPredictor,
    FieldExtraMissing,
    ProphetPredictor,
    agg_replicas,
    estimate_next_ttft,
    find_best_engine_agg_rps,
    make_predictor,
    profile_wall_time,
)


def test_constant_returns_zero_with_no_data() -> None:
    assert ConstantPredictor().predict_next() == 0


def test_constant_returns_last_added_value() -> None:
    predictor = ConstantPredictor()
    for value in [10.0, 20.0, 30.0]:
        predictor.add_data_point(value)
    assert predictor.predict_next() == 30.0


@pytest.mark.parametrize(
    ("upstream_test", "points", "prediction", "buffered"),
    [
        ("test_skips_leading_zeros", [0, 0], 0, 0),
        ("test_does_not_skip_zeros_after_nonzero", [5.0, 0], 0, 2),
        ("test_nan_treated_as_zero", [10.0, math.nan], 0, 2),
        ("inf is zero load too", [10.0, math.inf], 0, 2),
    ],
)
def test_constant_idle_and_non_finite_rules(upstream_test, points, prediction, buffered):
    predictor = ConstantPredictor()
    for value in points:
        predictor.add_data_point(value)
    assert (predictor.predict_next(), len(predictor.data_buffer)) == (prediction, buffered)


class FakeProphet:
    """Stands in for prophet.Prophet: records the frame it predicts on, answers `yhat`."""

    asked: ClassVar[list[list[object]]] = []
    yhat = 10.0

    def fit(self, frame: object) -> None:
        self.trained = frame

    def predict(self, frame: dict[str, list[object]]) -> dict[str, FakeColumn]:
        FakeProphet.asked.append(frame["ds"])
        return {"yhat": FakeColumn([FakeProphet.yhat])}


class FakeColumn(list):
    @property
    def iloc(self) -> FakeColumn:
        return self


@pytest.fixture
def fake_prophet(monkeypatch: pytest.MonkeyPatch) -> type[FakeProphet]:
    fakes = {
        "prophet": types.SimpleNamespace(Prophet=FakeProphet),
        "pandas": types.SimpleNamespace(DataFrame=lambda data: data),
    }
    monkeypatch.setattr(dynamo, "_require", lambda module, _predictor: fakes[module])
    FakeProphet.asked, FakeProphet.yhat = [], 10.0
    return FakeProphet


@pytest.mark.parametrize("step_size", [30, 60, 120, 180, 300])
def test_prophet_next_timestamp_is_one_step_ahead(fake_prophet, step_size) -> None:
    predictor = ProphetPredictor(step_size_s=step_size)
    for value in [5.0, 10.0, 8.0, 12.0, 9.0, 11.0]:
        predictor.add_data_point(value)
    predictor.predict_next()
    assert fake_prophet.asked == [[predictor.points[-1]["ds"] + timedelta(seconds=step_size)]]


def test_prophet_uses_step_size_not_step_count(fake_prophet) -> None:
    predictor = ProphetPredictor(step_size_s=180)
    for value in [10.0, 12.0, 14.0, 13.0, 15.0, 11.0]:
        predictor.add_data_point(value)
    assert predictor.curr_step == 6
    predictor.predict_next()
    assert fake_prophet.asked == [[predictor.start_date + timedelta(seconds=1080)]]


def test_prophet_last_value_below_five_points_and_zero_when_empty(fake_prophet) -> None:
    predictor = ProphetPredictor()
    assert predictor.predict_next() == 0
    for value in [10.0, 20.0, 30.0]:
        predictor.add_data_point(value)
    assert predictor.predict_next() == 30.0
    assert fake_prophet.asked == []


@pytest.mark.parametrize(("log1p", "yhat"), [(False, -5.0), (True, -100.0)])
def test_prophet_never_predicts_negative(fake_prophet, log1p, yhat) -> None:
    predictor = ProphetPredictor(log1p=log1p)
    for value in [10.0, 12.0, 11.0, 13.0, 10.0, 9.0]:
        predictor.add_data_point(value)
    fake_prophet.yhat = yhat
    assert predictor.predict_next() >= 0.0


def test_prophet_log1p_buffer_and_window(fake_prophet) -> None:
    predictor = ProphetPredictor(log1p=True)
    predictor.add_data_point(99.0)
    assert predictor.points[-1]["y"] == pytest.approx(math.log1p(99.0))
    assert predictor.get_last_value() == pytest.approx(99.0)
    windowed = ProphetPredictor(step_size_s=60, window_size=5)
    for value in range(1, 20):
        windowed.add_data_point(float(value))
    assert len(windowed.points) <= 5


def test_prophet_idle_skip_and_step_count(fake_prophet) -> None:
    predictor = ProphetPredictor()
    predictor.add_data_point(0)
    predictor.add_data_point(0)
    assert (predictor.curr_step, len(predictor.points)) == (0, 0)
    predictor.add_data_point(5.0)
    predictor.add_data_point(0)
    assert (predictor.curr_step, len(predictor.points)) == (2, 2)


def test_missing_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("pmdarima", "prophet", "pandas"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    for name in ("arima", "prophet"):
        with pytest.raises(FieldExtraMissing, match=r"wok\[field\]"):
            make_predictor(name)
    assert make_predictor("constant").predict_next() == 0
    with pytest.raises(ValueError, match="unknown load predictor"):
        make_predictor("kalman")


def upstream_plane(prefill: float, decode_kv: float, _decodes: int) -> float:
    """TestAggRegressionModel._train_agg's exact plane (a least-squares fit recovers it)."""
    return 0.001 * prefill + 0.0001 * decode_kv + 0.001


def test_agg_find_best_engine_rps_matches_upstream() -> None:
    # test_find_best_engine_agg_rps: isl 2048, osl 150, budget 4096, TTFT 500 ms, ITL 50 ms
    rps, ttft_ms, itl_ms = find_best_engine_agg_rps(
        upstream_plane, isl=2048.0, osl=150.0, max_num_batched_tokens=4096,
        ttft_sla_ms=500.0, itl_sla_ms=50.0,
    )  # fmt: skip
    assert rps > 0 and ttft_ms >= 0 and itl_ms >= 0


def test_agg_ttft_estimate_matches_upstream() -> None:
    # test_2d_regression: no queue, budget 2048, 3000 decode KV tokens → a positive TTFT; the
    # plane gives it exactly: one 1024-token chunk (the upstream model's mean ISL here).
    ttft = estimate_next_ttft(
        upstream_plane, queued_prefill_tokens=0, avg_isl=1024.0, max_num_batched_tokens=2048,
        current_decode_kv=3000, decodes=10,
    )  # fmt: skip
    assert ttft == pytest.approx(0.001 * 1024 + 0.0001 * 3000 + 0.001)


def test_agg_empty_inputs_give_no_capacity() -> None:
    # test_find_best_engine_agg_rps_insufficient_data's answer, for inputs with nothing to size
    assert find_best_engine_agg_rps(
        upstream_plane, isl=0.0, osl=150.0, max_num_batched_tokens=4096,
        ttft_sla_ms=500.0, itl_sla_ms=50.0,
    ) == (0.0, 0.0, 0.0)  # fmt: skip
    assert agg_replicas(10.0, 0.0) is None


def test_agg_sweep_stops_at_the_largest_batch_within_the_itl() -> None:
    # A constant 50 ms step, TTFT free: the ITL target of 50 ms admits every batch up to the
    # prefill-balance cap isl / (budget − x) ≤ osl, here x ≤ 999 (budget 1000, isl = osl = 100).
    def flat(_p: float, _d: float, _n: int) -> float:
        return 0.05

    rps, _, itl_ms = find_best_engine_agg_rps(
        flat, isl=100.0, osl=100.0, max_num_batched_tokens=1000,
        ttft_sla_ms=10_000.0, itl_sla_ms=50.0,
    )  # fmt: skip
    assert itl_ms == pytest.approx(50.0)
    assert rps == pytest.approx(999 / (100 * 0.05))
    tight, _, _ = find_best_engine_agg_rps(
        flat, isl=100.0, osl=100.0, max_num_batched_tokens=1000,
        ttft_sla_ms=10_000.0, itl_sla_ms=49.0,
    )  # fmt: skip
    assert tight == pytest.approx(1 / (100 * 0.05))  # batch 1 misses: its rate, reported


def test_agg_replicas_is_demand_over_engine_rate_within_bounds() -> None:
    assert agg_replicas(10.0, 3.0) == 4
    assert agg_replicas(0.1, 3.0) == 1  # min_endpoint
    assert agg_replicas(100.0, 3.0, max_replicas=8) == 8


def test_profile_capacity_meets_the_slos_it_was_sized_for() -> None:
    profile = load_profile("sim:llama-3-8b-80g")
    rps, ttft_ms, itl_ms = find_best_engine_agg_rps(
        profile_wall_time(profile), isl=1000.0, osl=200.0,
        max_num_batched_tokens=profile.step_token_budget, ttft_sla_ms=2000.0, itl_sla_ms=100.0,
        max_kv_tokens=profile.kv_capacity_tokens, max_num_seqs=64,
    )  # fmt: skip
    assert rps > 0 and ttft_ms <= 2000.0 and itl_ms <= 100.0
