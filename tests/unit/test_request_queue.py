"""The bounded priority queue: order, aging, bounds with Retry-After, timeouts, cancellation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wok_runtime.core.request_queue import (
    DEFAULT_RETRY_AFTER_S,
    CompletionRate,
    QueueFullError,
    RequestQueue,
)
from wok_runtime.core.sampling_params import SamplingParams
from wok_runtime.core.sequence import Sequence, SequenceStatus


def seq(
    rid: str, priority: int = 1, arrival: float = 0.0, deadline: float | None = None
) -> Sequence:
    return Sequence(
        request_id=rid,
        prompt_token_ids=[1],
        params=SamplingParams(),
        arrival_time=arrival,
        priority=priority,
        queue_deadline=deadline,
    )


def ids(queue: RequestQueue, now: float) -> list[str]:
    return [s.request_id for s in queue.in_order(now)]


def test_lower_priority_number_first_fifo_within_a_class() -> None:
    q = RequestQueue(max_size=10, aging_s=0)
    for rid, prio, t in [
        ("b1", 2, 0.0),
        ("a1", 1, 1.0),
        ("b2", 2, 2.0),
        ("c1", 0, 3.0),
        ("a2", 1, 4.0),
    ]:
        q.push(seq(rid, prio, t), now=t)
    assert ids(q, now=5.0) == ["c1", "a1", "a2", "b1", "b2"]
    assert q.count_by_priority() == {0: 1, 1: 2, 2: 2}


def test_aging_lifts_a_class_per_aging_interval_so_nothing_starves() -> None:
    q = RequestQueue(max_size=10, aging_s=10.0)
    q.push(seq("old-batch", priority=2, arrival=0.0), now=0.0)
    q.push(seq("new-interactive", priority=0, arrival=15.0), now=15.0)
    # at t=15 the batch request has waited one interval: effective priority 1, still behind
    assert q.effective_priority(q.get("old-batch"), 15.0) == 1
    assert ids(q, now=15.0) == ["new-interactive", "old-batch"]
    # at t=20 it has waited two intervals: effective priority 0, and it arrived first
    assert ids(q, now=20.0) == ["old-batch", "new-interactive"]


def test_full_queue_refuses_with_retry_after_from_littles_law() -> None:
    q = RequestQueue(max_size=8, aging_s=0, timeout_s=30.0)
    for n in range(8):
        q.push(seq(f"r{n}"), now=0.0)
    with pytest.raises(QueueFullError) as caught:
        q.push(seq("late"), now=0.0)
    assert caught.value.retry_after_s == DEFAULT_RETRY_AFTER_S  # no completions yet
    assert "queue full" in caught.value.reason
    for n in range(10):  # 10 completions in 5 s: 2 per second
        q.completions.record(0.5 * (n + 1))
    with pytest.raises(QueueFullError) as caught:
        q.push(seq("late"), now=5.0)
    assert caught.value.retry_after_s == pytest.approx(8 / 2.0)  # 8 waiting ÷ 2 per second


def _burst_after_idle(timeout_s: float) -> float:
    """A warm-up completion at 0, nothing until a burst fills the queue at 50, then one
    completion per second; the Retry-After of a refusal at 60."""
    q = RequestQueue(max_size=8, aging_s=0, timeout_s=timeout_s)
    q.completions.record(0.0)
    for n in range(8):
        q.push(seq(f"r{n}", arrival=50.0), now=50.0)
    for t in range(51, 61):
        q.completions.record(float(t))
    with pytest.raises(QueueFullError) as caught:
        q.push(seq("late", arrival=60.0), now=60.0)
    return caught.value.retry_after_s


def test_retry_after_counts_the_drain_since_the_backlog_began_not_the_idle_before():
    # 8 waiting, draining at 1 per second: 8 s (over the whole minute: 11 / 60 s, so 44 s).
    assert _burst_after_idle(timeout_s=30.0) == pytest.approx(8.0)


def test_retry_after_is_clipped_to_one_second_and_the_queue_timeout():
    assert _burst_after_idle(timeout_s=5.0) == 5.0  # by then each waiting request has left
    q = RequestQueue(max_size=1, aging_s=0, timeout_s=30.0)
    q.push(seq("a"), now=0.0)
    for n in range(100):
        q.completions.record(n / 100)
    with pytest.raises(QueueFullError) as caught:
        q.push(seq("b"), now=1.0)
    assert caught.value.retry_after_s == 1.0  # 1 waiting ÷ 100 per second, whole seconds


def test_requeue_ignores_the_bound_and_goes_ahead_of_later_arrivals() -> None:
    q = RequestQueue(max_size=1, aging_s=0)
    q.push(seq("late", arrival=5.0), now=5.0)
    q.requeue(seq("preempted", arrival=1.0))
    assert ids(q, now=6.0) == ["preempted", "late"]


def test_expire_removes_only_requests_past_their_deadline() -> None:
    q = RequestQueue(max_size=10, aging_s=0)
    q.push(seq("short", deadline=1.0), now=0.0)
    q.push(seq("long", deadline=5.0), now=0.0)
    q.push(seq("never"), now=0.0)
    assert q.next_deadline() == 1.0
    assert [s.request_id for s in q.expire(now=2.0)] == ["short"]
    assert ids(q, now=2.0) == ["long", "never"]
    assert q.next_deadline() == 5.0


def test_remove_cancels_and_status_is_waiting_while_queued() -> None:
    q = RequestQueue(max_size=10, aging_s=0)
    s = seq("a")
    q.push(s, now=0.0)
    assert s.status is SequenceStatus.WAITING and "a" in q
    assert q.remove("a") is s
    assert q.remove("a") is None and len(q) == 0 and q.count_by_priority() == {}


def test_completion_rate_window() -> None:
    rate = CompletionRate(window_s=10.0)
    assert rate.rate(0.0) == 0.0
    for t in range(5):
        rate.record(float(t))
    assert rate.rate(5.0) == pytest.approx(1.0)
    assert rate.rate(100.0) == 0.0  # everything fell out of the window


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["push", "remove", "expire"]), st.integers(0, 3), st.floats(0, 50)
        ),
        max_size=60,
    ),
    st.sampled_from([0.0, 5.0]),
)
def test_property_order_and_bounds(ops: list[tuple[str, int, float]], aging_s: float) -> None:
    q = RequestQueue(max_size=8, aging_s=aging_s)
    now = 0.0
    live: dict[str, Sequence] = {}
    for n, (op, prio, dt) in enumerate(ops):
        now += dt / 10
        if op == "push":
            s = seq(f"r{n}", priority=prio, arrival=now, deadline=now + dt)
            if len(q) >= 8:
                with pytest.raises(QueueFullError) as caught:
                    q.push(s, now)
                assert caught.value.retry_after_s > 0
            else:
                q.push(s, now)
                live[s.request_id] = s
        elif op == "remove" and live:
            rid = sorted(live)[prio % len(live)]
            assert q.remove(rid) is live.pop(rid)
        else:
            for s in q.expire(now):
                assert s.queue_deadline is not None and s.queue_deadline <= now
                live.pop(s.request_id)
        assert len(q) == len(live) <= 8
        order = list(q.in_order(now))
        assert {s.request_id for s in order} == set(live)
        keys = [(q.effective_priority(s, now), s.arrival_time) for s in order]
        assert keys == sorted(keys)
