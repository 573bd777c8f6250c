"""Waiting on conditions with a deadline, so no test or start-up path ever sleeps a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class GiveUp(Exception):
    """Raised by a probe when waiting longer cannot help (the process it waits for has exited)."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
) -> T:
    """Calls `probe` until it returns something truthy and returns that, or raises TimeoutError.

    Exceptions from `probe` count as "not yet" (a server that is still starting refuses
    connections); the last one is named in the timeout message so a failure says why.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = probe()
            if result:
                return result
        except GiveUp:
            raise
        except Exception as error:
            last_error = error
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)
