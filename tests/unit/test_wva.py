"""The WVA queueing-model port against upstream's own tables.

Rows transcribed from llm-d/llm-d-workload-variant-autoscaler at
b08b1c77c89d284361e40b2a9315e93ef46e7022: pkg/analyzer/utils_test.go (TestWithinTolerance,
TestBinarySearch) and pkg/analyzer/queueanalyzer_test.go (TestNewQueueAnalyzer,
TestConfiguration_Check, TestRequestSize_Check, TestPrefillParms_PrefillTime,
TestDecodeParms_DecodeTime, TestBuildModel, TestQueueAnalyzer_Analyze, TestQueueAnalyzer_Size)."""

from __future__ import annotations

import pytest

from wok_contracts.profile import load_profile
from wok_sim.wva import (
    AnalyzerError,
    Configuration,
    QueueAnalyzer,
    RequestSize,
    ServiceParms,
    TargetPerf,
    binary_search,
    replicas_for,
    within_tolerance,
)
from wok_sim.wva_policy import service_parms

TEST_PARMS = ServiceParms(alpha=1.0, beta=0.01, gamma=0.001)
TEST_CONFIG = Configuration(max_batch_size=8, max_queue_size=16, service_parms=TEST_PARMS)


@pytest.mark.parametrize(
    ("case", "x", "value", "tolerance", "expected"),
    [
        ("exact match", 1.0, 1.0, 0.01, True),
        ("within tolerance", 1.005, 1.0, 0.01, True),
        ("outside tolerance", 1.02, 1.0, 0.01, False),
        ("zero value", 0.1, 0.0, 0.01, False),
        ("negative tolerance", 1.0, 1.0, -0.01, True),
        ("both zero", 0.0, 0.0, 0.01, True),
    ],
)
def test_within_tolerance_matches_upstream(case, x, value, tolerance, expected):
    assert within_tolerance(x, value, tolerance) is expected, case


def _raises_above_5(x: float) -> float:
    if x > 5.0:
        raise AnalyzerError("x too large")
    return x


@pytest.mark.parametrize(
    ("case", "x_min", "x_max", "target", "f", "indicator"),
    [
        ("find square root", 0.0, 10.0, 4.0, lambda x: x * x, 0),
        ("linear function - target in range", 1.0, 5.0, 6.0, lambda x: 2 * x, 0),
        ("linear function - target below range", 2.0, 5.0, 1.0, lambda x: 2 * x, -1),
        ("linear function - target above range", 1.0, 3.0, 10.0, lambda x: 2 * x, 1),
        ("decreasing function - target in range", 1.0, 5.0, -3.0, lambda x: -x, 0),
        ("target at boundary", 1.0, 5.0, 2.0, lambda x: 2 * x, 0),
    ],
)
def test_binary_search_matches_upstream(case, x_min, x_max, target, f, indicator):
    x_star, got = binary_search(x_min, x_max, target, f)
    assert got == indicator, case
    if indicator == 0:
        assert abs(f(x_star) - target) <= 0.1, case
    else:
        assert x_star == (x_min if indicator < 0 else x_max), case


@pytest.mark.parametrize(
    ("case", "x_min", "x_max", "f"),
    [
        ("invalid range", 5.0, 1.0, lambda x: 2 * x),
        ("function evaluation error", 4.0, 6.0, _raises_above_5),
    ],
)
def test_binary_search_errors_match_upstream(case, x_min, x_max, f):
    with pytest.raises(AnalyzerError):
        binary_search(x_min, x_max, 3.0 if case == "invalid range" else 5.0, f)


@pytest.mark.parametrize(
    ("case", "inputs", "outputs", "ok"),
    [
        ("no prefill", 0, 10, True),
        ("no prefill, one output token", 0, 1, True),
        ("no decode", 100, 1, True),
        ("mixed prefill and decode", 200, 20, True),
        ("zero input and output tokens", 0, 0, False),
        ("negative tokens", -1, -1, False),
        ("no decode, no first output token", 50, 0, False),
        ("negative input tokens", -1, 10, False),
        ("negative output tokens", 100, -1, False),
    ],
)
def test_request_size_checks_match_upstream(case, inputs, outputs, ok):
    size = RequestSize(avg_input_tokens=inputs, avg_output_tokens=outputs)
    if ok:
        assert QueueAnalyzer(TEST_CONFIG, size).rate_max > 0, case
    else:
        with pytest.raises(AnalyzerError):
            QueueAnalyzer(TEST_CONFIG, size)


@pytest.mark.parametrize(
    ("case", "config"),
    [
        ("zero max batch size", Configuration(0, 16, TEST_PARMS)),
        ("negative max batch size", Configuration(-1, 16, TEST_PARMS)),
        ("negative max queue size", Configuration(8, -1, TEST_PARMS)),
        ("nil service parameters", Configuration(8, 16, None)),
    ],
)
def test_configuration_checks_match_upstream(case, config):
    with pytest.raises(AnalyzerError):
        QueueAnalyzer(config, RequestSize(100, 10))


