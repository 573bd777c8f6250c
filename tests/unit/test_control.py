"""The control law, by its properties: bounded, small steps, safe under SLO breach and no data,
stable under noise, and convergent under steady load."""

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from wok_operator.api import InferenceServiceSpec
from wok_operator.control import Decision, LawParams, LoopState, Observation, decide


@st.composite
def law_params(draw: st.DrawFn) -> LawParams:
    batch_min = draw(st.integers(1, 16))
    batch_max = draw(st.integers(batch_min, 256))
    replicas_min = draw(st.integers(0, 4))
    return LawParams(
        batch_min=batch_min,
        batch_max=batch_max,
        batch_mem=draw(st.integers(0, 300)),
        batch_step=draw(st.integers(1, 16)),
        replicas_min=replicas_min,
        replicas_max=draw(st.integers(max(replicas_min, 1), 20)),
        replicas_step=draw(st.integers(1, 3)),
        target_queue=draw(st.floats(0, 32)),
        deadband=draw(st.floats(0, 8)),
        slo_p99_seconds=draw(st.floats(0.1, 30)),
        kv_usage_ceiling=draw(st.floats(0.5, 1.0)),
        scale_up_window_s=draw(st.sampled_from([0, 5, 15, 30])),
        scale_down_window_s=draw(st.sampled_from([0, 30, 120, 300])),
    )


maybe_metric = st.one_of(st.none(), st.just(math.nan), st.floats(0, 1000))

observations = st.builds(
    Observation,
    queue_per_replica=maybe_metric,
    p99_seconds=maybe_metric,
    kv_usage=st.one_of(st.none(), st.just(math.nan), st.floats(0, 1)),
    ready_replicas=st.integers(0, 20),
    pending_replicas=st.integers(0, 5),
    p99_service_seconds=maybe_metric,
    running_per_replica=st.one_of(st.none(), st.floats(0, 300)),
)

states = st.builds(
    LoopState,
    batch=st.integers(0, 400),
    replicas=st.integers(0, 25),
    queue_high_since=st.one_of(st.none(), st.floats(0, 1000)),
    queue_low_since=st.one_of(st.none(), st.floats(0, 1000)),
    slo_breached_since=st.one_of(st.none(), st.floats(0, 1000)),
    last_batch_increase=st.one_of(st.none(), st.floats(0, 1000)),
    last_batch_decrease=st.one_of(st.none(), st.floats(0, 1000)),
    last_replica_change=st.one_of(st.none(), st.floats(0, 1000)),
)


