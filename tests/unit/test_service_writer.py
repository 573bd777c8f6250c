"""A service's writer: a tick's writes wait there, the latest of each kind wins, a failed write is
retried with backoff and never lost to an older one, and a write the apiserver refuses for good
is dropped. The writes here are plain coroutines that record what they were given (the e2e test,
e2e/test_operator_slow_apiserver.py, runs the real ones against a real apiserver)."""

from __future__ import annotations

import asyncio
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import kopf
from kopf._core.engines.posting import event_queue_loop_var, event_queue_var, settings_var
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from wok_contracts.signals import PodView
from wok_operator.handlers import LoopMemo, OperatorConfig, ServiceTick, Shared
from wok_operator.resources import RUNTIME_PORT
from wok_operator.writer import ServiceWriter


class Apiserver:
    """What the writes reached, in order; `gate` holds every write until it is set; `fail`
    makes the next writes raise, one error each."""

    def __init__(self) -> None:
        self.landed: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: list[Exception] = []
        self.attempts = 0

    def write(self, kind: str, value: int):
        async def write() -> None:
            self.attempts += 1
            await self.gate.wait()
            if self.fail:
                raise self.fail.pop(0)
            self.landed.append((kind, value))

        return write


def lag_count(kind: str) -> float:
    return REGISTRY.get_sample_value("wok_operator_write_lag_seconds_count", {"kind": kind}) or 0.0


async def test_the_latest_status_wins_over_one_not_sent_yet():
    api = Apiserver()
    writer = ServiceWriter(backoff_s=0.01).start()
    api.gate.clear()  # the apiserver is slow: the first write hangs there
    writer.submit("status", api.write("status", 1))
    await asyncio.sleep(0.01)
    for value in (2, 3, 4):  # three ticks meanwhile
        writer.submit("status", api.write("status", value))
    writer.submit("batch", api.write("batch", 16))
    before = lag_count("status")
    api.gate.set()
    assert await writer.flush(timeout=5.0)
    assert api.landed == [("status", 1), ("status", 4), ("batch", 16)]
    assert lag_count("status") == before + 2
    await writer.close(timeout=1.0)


async def test_a_failed_write_is_retried_until_it_lands_and_a_newer_one_replaces_it():
    api = Apiserver()
    writer = ServiceWriter(backoff_s=0.05).start()
    api.fail = [OSError("connection refused"), ApiException(status=500)]
    writer.submit("status", api.write("status", 1))
    await asyncio.sleep(0.01)  # the first try failed; the writer is backing off
    writer.submit("status", api.write("status", 2))
    assert await writer.flush(timeout=5.0)
    assert api.landed == [("status", 2)], "the newer checkpoint, never the older one after it"
    assert api.attempts == 3

    api.fail = [ApiException(status=429), ApiException(status=503)]
    writer.submit("replicas", api.write("replicas", 3))
    assert await writer.flush(timeout=5.0)
    assert api.landed[-1] == ("replicas", 3)
    await writer.close(timeout=1.0)


async def test_a_write_refused_for_good_is_dropped_and_the_next_goes_on():
    api = Apiserver()
    writer = ServiceWriter(backoff_s=10.0).start()  # a retry would outlast the flush below
    api.fail = [ApiException(status=404)]  # the service was deleted meanwhile
    writer.submit("status", api.write("status", 1))
    writer.submit("batch", api.write("batch", 8))
    assert await writer.flush(timeout=2.0)
    assert api.landed == [("batch", 8)]
    await writer.close(timeout=1.0)


async def test_close_lets_the_last_checkpoint_land_then_ends_the_task():
    api = Apiserver()
    writer = ServiceWriter().start()
    api.gate.clear()
    writer.submit("status", api.write("status", 7))
    closing = asyncio.create_task(writer.close(timeout=5.0))
    await asyncio.sleep(0.05)
    assert not closing.done(), "close waits for the write in flight"
    api.gate.set()
    await closing
    assert api.landed == [("status", 7)]

    # A write that cannot land in time is given up at the timeout, not waited on forever.
    stuck = ServiceWriter().start()
    api.gate.clear()
    stuck.submit("status", api.write("status", 8))
    await asyncio.wait_for(stuck.close(timeout=0.1), timeout=2.0)
    assert ("status", 8) not in api.landed


def pushing_tick(http: httpx.AsyncClient) -> ServiceTick:
    """A tick whose pushes go through `http`, the pods' token already read."""
    return ServiceTick(
        Shared(kube=None, config=OperatorConfig(), http=http),  # type: ignore[arg-type]
        LoopMemo(admin_token="t0ken-of-the-pods"),
        "chat",
        "team-a",
        {},  # type: ignore[arg-type]
        logging.getLogger("test"),  # type: ignore[arg-type]
    )


async def test_a_push_once_the_operator_closed_its_http_client_is_done_with():
    # At exit Kopf's cleanup closes the client while the writers flush: a retry cannot help.
    http = httpx.AsyncClient()
    await http.aclose()
    tick = pushing_tick(http)
    pod = PodView("p1", "uid1", "127.0.0.9", ready=True, terminating=False)
    await tick.push([pod], 8)
    assert tick.memo.applied == {}


class RefusesTheToken(BaseHTTPRequestHandler):
    def do_PUT(self) -> None:
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


async def test_only_a_pod_that_refuses_the_token_has_it_read_again():
    # A pod too busy to answer keeps the token (one read per service, not one per missed push);
    # a 401 means the token changed.
    settings_var.set(kopf.OperatorSettings())  # Kopf's event queue, as the operator has it
    events: asyncio.Queue = asyncio.Queue()
    event_queue_var.set(events)
    event_queue_loop_var.set(asyncio.get_running_loop())
    refusing = ThreadingHTTPServer(("127.0.0.214", RUNTIME_PORT), RefusesTheToken)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    async with httpx.AsyncClient(timeout=2.0) as http:
        tick = pushing_tick(http)
        silent = PodView("p1", "uid1", "127.0.0.213", ready=True, terminating=False)  # refused
        await tick.push([silent], 8)
        assert tick.memo.admin_token == "t0ken-of-the-pods"
        try:
            await tick.push([PodView("p2", "uid2", "127.0.0.214", True, False)], 8)
        finally:
            refusing.shutdown()
            refusing.server_close()
        assert tick.memo.admin_token is None
    assert [events.get_nowait().reason for _ in range(events.qsize())] == ["BatchPushFailed"] * 2
