"""The sender: every pending request to the service, with retries and an adaptive window.

Which answers are retried follows what they mean for a batch that must finish unattended:
- 429 is the server asking for later: wait its Retry-After, halve the window, retry (no attempt
  bound: a busy service is the normal case for offline work, not a failure);
- a connection error, a timeout or a 5xx may pass (a pod restarting, a drain): exponential
  backoff with jitter, at most `max_attempts` tries, then the last answer or error is the result;
- any other 4xx is written at once. A rerun of the file sends again the lines that failed for a
  reason outside the line (results.is_final); a 4xx for the line's own body stays final.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from wok_batch.batch_file import BatchRequest
from wok_batch.concurrency import AdaptiveLimit, Outcome
from wok_batch.results import result_record

TOO_MANY_REQUESTS = 429


@dataclass(frozen=True)
class ClientSettings:
    url: str
    max_concurrency: int = 32
    timeout_s: float = 600.0
    #: Sent as the body's "priority" (the runtime's batch lane) when set.
    priority: str | None = None
    #: Tries for connection errors, timeouts and 5xx (429s are not counted).
    max_attempts: int = 6
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https://, got {self.url!r}")
        if self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be > 0, got {self.timeout_s}")
        if self.max_attempts < 1:
            raise ValueError(f"max attempts must be >= 1, got {self.max_attempts}")


@dataclass
class SendStats:
    throttled: int = 0  # 429 answers
    retried: int = 0  # retries of every kind, 429s included


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds from now: a number of seconds or an HTTP date (RFC 9110)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def service_root(url: str) -> str:
    """The base URL the batch file's `/v1/...` paths join to: a trailing /v1 (a client library's
    habit) is dropped, so that both spellings reach the same endpoints."""
    root = url.rstrip("/")
    return root.removesuffix("/v1")


def response_record(response: httpx.Response) -> dict[str, Any]:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text  # a proxy's HTML error page, say: kept as it came
    request_id = response.headers.get("x-request-id")
    if request_id is None and isinstance(body, dict):
        request_id = body.get("id")
    return {"status_code": response.status_code, "request_id": request_id, "body": body}


def error_record(error: httpx.TransportError, attempts: int) -> dict[str, str]:
    """The output line's `error` when no answer came at all."""
    code = "timeout" if isinstance(error, httpx.TimeoutException) else "connection_error"
    return {"code": code, "message": f"{type(error).__name__}: {error} (after {attempts} attempts)"}


class _Sender:
    def __init__(self, http: httpx.AsyncClient, settings: ClientSettings) -> None:
        self.http = http
        self.settings = settings
        self.limit = AdaptiveLimit(settings.max_concurrency)
        self.stats = SendStats()

    def _backoff_s(self, failures: int) -> float:
        settings = self.settings
        ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (failures - 1))
        # Jitter, so requests that failed together do not all come back together.
        return random.uniform(ceiling / 2, ceiling)

    async def _post_once(self, request: BatchRequest) -> httpx.Response:
        """One try, holding one slot of the window only while the request is in flight."""
        body = request.body
        if self.settings.priority is not None:
            body = {**body, "priority": self.settings.priority}
        epoch = await self.limit.acquire()
        outcome: Outcome = "other"
        try:
            response = await self.http.post(request.url, json=body)
            if response.status_code == TOO_MANY_REQUESTS:
                outcome = "throttled"
            elif response.is_success:
                outcome = "ok"
            return response
        finally:
            await self.limit.release(epoch, outcome)

    async def answer(self, request: BatchRequest) -> dict[str, Any]:
        """The result record of one request, after the retries its answers allow."""
        failures = 0
        while True:
            try:
                response = await self._post_once(request)
            except httpx.TransportError as error:
                failures += 1
                if failures >= self.settings.max_attempts:
                    return result_record(request.custom_id, error=error_record(error, failures))
                delay = self._backoff_s(failures)
            else:
                status = response.status_code
                if status == TOO_MANY_REQUESTS:
                    self.stats.throttled += 1
                elif status >= 500 and failures + 1 < self.settings.max_attempts:
                    failures += 1
                else:
                    return result_record(request.custom_id, response=response_record(response))
                asked = retry_after_seconds(response.headers.get("retry-after"))
                delay = self._backoff_s(max(1, failures)) if asked is None else asked
            self.stats.retried += 1
            await asyncio.sleep(delay)


async def send_all(
    pending: Sequence[BatchRequest],
    settings: ClientSettings,
    *,
    on_result: Callable[[dict[str, Any]], None],
) -> SendStats:
    """Sends every request and calls `on_result` with each result record as it is final (in
    completion order); returns the retry counts."""
    limits = httpx.Limits(max_connections=settings.max_concurrency)
    async with httpx.AsyncClient(
        base_url=service_root(settings.url), timeout=settings.timeout_s, limits=limits
    ) as http:
        sender = _Sender(http, settings)
        # One shared iterator: the event loop runs one worker at a time, so next() never races.
        queue = iter(pending)

        async def worker() -> None:
            for request in queue:
                on_result(await sender.answer(request))

        async with asyncio.TaskGroup() as workers:
            for _ in range(min(settings.max_concurrency, len(pending))):
                workers.create_task(worker())
    return sender.stats
