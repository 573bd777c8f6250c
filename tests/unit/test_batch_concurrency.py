"""The batch client's adaptive window (AIMD) and its Retry-After reading."""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate

import pytest

from wok_batch.client import retry_after_seconds
from wok_batch.concurrency import AdaptiveLimit


async def test_the_window_grows_by_one_per_success_up_to_the_maximum():
    limit = AdaptiveLimit(3)
    assert limit.limit == 1
    for expected in (2, 3, 3):
        await limit.release(await limit.acquire(), "ok")
        assert limit.limit == expected
    await limit.release(await limit.acquire(), "other")
    assert limit.limit == 3


async def test_a_burst_of_429s_from_one_window_halves_it_once():
    limit = AdaptiveLimit(16, initial=8)
    epochs = [await limit.acquire() for _ in range(8)]
    for epoch in epochs:
        await limit.release(epoch, "throttled")
    assert limit.limit == 4
    # A 429 to a request sent after the cut is a new overload.
    await limit.release(await limit.acquire(), "throttled")
    assert limit.limit == 2
    for _ in range(3):
        await limit.release(await limit.acquire(), "throttled")
    assert limit.limit == 1


async def test_acquire_waits_for_a_free_slot():
    limit = AdaptiveLimit(4)
    held = await limit.acquire()
    waiting = asyncio.create_task(limit.acquire())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await limit.release(held, "ok")
    await asyncio.wait_for(waiting, 1)
    assert limit.in_flight == 1


def test_a_window_below_one_is_refused():
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        AdaptiveLimit(0)


def test_retry_after_in_seconds_or_as_an_http_date():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    in_a_minute = retry_after_seconds(formatdate(time.time() + 60, usegmt=True))
    assert in_a_minute is not None and 58 <= in_a_minute <= 60
    assert retry_after_seconds(formatdate(time.time() - 60, usegmt=True)) == 0.0
