"""The request bridge between HTTP and the engine: `Server` admits, tracks and answers requests.

Why a module of its own: the engine is a thread that knows nothing about HTTP. This module owns
what lies between a handler and `LLMEngine.add_request`: validation (OpenAI error shapes, never
a 500 for bad input), backpressure (429 + Retry-After when the queue is full, 503 on queue
timeout and while draining), cancellation (a client that goes away aborts its sequence and frees
its KV blocks) and the admin check. Around it: the settings (server_config.py), the app and its
error handlers (app.py), the bodies' parsing (request_body.py), the size and time limits of a
request (http_limits.py), the OpenAI routes (openai_routes.py), the admin API (admin_api.py), the
SIGTERM drain that lets in-flight requests finish before the process exits 0 (drain.py), and
`wok runtime serve` itself (serve.py). It also routes each request to its lane: online, or batch
(`"priority": "batch"` in the body, or `X-Wok-Lane: batch`), offline work that the engine serves
only from what the online lane leaves free, with its own queue, 429s and metrics.

With `--device sim` the engine runs on the simulated accelerator (sim_runner.py) and the app
also models the weights' load time: the server listens at once, but is not ready (and serves
nothing) until `--sim-load-seconds` are up. That path imports no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from wok_contracts.metrics import (
    AUTH_INVALID,
    AUTH_MISSING,
    REJECT_DRAINING,
    REJECT_QUEUE_FULL,
    REJECT_QUEUE_TIMEOUT,
)
from wok_runtime.core.sequence import LANES, Lane
from wok_runtime.http import protocol as p
from wok_runtime.http.detokenizer import IncrementalText
from wok_runtime.http.metrics import RuntimeMetrics
from wok_runtime.http.request_body import BodyError, BodyParser, Kind
from wok_runtime.http.server_config import (
    FALLBACK_CHAT_TEMPLATE,
    LANE_HEADER,
    MAX_TENANT_LEN,
    PRIORITY_HEADER,
    SAMPLING_EPS,
    TENANT_HEADER,
    VLLM_QUEUE_OVERFLOW,
    ServerConfig,
)

log = logging.getLogger("wok.runtime.server")


class APIError(Exception):
    """An error the client caused or must handle, sent in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def response(self) -> JSONResponse:
        body = p.error_body(self.message, type=self.type, param=self.param, code=self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


_CLIENT_GONE = object()  # put in a request's output queue when its client disconnects


class ServerState:
    """What /readyz reports and the drain waits on (touched only on the event loop)."""

    def __init__(self) -> None:
        self.ready = False
        self.loading = False  # the simulated weight load is not over
        self.draining = False
        self.in_flight = 0


class _Mailbox:
    """Hands outputs from the engine thread to the event loop with one wake-up per engine step.

    Waking the loop costs a write to its self-pipe on the engine thread and a read and a callback
    on the loop: one per request per step was 7 % of a busy engine thread's time (32 running,
    `tiny`, bench/runtime/results/runtime_http_profile.md). `post` only queues an output; `flush`,
    which the engine calls after each batch of outputs (`LLMEngine.after_outputs`), schedules one
    delivery, and the loop fills every request's queue in the order posted.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[Any], Any]] = []
        self._scheduled = False  # a delivery is on its way and has not taken the items yet

    def post(self, queue: asyncio.Queue[Any], item: Any) -> None:
        with self._lock:
            self._items.append((queue, item))

    def flush(self) -> None:
        with self._lock:
            if not self._items or self._scheduled:
                return
            self._scheduled = True
        # A closed event loop means the server is gone and nobody is waiting.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for queue, item in items:
            queue.put_nowait(item)


class _Tracked:
    """One request's bridge from the engine thread to its handler, plus its metrics bookkeeping.

    `on_output` runs on the engine thread: it records metrics there (so they are right even when
    the handler has gone) and posts the output to the event loop's mailbox.
    """

    def __init__(self, mailbox: _Mailbox, metrics: RuntimeMetrics, lane: Lane = "online") -> None:
        self.mailbox = mailbox
        self.metrics = metrics
        self.lane = lane
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.request_id: str | None = None
        # Waits for the client to go away (Server.watch_disconnect) until the request ends or a
        # StreamingResponse (which watches itself, and must be the only reader of `receive`)
        # takes over.
        self.watcher: asyncio.Task[None] | None = None
        self.finished = False  # seen by the handler
        self.stopped_by_string = False  # set before the server aborts on a stop string
        self.final_metrics: Any = None  # RequestMetrics of the finished request
        self._last_token_time: float | None = None

    def stop_watching(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
            self.watcher = None

    def on_output(self, out: Any) -> None:
        n = len(out.new_token_ids)
        last = out.metrics.last_token_time
        if n and last is not None:
            if self._last_token_time is None:
                # The first token opens the intervals; the rest of a first output (all of a
                # non-streamed answer) spreads over the time since it.
                self.metrics.observe_tokens(1, None, lane=self.lane)
                if n > 1:
                    interval = last - out.metrics.first_token_time
                    self.metrics.observe_tokens(n - 1, interval, lane=self.lane)
            else:
                self.metrics.observe_tokens(n, last - self._last_token_time, lane=self.lane)
            self._last_token_time = last
        if out.finished:
            reason = out.finish_reason
            if reason == "abort" and self.stopped_by_string:
                reason = "stop"
            if reason == "timeout":
                self.metrics.reject(REJECT_QUEUE_TIMEOUT, lane=self.lane)
            elif reason in ("stop", "length", "abort"):
                self.metrics.observe_finished(
                    finish_reason=reason, metrics=out.metrics, lane=self.lane
                )
        self.mailbox.post(self.queue, out)


def _format_chat_prompt(tokenizer: Any, messages: list[p.ChatMessage], add_gen: bool) -> str:
    """The model's own chat template when its tokenizer has one, else FALLBACK_CHAT_TEMPLATE."""
    import jinja2
    import jinja2.sandbox

    plain = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(plain, add_generation_prompt=add_gen)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(FALLBACK_CHAT_TEMPLATE).render(
            messages=plain, add_generation_prompt=add_gen
        )
    except jinja2.TemplateError as error:
        raise APIError(400, f"the chat template failed: {error}", param="messages") from error


class AuthFailureLog:
    """Logs failed admin authentications at most once per `interval_s`, with how many there were
    since the last line: a guessing attack is seen in the log without flooding it."""

    def __init__(
        self, interval_s: float = 10.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.unlogged = 0
        self._last_line: float | None = None

    def failed(self, client: str, reason: str) -> None:
        self.unlogged += 1
        now = self.clock()
        if self._last_line is not None and now - self._last_line < self.interval_s:
            return
        log.warning(
            "admin API: %d failed authentication(s) since the last report (the latest from %s: "
            "%s bearer token)",
            self.unlogged,
            client,
            reason,
        )
        self.unlogged = 0
        self._last_line = now


class Server:
    """The app's request logic over one engine; `create_app` wires it into FastAPI."""

    def __init__(self, engine: Any, config: ServerConfig, metrics: RuntimeMetrics) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.state = ServerState()
        self.vocab_size: int = engine.vocab_size
        self.auth_failures = AuthFailureLog()
        self.body_parser = BodyParser()
        # One mailbox per event loop: uvicorn runs one, tests may run several one after another.
        self._mailboxes: dict[asyncio.AbstractEventLoop, _Mailbox] = {}
        self._mailboxes_lock = threading.Lock()
        engine.after_outputs = self._flush_outputs

    def _flush_outputs(self) -> None:
        """On the engine thread, after a batch of outputs: one wake-up per loop delivers them."""
        with self._mailboxes_lock:
            mailboxes = list(self._mailboxes.values())
        for mailbox in mailboxes:
            mailbox.flush()

    def _past_vllm_bound(self) -> bool:
        """vLLM bounds the requests in flight, waiting and running (`--max-num-queued-reqs`, here
        `--max-queue`), where wok's runtime bounds its waiting queue alone."""
        stats = self.engine.stats()
        return bool(stats.num_waiting + stats.num_running >= self.engine.config.max_queue)

    def _mailbox(self) -> _Mailbox:
        loop = asyncio.get_running_loop()
        with self._mailboxes_lock:
            mailbox = self._mailboxes.get(loop)
            if mailbox is None:
                live = {k: v for k, v in self._mailboxes.items() if not k.is_closed()}
                self._mailboxes = {**live, loop: _Mailbox(loop)}
                mailbox = self._mailboxes[loop]
            return mailbox

    def require_admin(self, request: Request) -> None:
        """403 without a configured token, 401 (counted, and logged at a bounded rate) without
        the right one. Called before the body is read, so an unauthenticated caller learns
        nothing about what the body may hold."""
        if self.config.admin_token is None:
            raise APIError(
                403,
                "the admin API is disabled: start the server with "
                "--admin-token-file or WOK_ADMIN_TOKEN",
                type="permission_error",
                code="admin_disabled",
            )
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            reason = AUTH_MISSING
        elif hmac.compare_digest(token.strip().encode(), self.config.admin_token.encode()):
            return
        else:
            reason = AUTH_INVALID
        self.metrics.auth_failed(reason)
        self.auth_failures.failed(request.client.host if request.client else "?", reason)
        raise APIError(
            401,
            "a valid bearer token is required",
            type="authentication_error",
            code="unauthorized",
            headers={"WWW-Authenticate": "Bearer"},
        )

    # --- admission ----------------------------------------------------------------------------

    def priority(self, request: Request, body_priority: p.Priority | None) -> int:
        raw: Any = request.headers.get(PRIORITY_HEADER)
        if raw is None:
            raw = body_priority
        if raw is None:
            return self.config.default_priority
        text = str(raw).strip()
        if text in self.config.priority_classes:
            return self.config.priority_classes[text]
        if text.isascii() and text.isdigit() and int(text) <= self.config.max_priority:
            return int(text)
        known = ", ".join(f"{k}={v}" for k, v in self.config.priority_classes.items())
        raise APIError(
            400,
            f"unknown priority {text!r}: use a class ({known}) or 0..{self.config.max_priority} "
            f"(or, in the body, a lane: {' or '.join(LANES)})",
            param="priority",
        )

    def route(self, request: Request, body_priority: p.Priority | None) -> tuple[Lane, int]:
        """The request's lane and its priority within the lane. `"priority": "batch"` (or
        `"online"`) in the body names the lane, `X-Wok-Lane` overrides it; `X-Wok-Priority`
        picks the priority, never the lane (so a class named `batch` keeps its number there)."""
        lane: Lane = "online"
        if isinstance(body_priority, str) and body_priority.strip() in LANES:
            lane = "batch" if body_priority.strip() == "batch" else "online"
            if body_priority.strip() not in self.config.priority_classes:
                body_priority = None  # a lane, not a class: the default priority within it
        header = request.headers.get(LANE_HEADER)
        if header is not None:
            text = header.strip().lower()
            if text not in LANES:
                raise APIError(
                    400,
                    f"unknown lane {header!r} in X-Wok-Lane: use {' or '.join(LANES)}",
                )
            lane = "batch" if text == "batch" else "online"
        return lane, self.priority(request, body_priority)

    def tenant(self, request: Request) -> str | None:
        tenant = request.headers.get(TENANT_HEADER)
        if tenant is not None and not 0 < len(tenant) <= MAX_TENANT_LEN:
            raise APIError(400, f"{TENANT_HEADER} must be 1..{MAX_TENANT_LEN} characters")
        return tenant

    async def read_request(self, request: Request, kind: Kind) -> Any:
        """The request's body, validated (large ones off the event loop: request_body.py)."""
        body = await request.body()
        parsed = await self.body_parser.parse(kind, body, request.headers.get("content-type"))
        if isinstance(parsed, BodyError):
            raise APIError(400, parsed.message, param=parsed.param, code=parsed.code)
        self.check_model(parsed.model)
        return parsed

    def check_model(self, model: str | None) -> None:
        """404 `model_not_found` for a name this server does not serve, as OpenAI answers."""
        if model is not None and model != self.config.served_model_name:
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves "
                f"{self.config.served_model_name!r}",
                param="model",
                code="model_not_found",
            )

    def sampling_params(self, body: p._Request, max_tokens: int) -> Any:
        from wok_runtime.core.sampling_params import SamplingParams

        try:
            return SamplingParams(
                max_tokens=max_tokens,
                # Like vLLM: a vanishing temperature is greedy (dividing by it overflows).
                temperature=0.0 if body.temperature < SAMPLING_EPS else body.temperature,
                # Below float32's reach a tiny top_p rounds to 0; any tiny value keeps the top 1.
                top_p=max(body.top_p, SAMPLING_EPS),
                top_k=body.top_k,
                seed=body.seed,
                ignore_eos=body.ignore_eos,
            )
        except ValueError as error:
            raise APIError(400, str(error)) from error

    def too_long_param(self, max_tokens: int, param: str) -> str:
        """What to shorten when a request does not fit the context: `max_tokens` when it alone
        fills it, else the prompt (`prompt` or `messages`), as OpenAI names it."""
        return "max_tokens" if max_tokens >= self.engine.max_model_len else param

    def check_prompt(self, ids: list[int], max_tokens: int, *, param: str = "prompt") -> None:
        if not ids:
            raise APIError(400, "the prompt is empty", param=param)
        limit = self.engine.max_model_len
        if len(ids) + max_tokens > limit:  # first: it is cheaper than reading every id
            raise APIError(
                400,
                f"this model's maximum context length is {limit} tokens; the request has "
                f"{len(ids)} prompt tokens and asks for {max_tokens} more",
                param=self.too_long_param(max_tokens, param),
                code="context_length_exceeded",
            )
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(
                400,
                f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})",
                param="prompt",
            )

    async def tokenize(self, text: str, *, max_tokens: int, param: str) -> list[int]:
        """The prompt's token ids, refused first when its characters alone cannot fit in the
        context, and encoded on a worker thread (a long prompt takes seconds of tokenizer time,
        and the event loop answers the probes meanwhile)."""
        tokenizer = self.engine.tokenizer
        limit = self.engine.max_model_len
        per_token = tokenizer.max_chars_per_token
        at_least = -(-len(text) // per_token)  # tokens, if every one were the longest
        if at_least + max_tokens > limit:
            raise APIError(
                400,
                f"this model's maximum context length is {limit} tokens; the prompt's "
                f"{len(text)} characters are at least {at_least} tokens (no token is longer "
                f"than {per_token} characters), and the request asks for {max_tokens} more",
                param=self.too_long_param(max_tokens, param),
                code="context_length_exceeded",
            )
        if not text:
            return []
        return await asyncio.to_thread(tokenizer.encode, text)

    def submit(
        self,
        ids: list[int],
        params: Any,
        *,
        priority: int,
        tenant: str | None,
        incremental: bool = True,
        lane: Lane = "online",
    ) -> _Tracked:
        from wok_runtime.core.engine import EngineDeadError, InvalidRequestError, QueueFullError

        if self.state.draining:
            self.metrics.reject(REJECT_DRAINING, lane=lane)
            raise APIError(
                503,
                "the server is draining (shutting down); retry on another replica",
                type="service_unavailable",
                code="draining",
            )
        if self.state.loading:
            raise APIError(
                503,
                "the model is still loading; retry once /readyz answers 200",
                type="service_unavailable",
                code="loading",
            )
        if self.config.as_vllm and self._past_vllm_bound():
            self.metrics.reject(REJECT_QUEUE_FULL, lane=lane)
            raise _vllm_overflow()
        tracked = _Tracked(self._mailbox(), self.metrics, lane)
        try:
            tracked.request_id = self.engine.add_request(
                ids,
                params,
                on_output=tracked.on_output,
                priority=priority,
                tenant=tenant,
                incremental=incremental,
                lane=lane,
            )
        except EngineDeadError as error:
            raise APIError(
                503,
                f"{error}; this replica must restart (its /healthz answers 503)",
                type="service_unavailable",
                code="engine_failed",
            ) from error
        except QueueFullError as error:
            self.metrics.reject(REJECT_QUEUE_FULL, lane=lane)
            if self.config.as_vllm:
                raise _vllm_overflow() from error
            # Down to whole seconds, so that it stays within the queue timeout it is clipped to.
            retry = max(1, math.floor(error.retry_after_s))
            raise APIError(
                429,
                f"{error.reason}; retry after {retry} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(retry)},
            ) from error
        except (InvalidRequestError, ValueError) as error:
            raise APIError(400, str(error)) from error
        return tracked

    def abort(self, tracked: _Tracked) -> None:
        if not tracked.finished and tracked.request_id is not None:
            tracked.finished = True
            self.engine.abort(tracked.request_id)

    def watch_disconnect(self, tracked: _Tracked, request: Request) -> None:
        """A client that goes away aborts its request at once. One task waits for uvicorn's
        disconnect message: no polling, so a waiting request costs nothing (polling every
        in-flight request a few times a second was a busy server's largest cost)."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.abort(tracked)
            tracked.queue.put_nowait(_CLIENT_GONE)

        tracked.watcher = asyncio.get_running_loop().create_task(watch())

    async def next_output(self, tracked: _Tracked) -> Any:
        """The next output; APIError 499 once the client has gone away."""
        out = await tracked.queue.get()
        if out is _CLIENT_GONE:
            # Nobody reads this answer: the status only names the case in logs.
            raise APIError(499, "client disconnected", code="client_closed")
        return out

    def raise_for_failure(self, out: Any, lane: Lane) -> None:
        if out.finish_reason == "timeout":
            # As for a full queue: when the queue is likely to have room again.
            retry = max(1, math.floor(self.engine.retry_after_s(lane)))
            raise APIError(
                503,
                out.error or "the request waited longer than the queue timeout",
                type="service_unavailable",
                code="queue_timeout",
                headers={"Retry-After": str(retry)},
            )
        if out.finish_reason == "error":
            raise APIError(
                500,
                out.error or "the engine failed this request",
                type="internal_error",
                code="engine_error",
            )

    # --- generation ---------------------------------------------------------------------------

    async def generate(
        self, tracked: _Tracked, text: IncrementalText
    ) -> AsyncIterator[tuple[str, list[int], str | None]]:
        """Yields (new text, new ids, finish reason or None) until the request finishes.

        The first output is awaited before anything is yielded, so a queue timeout can still be
        answered with a 503 rather than an empty 200 stream. Aborts on exit if not finished.
        """
        try:
            while True:
                out = await self.next_output(tracked)
                if out.finished:
                    tracked.finished = True
                    tracked.final_metrics = out.metrics
                    self.raise_for_failure(out, tracked.lane)
                new = text.add(out.new_token_ids, final=out.finished)
                if text.stopped:
                    tracked.stopped_by_string = True
                    self.abort(tracked)
                    yield new, out.new_token_ids, "stop"
                    return
                # "abort" here was not the client's (it has gone) nor a stop string's: the
                # engine gave up on the request (shutdown), and says so in a stream's last chunk.
                reason = out.finish_reason if out.finished else None
                yield new, out.new_token_ids, reason
                if out.finished:
                    return
        finally:
            tracked.stop_watching()
            self.abort(tracked)


def _vllm_overflow() -> APIError:
    """vLLM's QueueOverflowError, word for word."""
    return APIError(503, VLLM_QUEUE_OVERFLOW, type="service_unavailable", code="queue_overflow")
