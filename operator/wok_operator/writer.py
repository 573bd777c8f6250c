"""A service's writes to the apiserver, off its tick.

A tick decides from what the operator holds in memory, in milliseconds; a loaded apiserver may
take seconds to answer a write (a status PATCH took 4.8 s at P99 with 300 services). So a tick
hands its writes to the service's writer and ends. Each kind of write keeps only its latest
value (a newer status replaces one not sent yet), the writer sends them one at a time in the
order they first came, retries a failed one with backoff, and keeps the latest checkpoint until
it lands. `wok_operator_write_lag_seconds` measures how far the apiserver is behind the ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from wok_operator import metrics

Write = Callable[[], Awaitable[None]]

#: A write the apiserver refuses for what it is, not for how busy it is: retrying cannot help.
#: 404: the service (or its Deployment) is gone; 400/422: the object is invalid.
FINAL_STATUSES = frozenset({400, 404, 422})

log = logging.getLogger(__name__)


@dataclass
class Pending:
    write: Write
    since: float  # time.monotonic() of the oldest submission this write stands for


class ServiceWriter:
    """One per InferenceService: a queue of writes, at most one per kind, and the task that sends
    them. `submit` never waits; `run` is the task; `close` lets the last writes land."""

    def __init__(
        self, service: str = "", *, backoff_s: float = 0.5, max_backoff_s: float = 30.0
    ) -> None:
        self.service = service  # for the logs: namespace/name
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.pending: dict[str, Pending] = {}  # kind → its latest write; dicts keep their order
        self.failures = 0  # in a row: the backoff doubles with each
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def submit(self, kind: str, write: Write) -> None:
        """The latest write of `kind` replaces one not sent yet (its lag counts from the first)."""
        held = self.pending.pop(kind, None)
        self.pending[kind] = Pending(write, time.monotonic() if held is None else held.since)
        self._idle.clear()
        self._wake.set()

    def start(self) -> ServiceWriter:
        self._task = asyncio.get_running_loop().create_task(self.run())
        return self

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.pending:
                kind = next(iter(self.pending))
                item = self.pending.pop(kind)
                if await self._send(kind, item):
                    self.failures = 0
                    continue
                self.failures += 1
                if kind not in self.pending:  # nothing newer came meanwhile: this one is latest
                    self.pending[kind] = item
                await asyncio.sleep(
                    min(self.max_backoff_s, self.backoff_s * 2 ** (self.failures - 1))
                )
            self._idle.set()

    async def _send(self, kind: str, item: Pending) -> bool:
        """True when the write is done with: it landed, or the apiserver refused it for good."""
        try:
            await item.write()
        except ApiException as error:
            if error.status not in FINAL_STATUSES:
                return self._failed(kind, error)
            log.warning("%s: %s write refused (%s): dropped", self.service, kind, error.reason)
            metrics.WRITE_ERRORS.labels(kind=kind).inc()
            return True
        except Exception as error:  # connection errors, timeouts: the write waits its turn again
            return self._failed(kind, error)
        metrics.WRITE_LAG_SECONDS.labels(kind=kind).observe(time.monotonic() - item.since)
        return True

    def _failed(self, kind: str, error: Exception) -> bool:
        metrics.WRITE_ERRORS.labels(kind=kind).inc()
        log.warning("%s: %s write failed, retrying: %s", self.service, kind, error)
        return False

    async def flush(self, timeout: float) -> bool:
        """Wait until every write submitted so far has landed; False when `timeout` ran out."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self, timeout: float) -> None:
        """The last writes get `timeout` to land (the last checkpoint above all), then the task
        ends."""
        if self._task is None:
            return
        if not await self.flush(timeout):
            log.warning("%s: writes still pending at exit: %s", self.service, list(self.pending))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
