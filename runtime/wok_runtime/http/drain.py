"""The SIGTERM drain: the pod turns unready, admits nothing more, and the process exits 0 once
nothing is in flight and the endpoints have had time to drop it (or the drain grace is up)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType
from typing import Any

import uvicorn

from wok_runtime.http.server import Server

log = logging.getLogger("wok.runtime.server")


def _drain_then_exit(uv: Any, server: Server) -> None:
    """SIGTERM: not ready, no admissions; exit once nothing is in flight and the endpoints have
    had `unready_seconds` to drop the pod (or the drain grace is up)."""
    drain_seconds = server.config.drain_seconds

    async def drain() -> None:
        start = time.monotonic()
        deadline = start + drain_seconds
        listen_until = start + min(server.config.unready_seconds, drain_seconds)
        while time.monotonic() < deadline:
            s = server.engine.stats()
            busy = s.num_running + s.num_waiting + s.batch_running + s.batch_waiting
            if server.state.in_flight == 0 and busy == 0 and time.monotonic() >= listen_until:
                break
            await asyncio.sleep(0.05)
        else:
            log.warning(
                "drain grace (%.1f s) is up with %d request(s) in flight",
                drain_seconds,
                server.state.in_flight,
            )
        uv.should_exit = True

    server.state.draining = True
    server.state.ready = False
    log.info(
        "draining: %d request(s) in flight, grace %.1f s", server.state.in_flight, drain_seconds
    )
    server.drain_task = asyncio.get_running_loop().create_task(drain())  # type: ignore[attr-defined]


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, except that the first SIGTERM drains instead of closing at once."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.app_server = server

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown, and the
        # process must exit 0 after a clean drain.
        if sig == signal.SIGTERM and not self.app_server.state.draining and self.started:
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(_drain_then_exit, self, self.app_server)
        elif self.should_exit:
            self.force_exit = True
        else:
            self.should_exit = True