def clipped(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@settings(max_examples=400, deadline=None)
@given(state=states, obs=observations, params=law_params(), now=st.floats(1000, 2000))
def test_outputs_stay_in_bounds_and_under_the_memory_cap(state, obs, params, now):
    d = decide(state, obs, params, now)
    assert params.batch_floor <= d.batch <= params.batch_cap
    assert d.batch <= max(params.batch_mem, 1)
    assert d.batch <= params.batch_max
    assert params.replicas_floor <= d.replicas <= params.replicas_max
    assert d.state.batch == d.batch and d.state.replicas == d.replicas
    assert d.reason


@settings(max_examples=400, deadline=None)
@given(state=states, obs=observations, params=law_params(), now=st.floats(1000, 2000))
def test_a_step_never_exceeds_eta(state, obs, params, now):
    d = decide(state, obs, params, now)
    start_batch = clipped(state.batch, params.batch_floor, params.batch_cap)
    start_replicas = clipped(state.replicas, params.replicas_floor, params.replicas_max)
    assert abs(d.batch - start_batch) <= params.batch_step
    assert abs(d.replicas - start_replicas) <= params.replicas_step


@settings(max_examples=400, deadline=None)
@given(state=states, obs=observations, params=law_params(), now=st.floats(1000, 2000))
def test_slo_breach_never_raises_the_batch(state, obs, params, now):
    assume(obs.p99_seconds is not None and math.isfinite(obs.p99_seconds))
    assume(obs.p99_seconds > params.slo_p99_seconds)
    d = decide(state, obs, params, now)
    assert d.batch <= clipped(state.batch, params.batch_floor, params.batch_cap)


@settings(max_examples=300, deadline=None)
@given(
    state=states,
    params=law_params(),
    queue=st.sampled_from([None, math.nan, math.inf]),
    ready=st.integers(0, 5),
    now=st.floats(1000, 2000),
)
def test_missing_data_holds_and_never_scales_to_zero(state, params, queue, ready, now):
    obs = Observation(
        queue_per_replica=queue,
        p99_seconds=math.nan,
        kv_usage=None,
        ready_replicas=ready,
        pending_replicas=0,
    )
    d = decide(state, obs, params, now)
    assert d.metrics_missing
    assert d.batch == clipped(state.batch, params.batch_floor, params.batch_cap)
    assert d.replicas == clipped(state.replicas, params.replicas_floor, params.replicas_max)
    assert d.replicas >= 1
    assert d.reason.startswith("holding")


def default_params(**overrides: float) -> LawParams:
    spec = InferenceServiceSpec()
    return LawParams(**{**LawParams.from_spec(spec, batch_mem=64).__dict__, **overrides})


def obs(
    queue: float,
    *,
    p99: float = 1.0,
    ready: int = 1,
    pending: int = 0,
    service: float | None = None,
    running: float | None = None,
) -> Observation:
    return Observation(
        queue_per_replica=queue,
        p99_seconds=p99,
        kv_usage=0.5,
        ready_replicas=ready,
        pending_replicas=pending,
        p99_service_seconds=service,
        running_per_replica=running,
    )


def test_queue_above_target_raises_the_batch_at_once():
    d = decide(LoopState(batch=8, replicas=1), obs(20), default_params(), now=0)
    assert (d.batch, d.replicas) == (12, 1)
    assert "batch 8→12" in d.reason and "queue 20.0/replica" in d.reason


def test_replicas_rise_only_with_the_batch_at_its_cap_after_the_up_window():
    params = default_params(scale_up_window_s=15)
    state = LoopState(batch=64, replicas=1)
    first = decide(state, obs(20), params, now=0)
    assert first.replicas == 1
    later = decide(first.state, obs(20), params, now=15)
    assert later.replicas == 2 and "batch at cap 64" in later.reason


def test_cascade_guard_waits_for_pending_pods():
    params = default_params(scale_up_window_s=0)
    d = decide(LoopState(batch=64, replicas=2), obs(20, ready=1, pending=1), params, now=0)
    assert d.replicas == 2 and "pending" in d.reason


def test_slo_breach_from_service_time_lowers_the_batch_once_per_window():
    params = default_params(scale_up_window_s=15)
    state = LoopState(batch=32, replicas=1)
    first = decide(state, obs(4, p99=9, service=8), params, now=0)
    assert first.batch == 28 and first.slo_breached
    held = decide(first.state, obs(4, p99=9, service=8), params, now=5)
    assert held.batch == 28
    again = decide(held.state, obs(4, p99=9, service=8), params, now=15)
    assert again.batch == 24


def test_slo_breach_from_queueing_holds_the_batch_and_adds_replicas():
    params = default_params(scale_up_window_s=0)
    d = decide(LoopState(batch=32, replicas=1), obs(30, p99=9, service=2), params, now=0)
    assert d.batch == 32 and d.replicas == 2
    assert "from queueing" in d.reason


def test_memory_cap_wins_over_max_batch():
    params = default_params(batch_mem=20)
    d = decide(LoopState(batch=40, replicas=1), obs(50), params, now=0)
    assert d.batch == 20 and d.memory_bound
    assert "clipped" in d.reason


def test_scale_down_needs_the_whole_window_and_must_fit():
    params = default_params(scale_down_window_s=120)
    state = LoopState(batch=64, replicas=3)
    d = decide(state, obs(0, ready=3, running=10), params, now=0)
    for now in range(5, 120, 5):
        d = decide(d.state, obs(0, ready=3, running=10), params, now=now)
        assert d.replicas == 3
    d = decide(d.state, obs(0, ready=3, running=10), params, now=120)
    assert d.replicas == 2 and "queue short for 120s" in d.reason
    crowded = decide(
        LoopState(batch=64, replicas=3, queue_low_since=0),
        obs(0, ready=3, running=60),
        params,
        now=500,
    )
    assert crowded.replicas == 3 and "could not hold the load" in crowded.reason


@settings(max_examples=200, deadline=None)
@given(
    params=law_params(),
    level=st.floats(0, 64),
    noise=st.lists(st.floats(-1, 1), min_size=40, max_size=120),
    start_batch=st.integers(1, 256),
    start_replicas=st.integers(1, 20),
)
def test_no_direction_reversal_inside_a_window_under_noisy_steady_input(
    params, level, noise, start_batch, start_replicas
):
    interval = 5.0
    state = LoopState(batch=start_batch, replicas=start_replicas)
    last_move: dict[str, tuple[int, float]] = {}
    for tick, wiggle in enumerate(noise):
        now = tick * interval
        queue = max(0.0, level + wiggle * (params.deadband + 2))
        d = decide(state, obs(queue, p99=0.0, ready=state.replicas or 1), params, now)
        for knob, before, after in (
            ("batch", d.batch_before, d.batch),
            ("replicas", d.replicas_before, d.replicas),
        ):
            if after == before:
                continue
            direction = 1 if after > before else -1
            previous = last_move.get(knob)
            if previous and previous[0] == -direction:
                window = params.scale_up_window_s if direction > 0 else params.scale_down_window_s
                if knob == "batch" and direction > 0:
                    window = 0.0  # the batch rises at once: fast up is the point
                assert now - previous[1] >= window, (knob, previous, now, d.reason)
            last_move[knob] = (direction, now)
        state = d.state


def steady_plant(demand: float, state: LoopState) -> Observation:
    """`demand` requests in the system; each replica runs up to `batch`, the rest wait."""
    per_replica = demand / state.replicas
    running = min(per_replica, state.batch)
    return Observation(
        queue_per_replica=per_replica - running,
        p99_seconds=0.5,
        kv_usage=0.2,
        ready_replicas=state.replicas,
        pending_replicas=0,
        running_per_replica=running,
    )


@settings(max_examples=100, deadline=None)
@given(
    params=law_params(),
    demand=st.floats(0, 2000),
    start_batch=st.integers(1, 256),
    start_replicas=st.integers(1, 20),
)
def test_converges_from_any_start_under_steady_load(params, demand, start_batch, start_replicas):
    # A sign-step settles when one step cannot jump over the deadband.
    assume(params.batch_step <= 2 * params.deadband)
    interval = 5.0
    state = LoopState(batch=start_batch, replicas=start_replicas)
    # Slow down means one step per window: allow every step its window, and then some.
    steps = 256 // params.batch_step + 20 // params.replicas_step + 4
    ticks = int(steps * (params.scale_down_window_s + params.scale_up_window_s + interval) / 5)
    history: list[Decision] = []
    for tick in range(ticks + 100):
        d = decide(state, steady_plant(demand, state), params, now=tick * interval)
        history.append(d)
        state = d.state
    tail = history[-100:]
    assert len({(d.batch, d.replicas) for d in tail}) == 1, [d.reason for d in tail[-5:]]