@pytest.mark.parametrize(
    ("case", "inputs", "batch", "expected"),
    [
        ("no input tokens", 0, 4.0, 0.0),
        ("small batch", 1000, 1.0, 32.0),
        ("large batch", 2000, 8.0, 208.0),
        ("fractional batch size", 500, 2.5, 29.25),
    ],
)
def test_prefill_time_matches_upstream(case, inputs, batch, expected):
    parms = ServiceParms(alpha=10.0, beta=0.01, gamma=0.001)
    size = RequestSize(avg_input_tokens=inputs, avg_output_tokens=0)
    assert parms.prefill_time(size, batch) == pytest.approx(expected, abs=1e-6), case


@pytest.mark.parametrize(
    ("case", "batch", "expected"),
    [
        ("single request", 1.0, 1.23),
        ("medium batch", 4.0, 1.575),
        ("large batch", 8.0, 2.035),
        ("fractional batch size", 2.5, 1.4025),
    ],
)
def test_decode_time_matches_upstream(case, batch, expected):
    parms = ServiceParms(alpha=1.0, beta=0.1, gamma=0.01)
    size = RequestSize(avg_input_tokens=1, avg_output_tokens=1)
    assert parms.decode_time(size, batch) == pytest.approx(expected, abs=1e-6), case


def test_build_model_matches_upstream() -> None:
    analyzer = QueueAnalyzer(TEST_CONFIG, RequestSize(100, 10))
    assert 0 < analyzer.rate_min < analyzer.rate_max
    assert analyzer.model.K == 8 + 16


@pytest.fixture
def analyzer() -> QueueAnalyzer:
    return QueueAnalyzer(TEST_CONFIG, RequestSize(100, 10))


@pytest.mark.parametrize(
    ("case", "rate_of", "ok"),
    [
        ("zero request rate", lambda lo, hi: 0.0, False),
        ("negative request rate", lambda lo, hi: -1.0, False),
        ("low request rate", lambda lo, hi: lo * 0.5, True),
        ("medium request rate", lambda lo, hi: (lo + hi) * 0.5, True),
        ("high request rate within bounds", lambda lo, hi: hi * 0.9, True),
        ("request rate exceeding maximum", lambda lo, hi: hi * 1.1, False),
    ],
)
def test_analyze_matches_upstream(analyzer, case, rate_of, ok):
    rate = rate_of(analyzer.rate_min, analyzer.rate_max)
    if not ok:
        with pytest.raises(AnalyzerError):
            analyzer.analyze(rate)
        return
    m = analyzer.analyze(rate)
    assert min(m.throughput, m.avg_resp_time, m.avg_wait_time, m.avg_num_in_serv) >= 0, case
    assert min(m.avg_prefill_time, m.avg_token_time) >= 0 and 0 <= m.rho <= 1, case


@pytest.mark.parametrize(
    ("case", "target", "ok"),
    [
        ("valid targets", TargetPerf(50.0, 5.0, 100.0), True),
        ("zero targets (disabled)", TargetPerf(0.0, 0.0, 0.0), True),
        ("negative TTFT target", TargetPerf(-1.0, 5.0, 100.0), False),
        ("negative ITL target", TargetPerf(50.0, -1.0, 100.0), False),
        ("negative TPS target", TargetPerf(50.0, 5.0, -1.0), False),
    ],
)
def test_size_matches_upstream(analyzer, case, target, ok):
    if not ok:
        with pytest.raises(AnalyzerError):
            analyzer.size_for(target)
        return
    rates, metrics = analyzer.size_for(target)
    assert min(rates) >= 0 and metrics.avg_ttft >= 0 and metrics.avg_token_time >= 0, case


def test_sizing_meets_the_targets_it_was_asked_for(analyzer) -> None:
    (ttft_rate, itl_rate, _), metrics = analyzer.size_for(TargetPerf(ttft_ms=50.0, itl_ms=5.0))
    assert metrics.avg_ttft <= 50.0 * (1 + 1e-5) and metrics.avg_token_time <= 5.0 * (1 + 1e-5)
    # the throughput at the smaller rate, less the requests the full queue turns away
    assert 0.9 * min(ttft_rate, itl_rate) < metrics.throughput <= min(ttft_rate, itl_rate)


def test_replicas_are_the_load_over_one_replicas_rate() -> None:
    size = RequestSize(100, 10)
    target = TargetPerf(ttft_ms=50.0, itl_ms=5.0)
    one = QueueAnalyzer(Configuration(8, 80, TEST_PARMS), size).size_for(target)[1].throughput
    assert replicas_for(2.5 * one, size, parms=TEST_PARMS, max_batch=8, target=target) == 3
    assert replicas_for(0.0, size, parms=TEST_PARMS, max_batch=8, target=target) == 1
    unreachable = TargetPerf(ttft_ms=0.001)  # below the bounded region: no allocation
    assert replicas_for(1.0, size, parms=TEST_PARMS, max_batch=8, target=unreachable) is None


def test_profile_parms_reproduce_the_profile_iteration_time() -> None:
    profile = load_profile("sim:llama-3-8b-80g")
    size = RequestSize(avg_input_tokens=1000.0, avg_output_tokens=200.0)
    parms = service_parms(profile, size)
    n = 32
    wok_step = profile.step_seconds(n, n * 1000.0 / 201.0, n * (1000.0 + 100.0))
    assert parms.iteration_time(size, n) == pytest.approx(1000.0 * wok_step)
