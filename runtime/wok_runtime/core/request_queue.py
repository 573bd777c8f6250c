"""The bounded priority queue in front of the scheduler.

Why a queue of its own: admission control lives here. A full queue refuses work at once with a
`retry_after_s` instead of letting latency grow without bound: Little's law, the queue's length
over its measured drain rate (completions since the queue's backlog began, so that idle time
before a burst does not read as a slow drain), clipped to [1 s, the queue timeout] (a waiting
request is served or expires within the timeout, so the queue turns over within it). Each
request may set a shorter wait limit than the engine's; priorities are served lowest-number
first, FIFO within a class, and aging lifts a request one class for every `aging_s` it has
waited, so no class starves. Pure Python: times are passed in, never read.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Iterator

from wok_runtime.core.sequence import Sequence, SequenceStatus

DEFAULT_RETRY_AFTER_S = 1.0  # before any completion there is no rate to divide by
MIN_RETRY_AFTER_S = 1.0  # Retry-After is in whole seconds
MAX_RETRY_AFTER_S = 600.0  # without a queue timeout to clip to


class QueueFullError(Exception):
    """The request was refused before queuing; try again after `retry_after_s` seconds."""

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(f"{reason} (retry after {retry_after_s:.2f} s)")
        self.reason = reason
        self.retry_after_s = retry_after_s


class CompletionRate:
    """Completions per second over a sliding window (the denominator of Little's law)."""

    def __init__(self, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._times: deque[float] = deque()
        self.total = 0

    def record(self, now: float) -> None:
        self._times.append(now)
        self.total += 1
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()

    def rate(self, now: float, since: float | None = None) -> float:
        """Completions per second over the window, or only since `since` (when a backlog
        began); 0.0 without a completion to count."""
        self._trim(now)
        start = now - self.window_s if since is None else max(since, now - self.window_s)
        count = len(self._times) - bisect.bisect_left(self._times, start)  # times are sorted
        if count == 0:
            return 0.0
        if since is None:
            start = self._times[-count]  # over a short history the window would understate it
        return count / max(now - start, 1.0)


class RequestQueue:
    def __init__(
        self,
        max_size: int,
        aging_s: float = 10.0,
        *,
        name: str = "queue",
        timeout_s: float = MAX_RETRY_AFTER_S,
    ) -> None:
        """`timeout_s`: the longest a request may wait here (the engine's queue timeout), the
        longest Retry-After that means anything."""
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if not math.isfinite(aging_s) or aging_s < 0:
            raise ValueError(f"aging_s must be >= 0 (0 = no aging), got {aging_s}")
        self.max_size = max_size
        self.aging_s = aging_s
        self.name = name  # for the refusal's message ("queue", "batch queue")
        # One list per priority class, each sorted by arrival time (FIFO within the class).
        self._classes: dict[int, list[Sequence]] = {}
        self._by_id: dict[str, Sequence] = {}
        self.completions = CompletionRate()
        self.timeout_s = timeout_s
        self._backlog_since: float | None = None  # when the queue last went from empty to not

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def drain_rate(self, now: float) -> float:
        """Requests per second the queue drains at: completions since its backlog began, or,
        before the backlog's first one, over the recent window."""
        rate = 0.0
        if self._backlog_since is not None:
            rate = self.completions.rate(now, since=self._backlog_since)
        return rate or self.completions.rate(now)

    def retry_after_s(self, now: float) -> float:
        rate = self.drain_rate(now)
        wait = len(self) / rate if rate > 0 else DEFAULT_RETRY_AFTER_S
        return min(max(wait, MIN_RETRY_AFTER_S), max(self.timeout_s, MIN_RETRY_AFTER_S))

    def push(self, seq: Sequence, now: float) -> None:
        """Queues a new request, or raises QueueFullError when the queue is at its bound."""
        if len(self) >= self.max_size:
            raise QueueFullError(
                f"{self.name} full ({len(self)} waiting, max {self.max_size})",
                self.retry_after_s(now),
            )
        if not self._by_id:
            self._backlog_since = now
        self._insert(seq)

    def requeue(self, seq: Sequence) -> None:
        """Puts a preempted request back, ahead of later arrivals; never refused (it was
        accepted once, and refusing it now would lose its work)."""
        self._insert(seq)

    def _insert(self, seq: Sequence) -> None:
        assert seq.request_id not in self._by_id, f"{seq.request_id} queued twice"
        seq.status = SequenceStatus.WAITING
        members = self._classes.setdefault(seq.priority, [])
        bisect.insort_right(members, seq, key=lambda s: s.arrival_time)
        self._by_id[seq.request_id] = seq

    def remove(self, request_id: str) -> Sequence | None:
        """Takes a request out of the queue (admitted, cancelled or expired)."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return None
        members = self._classes[seq.priority]
        members.remove(seq)
        if not members:
            del self._classes[seq.priority]
        if not self._by_id:
            self._backlog_since = None
        return seq

    def effective_priority(self, seq: Sequence, now: float) -> int:
        if self.aging_s <= 0:
            return seq.priority
        waited = max(0.0, now - seq.arrival_time)
        return seq.priority - math.floor(waited / self.aging_s)

    def in_order(self, now: float) -> Iterator[Sequence]:
        """Waiting requests in service order: (effective priority, arrival time), lazily.

        Within one class a later arrival never has a better key than an earlier one (it has
        waited less), so merging the sorted classes gives the global order without a full sort.
        Do not modify the queue while iterating: collect, then `remove`.
        """

        def key(s: Sequence) -> tuple[int, float]:
            return (self.effective_priority(s, now), s.arrival_time)

        yield from heapq.merge(*self._classes.values(), key=key)

    def expire(self, now: float) -> list[Sequence]:
        """Removes and returns the requests whose queue deadline has passed."""
        expired = [
            s
            for s in self._by_id.values()
            if s.queue_deadline is not None and now >= s.queue_deadline
        ]
        for seq in expired:
            self.remove(seq.request_id)
        return expired

    def next_deadline(self) -> float | None:
        deadlines = [s.queue_deadline for s in self._by_id.values() if s.queue_deadline is not None]
        return min(deadlines, default=None)

    def oldest_arrival(self) -> float | None:
        return min((m[0].arrival_time for m in self._classes.values()), default=None)

    def count_by_priority(self) -> dict[int, int]:
        return {p: len(m) for p, m in sorted(self._classes.items())}
