"""One acting replica: leader election on a coordination.k8s.io Lease, before Kopf starts.

The protocol is the Kubernetes client's own (`kubernetes.leaderelection`, client-go's rules): the
holder renews the Lease every retry period; the others take it only after it has gone unrenewed
for a whole lease duration. A standby never starts Kopf, so it cannot handle an event or run a
daemon. Kopf's peering was not enough: it pauses by closing watch streams, and an event already
in flight is still handled (kopf#1266, kopf#1272), which is two actors for one object.

Losing the lease ends the process at once (as client-go's controllers do): once renewals have
failed for the renew deadline, another replica may take over after the lease duration, and acting
past that point would be split-brain. A watchdog thread enforces the deadline even when a renewal
hangs, and `holds()` lets handlers refuse to act after the process was frozen (SIGSTOP, a stalled
node) before the watchdog has had a chance to run. Kubernetes restarts the pod as a standby.
A holder that stops gracefully releases the lease once Kopf has stopped, so a rolling update
hands over at once instead of after a lease duration.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

logger = logging.getLogger("wok.leader")


@dataclass(frozen=True)
class LeaseTimes:
    """client-go's defaults: 15 s lease, 10 s renew deadline, 2 s between tries."""

    lease_duration_s: int = 15
    renew_deadline_s: int = 10
    retry_period_s: int = 2

    def __post_init__(self) -> None:
        # The margin between deadline and duration is what keeps two holders apart.
        if not self.retry_period_s >= 1:
            raise ValueError("the retry period must be at least 1 s")
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise ValueError("the renew deadline must exceed 1.2 × the retry period")
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError("the lease duration must exceed the renew deadline")


class LeaseLost(RuntimeError):
    """This replica no longer holds the lease and must not act."""


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class _RenewalLease(LeaseLock):
    """The client's LeaseLock, on a given API client, that records each successful write.

    Any failure (a dropped connection as much as a 409) counts as a failed try, so the library's
    renew deadline decides, not the first transient error.
    """

    def __init__(self, name: str, namespace: str, identity: str, api: client.ApiClient) -> None:
        super().__init__(name, namespace, identity)
        self.api_instance = client.CoordinationV1Api(api)
        self.written_at: float | None = None  # time.monotonic() of the last write of ours
        self.holder: str | None = None
        self.closed = False  # set on exit: every later try fails, quietly
        self.read_error: str | None = None  # logged once, not at every try

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        if self.closed:
            return False, None
        try:
            found, record = super().get(name, namespace)
        except Exception as error:  # every failure is a failed try
            found, record = False, error
        # A missing Lease is created next; anything else (403, no apiserver) leaves a standby
        # waiting for good, and an SRE should see why.
        error = None if found or getattr(record, "status", None) == 404 else record
        why = f"{type(error).__name__}: {getattr(error, 'reason', error)}" if error else None
        if why and why != self.read_error:
            logger.warning("cannot read the lease %s/%s: %s", namespace, name, why)
        self.read_error = why
        if found and record.holder_identity != self.holder:
            self.holder = record.holder_identity
            logger.info("lease %s/%s is held by %s", namespace, name, self.holder or "nobody")
        return found, record

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        return self._write(super().create, name, namespace, election_record)

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        return self._write(super().update, name, namespace, updated_record)

    def _write(self, write: Callable[..., bool], name: str, namespace: str, record: Any) -> bool:
        if self.closed:
            return False
        sent = time.monotonic()
        try:
            ok = write(name, namespace, record)
        except Exception as error:  # every failure is a failed try
            logger.warning("writing the lease %s/%s failed: %r", namespace, name, error)
            return False
        if ok:
            # The lease counts from when the write was sent, not when it was answered.
            self.written_at, self.holder = sent, self.identity
        return ok

    def release(self) -> None:
        """Hand the lease over now (client-go's release: no holder, a 1 s duration)."""
        lease = self.api_instance.read_namespaced_lease(self.name, self.namespace)
        if lease.spec.holder_identity != self.identity:
            return
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        # Replaced at the version just read: a renewal still in flight cannot undo the release.
        self.api_instance.replace_namespaced_lease(self.name, self.namespace, lease)
        logger.info("%s released the lease %s/%s", self.identity, self.namespace, self.name)


