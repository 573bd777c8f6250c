"""How many requests the client keeps in flight: an AIMD window, like TCP's congestion window.

The server says when it is full (429); the client cannot know its capacity otherwise, so it
probes upward by one request per success and halves on a 429, never above --max-concurrency.
"""

from __future__ import annotations

import asyncio
from typing import Literal

Outcome = Literal["ok", "throttled", "other"]


class AdaptiveLimit:
    """A semaphore whose size follows the answers: +1 per success, halved on a 429.

    A burst of 429s from requests that were all sent before one cut is one overload, not many:
    each cut starts a new epoch, and a 429 halves the window only if its request was sent in the
    current epoch (otherwise a burst would collapse the window to one).
    """

    def __init__(self, maximum: int, *, initial: int = 1) -> None:
        if maximum < 1 or initial < 1:
            raise ValueError(f"concurrency must be >= 1, got maximum={maximum} initial={initial}")
        self.maximum = maximum
        self.limit = min(initial, maximum)
        self.in_flight = 0
        self._epoch = 0
        self._changed = asyncio.Condition()

    async def acquire(self) -> int:
        """Wait for a free slot; returns the epoch to hand back to release()."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1
            return self._epoch

    async def release(self, epoch: int, outcome: Outcome) -> None:
        async with self._changed:
            self.in_flight -= 1
            if outcome == "ok":
                self.limit = min(self.maximum, self.limit + 1)
            elif outcome == "throttled" and epoch == self._epoch:
                self.limit = max(1, self.limit // 2)
                self._epoch += 1
            self._changed.notify_all()