class Candidate:
    """Campaigns for the Lease in a thread; `wait_until_leading()` blocks until it is won."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str | None = None,
        times: LeaseTimes = LeaseTimes(),
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.identity = identity or default_identity()
        self.times = times
        self._lease = _RenewalLease(name, namespace, self.identity, api)
        self._leading = threading.Event()
        self._lost = threading.Event()
        self._on_lost = on_lost or exit_now
        self._config = electionconfig.Config(
            self._lease,
            lease_duration=times.lease_duration_s,
            renew_deadline=times.renew_deadline_s,
            retry_period=times.retry_period_s,
            onstarted_leading=self._started,
            onstopped_leading=lambda: self._lose("the lease could not be renewed in time"),
        )

    @property
    def lease(self) -> str:
        return f"{self._lease.namespace}/{self._lease.name}"

    @property
    def holder(self) -> str | None:
        """The holder this candidate last saw (itself, once leading)."""
        return self._lease.holder

    def start(self) -> None:
        # The client logs every try at INFO; holder changes (logged above) are what people need.
        logging.getLogger("leaderelection").setLevel(logging.WARNING)
        logger.info("%s campaigns for the lease %s", self.identity, self.lease)
        threading.Thread(target=self._campaign, name="leader-election", daemon=True).start()
        threading.Thread(target=self._watchdog, name="leader-watchdog", daemon=True).start()

    def wait_until_leading(self, timeout: float | None = None) -> bool:
        return self._leading.wait(timeout)

    def holds(self) -> bool:
        """True while this replica may act: it leads and renewed within the renew deadline."""
        written = self._lease.written_at
        return (
            self._leading.is_set()
            and not self._lost.is_set()
            and written is not None
            and time.monotonic() - written < self.times.renew_deadline_s
        )

    def ensure_holds(self) -> None:
        """Called before a write: a replica that no longer holds the lease stops here."""
        if not self.holds():
            self._lose("not renewed within the renew deadline (was this process frozen?)")
            raise LeaseLost(self.lease)

    def stop(self) -> None:
        """On exit, once Kopf has stopped: no more tries (nor logging from the campaign threads
        while the interpreter shuts down), and a standby takes over now, not a lease later."""
        self._lost.set()
        self._lease.closed = True
        if self._leading.is_set():
            try:
                self._lease.release()
            except Exception as error:  # the lease then runs out by itself
                logger.warning("could not release the lease %s: %r", self.lease, error)

    def _started(self) -> None:
        logger.info("%s leads: acquired the lease %s", self.identity, self.lease)
        self._leading.set()

    def _campaign(self) -> None:
        try:
            leaderelection.LeaderElection(self._config).run()
        except Exception as error:  # any end of the campaign ends leadership
            self._lose(f"leader election failed: {error!r}")

    def _watchdog(self) -> None:
        # Renewals can hang (no request timeout in the client's lock); the deadline still holds.
        while not self._lost.wait(self.times.retry_period_s / 2):
            if self._leading.is_set() and not self.holds():
                self._lose("no renewal within the renew deadline")

    def _lose(self, why: str) -> None:
        if self._lost.is_set():
            return
        self._lost.set()
        self._on_lost(f"lost the lease {self.lease} ({why})")


def exit_now(why: str) -> None:
    """Another replica may act soon: stop acting now, not after a graceful shutdown."""
    logger.critical("%s; exiting so that only one replica acts", why)
    logging.shutdown()
    os._exit(1)


class StandbyProbe:
    """Answers the liveness URL while this replica waits for the lease (Kopf's is not up yet)."""

    def __init__(self, url: str, candidate: Candidate) -> None:
        parts = urlsplit(url)
        path = parts.path or "/"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != path:
                    self.send_error(404)
                    return
                body = json.dumps({"leader": False, "holder": candidate.holder}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), Handler)
        threading.Thread(
            target=self._server.serve_forever, name="standby-probe", daemon=True
        ).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
