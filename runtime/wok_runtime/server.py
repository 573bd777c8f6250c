"""`wok runtime serve`: the engine behind an OpenAI-compatible HTTP API, metrics and an admin API.

Why a module of its own: the engine is a thread that knows nothing about HTTP. This module owns
everything between a socket and `LLMEngine.add_request`: validation (OpenAI error shapes, never a
500 for bad input), backpressure (429 + Retry-After when the queue is full, 503 on queue timeout
and while draining), cancellation (a client that goes away aborts its sequence and frees its KV
blocks), the live admin API the operator drives, and a SIGTERM drain that lets in-flight requests
finish before the process exits 0. It also routes each request to its lane: online, or batch
(`"priority": "batch"` in the body, or `X-Wok-Lane: batch`), offline work that the engine serves
only from what the online lane leaves free, with its own queue, 429s and metrics.

With `--device sim` the engine runs on the simulated accelerator (sim_runner.py) and this module
also models the weights' load time: the server listens at once, but is not ready (and serves
nothing) until `--sim-load-seconds` are up. That path imports no torch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from wok_contracts.metrics import (
    AUTH_INVALID,
    AUTH_MISSING,
    REJECT_DRAINING,
    REJECT_QUEUE_FULL,
    REJECT_QUEUE_TIMEOUT,
)
from wok_runtime import protocol as p
from wok_runtime.detokenizer import IncrementalText
from wok_runtime.metrics import RuntimeMetrics
from wok_runtime.sequence import LANES, Lane

log = logging.getLogger("wok.runtime.server")

DEFAULT_PRIORITY_CLASSES = {"interactive": 0, "standard": 1, "batch": 2}
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SAMPLING_EPS = 1e-5
PRIORITY_HEADER = "x-wok-priority"
LANE_HEADER = "x-wok-lane"  # online | batch; overrides a lane named by the body's priority
TENANT_HEADER = "x-wok-tenant"
PREEMPTIONS_HEADER = "x-wok-preemptions"  # on non-streamed answers: times it was preempted
QUEUE_TIME_HEADER = "x-wok-queue-seconds"  # on non-streamed answers: arrival to first step
MAX_TENANT_LEN = 128
#: 8 MiB: a million-token context as text or token ids, with room to spare. A body is parsed and
#: validated on the event loop that answers the probes, so its size must have a bound.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024

#: Used when the tokenizer has no chat template (documented in the README of the runtime).
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def parse_priority_classes(text: str) -> dict[str, int]:
    """`interactive=0,standard=1,batch=2` -> {"interactive": 0, ...}."""
    classes: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or not name.strip() or not value.strip().lstrip("-").isdecimal():
            raise ValueError(f"--priority-classes: expected NAME=INT[,NAME=INT…], got {text!r}")
        if int(value) < 0:
            raise ValueError(f"--priority-classes: priorities are >= 0, got {item!r}")
        classes[name.strip()] = int(value)
    return classes


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str
    admin_token: str | None = None
    priority_classes: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES))
    default_priority: int = 1
    drain_seconds: float = 30.0
    # Endpoints drop a pod a moment after it turns unready; until then requests still come, and a
    # 503 `draining` sends them to another pod where a closed port fails them.
    unready_seconds: float = 3.0
    load_seconds: float = 0.0  # listening but not ready this long first (the simulated load)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ValueError("served model name must not be empty")
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise ValueError("the admin token must be at least 8 characters")
        if not self.priority_classes:
            raise ValueError("at least one priority class is needed")
        if self.max_request_bytes < 1:
            raise ValueError(f"max request bytes must be >= 1, got {self.max_request_bytes}")
        for name in ("drain_seconds", "unready_seconds", "load_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name.replace('_', ' ')} must be >= 0, got {value}")

    @property
    def max_priority(self) -> int:
        return max(self.priority_classes.values())


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


class _Tracked:
    """One request's bridge from the engine thread to its handler, plus its metrics bookkeeping.

    `on_output` runs on the engine thread: it records metrics there (so they are right even when
    the handler has gone) and hands the output to the event loop.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, metrics: RuntimeMetrics, lane: Lane = "online"
    ) -> None:
        self.loop = loop
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
        # A closed event loop means the server is gone and nobody is waiting.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, out)


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

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.served_model_name:
            raise APIError(
                400,
                f"the model {model!r} does not exist; this server serves "
                f"{self.config.served_model_name!r}",
                param="model",
                code="model_not_found",
            )

    def sampling_params(self, body: p._Request, max_tokens: int) -> Any:
        from wok_runtime.sampling_params import SamplingParams

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

    def check_prompt(self, ids: list[int], max_tokens: int) -> None:
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        limit = self.engine.max_model_len
        if len(ids) + max_tokens > limit:  # first: it is cheaper than reading every id
            raise APIError(
                400,
                f"this model's maximum context length is {limit} tokens; the request has "
                f"{len(ids)} prompt tokens and asks for {max_tokens} more",
                param="max_tokens",
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
                param="max_tokens" if max_tokens >= limit else param,  # which one to change
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
        from wok_runtime.engine import EngineDeadError, InvalidRequestError, QueueFullError

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
        tracked = _Tracked(asyncio.get_running_loop(), self.metrics, lane)
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
            # Down to whole seconds, so that it stays within the queue timeout it is clipped to.
            retry = max(1, math.floor(error.retry_after_s))
            raise APIError(
                429,
                f"the request queue is full ({error.reason}); retry after {retry} s",
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

    @staticmethod
    def raise_for_failure(out: Any) -> None:
        if out.finish_reason == "timeout":
            raise APIError(
                503,
                out.error or "the request waited longer than the queue timeout",
                type="service_unavailable",
                code="queue_timeout",
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
                    self.raise_for_failure(out)
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


def create_app(
    engine: Any, config: ServerConfig, *, metrics: RuntimeMetrics | None = None, warmup: bool = True
) -> FastAPI:
    """The FastAPI app over an engine that is not started yet (the lifespan starts and stops it).

    Pass `metrics` when the engine was built with `on_step=metrics.observe_step`.
    """
    if metrics is None:
        priorities = tuple(sorted(set(config.priority_classes.values())))
        kv_memory = getattr(getattr(engine, "runner", None), "kv_memory", None)
        metrics = RuntimeMetrics(
            config.served_model_name, engine.stats, priorities=priorities, kv_memory=kv_memory
        )
    server = Server(engine, config, metrics)

    from contextlib import asynccontextmanager

    async def become_ready() -> None:
        if config.load_seconds > 0:
            await asyncio.sleep(config.load_seconds)
            server.state.loading = False
        if warmup:
            await _warm_up(server)
        if not server.state.draining:
            server.state.ready = True
            log.info("ready: serving %r", config.served_model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        loading = None
        if config.load_seconds > 0:
            # In the background: uvicorn listens only once the lifespan has started, and the
            # probes must see 503 "starting" during the load, not a refused connection.
            server.state.loading = True
            loading = asyncio.get_running_loop().create_task(become_ready())
        else:
            await become_ready()
        try:
            yield
        finally:
            if loading is not None:
                loading.cancel()
            server.state.ready = False
            server.state.draining = True
            await asyncio.to_thread(engine.shutdown, config.drain_seconds)

    app = FastAPI(
        title="wok runtime",
        version="1",
        description="OpenAI-compatible completions, Prometheus metrics and a live admin API.",
        lifespan=lifespan,
    )
    app.state.server = server
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)
    _install_error_handlers(app)
    _add_routes(app, server)
    return app


class BodyLimit:
    """Answers 413 to a request body over `max_bytes`: before reading it when Content-Length
    says so, else as soon as the chunks read pass it. A body is parsed and validated on the
    event loop, which must stay free to answer the probes."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def too_large(self) -> StarletteHTTPException:
        return StarletteHTTPException(
            413,
            f"the request body is larger than this server's limit of {self.max_bytes} bytes "
            "(wok runtime serve --max-request-bytes)",
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isascii() and length.isdigit() and int(length) > self.max_bytes:
            error = self.too_large()
            answer = APIError(413, str(error.detail), code="request_too_large")
            await answer.response()(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self.too_large()  # FastAPI passes an HTTPException through
            return message

        await self.app(scope, counting_receive, send)


async def _warm_up(server: Server) -> None:
    """One short generation, so the first real request does not pay for lazy initialisation."""
    from wok_runtime.sampling_params import SamplingParams

    loop = asyncio.get_running_loop()
    done: asyncio.Queue[Any] = asyncio.Queue()
    server.engine.add_request(
        [0],
        SamplingParams(max_tokens=2, ignore_eos=True),
        on_output=lambda out: loop.call_soon_threadsafe(done.put_nowait, out),
    )
    while not (await done.get()).finished:
        pass


_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": p.ErrorResponse, "description": "invalid request"},
    429: {"model": p.ErrorResponse, "description": "queue full (see Retry-After)"},
    503: {"model": p.ErrorResponse, "description": "queue timeout or draining"},
}
_COMPLETION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_ERROR_RESPONSES,
    200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when stream=true"},
}
_ADMIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": p.ErrorResponse, "description": "missing or wrong bearer token"},
    403: {"model": p.ErrorResponse, "description": "admin API disabled (no token configured)"},
    422: {"model": p.ErrorResponse, "description": "invalid values"},
}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        first = errors[0] if errors else {}
        json_invalid = first.get("type") == "json_invalid"
        loc = [] if json_invalid else [_printable(x) for x in first.get("loc", ()) if x != "body"]
        what = "invalid JSON" if json_invalid else ".".join(loc) or "body"
        message = _printable(first.get("msg", "invalid request"))
        if not message.startswith("Invalid JSON"):
            message = f"{what}: {message}"
        if str(first.get("type", "")).endswith("_type"):  # say what came instead
            message += f", got {_json_type(first.get('input'))}"
        # OpenAI answers 400 for every invalid request; the admin API keeps FastAPI's 422.
        status = 422 if request.url.path.startswith("/admin/") else 400
        return APIError(
            status,
            message,
            param=loc[0] if loc else None,
            code="invalid_json" if json_invalid else "invalid_value",
        ).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return APIError(
            error.status_code,
            str(error.detail),
            type=kind,
            code="request_too_large" if error.status_code == 413 else None,
            headers=getattr(error, "headers", None),
        ).response()

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return APIError(
            500,
            f"internal error: {type(error).__name__}",
            type="internal_error",
            code="internal_error",
        ).response()


def _printable(value: object) -> str:
    """Text safe to put in a UTF-8 answer: a lone surrogate in a client's field name would
    otherwise fail the error's own encoding (a 500 for a 400)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _usage(prompt: int, completion: int) -> p.Usage:
    return p.Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def _sse(payload: p.BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=False)
    return f"data: {data}\n\n"


def _add_routes(app: FastAPI, server: Server) -> None:
    config = server.config
    engine = server.engine

    def engine_failed() -> JSONResponse | None:
        """503 once the engine loop has stopped: the kubelet restarts the pod (liveness)."""
        if engine.failure is None:
            return None
        return JSONResponse({"status": "failed", "detail": engine.failure}, status_code=503)

    probe: dict[str, Any] = {
        "response_model": p.Health,
        "response_model_exclude_none": True,
        "tags": ["health"],
        "responses": {503: {"model": p.Health}},
    }

    @app.get("/healthz", **probe)
    async def healthz() -> Any:
        return engine_failed() or p.Health(status="alive")

    @app.get("/readyz", **probe)
    async def readyz() -> Any:
        failed = engine_failed()
        if failed is not None:
            return failed
        if server.state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not server.state.ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        return p.Health(status="ready")

    @app.get("/metrics", tags=["metrics"], response_class=Response)
    async def metrics() -> Response:
        body, content_type = server.metrics.render()
        return Response(content=body, media_type=content_type)

    @app.get("/v1/models", response_model=p.ModelList, tags=["openai"])
    async def models() -> p.ModelList:
        card = p.ModelCard(
            id=config.served_model_name, created=p.now(), max_model_len=engine.max_model_len
        )
        return p.ModelList(data=[card])

    async def run(
        request: Request,
        body: p._Request,
        ids: list[int],
        max_tokens: int,
        make_chunk: Callable[[str, list[int] | None, str | None, bool], p.BaseModel],
        make_response: Callable[[str, list[int] | None, str | None, p.Usage], p.BaseModel],
    ) -> Any:
        server.check_model(body.model)
        server.check_prompt(ids, max_tokens)
        params = server.sampling_params(body, max_tokens)
        lane, priority = server.route(request, body.priority)
        tenant = server.tenant(request)
        server.state.in_flight += 1
        release = True
        try:
            stops = body.stop_strings()
            # A non-streamed answer without stop strings needs no token before the last.
            incremental = body.stream or bool(stops)
            tracked = server.submit(
                ids, params, priority=priority, tenant=tenant, incremental=incremental, lane=lane
            )
            server.watch_disconnect(tracked, request)
            text = IncrementalText(engine.tokenizer.decode, stops)
            pieces = server.generate(tracked, text)
            want_ids = body.return_token_ids
            if not body.stream:
                out_ids: list[int] = []
                reason = None
                async for _new, new_ids, reason in pieces:  # noqa: B007
                    out_ids.extend(new_ids)
                if reason == "abort":
                    raise APIError(
                        503,
                        "the engine stopped this request before it finished (shutting down)",
                        type="service_unavailable",
                        code="aborted",
                    )
                usage = _usage(len(ids), len(out_ids))
                answer = make_response(text.text, out_ids if want_ids else None, reason, usage)
                return JSONResponse(answer.model_dump(), headers=_timing_headers(tracked))
            # Waits for the first piece before the 200 goes out (a timeout is still a 503).
            first = await anext(pieces)
            tracked.stop_watching()

            async def events() -> AsyncIterator[str]:
                count = 0
                role = make_chunk("", None, None, True)
                if role is not None:
                    yield _sse(role)
                piece: tuple[str, list[int], str | None] | None = first
                while piece is not None:
                    new, new_ids, reason = piece
                    count += len(new_ids)
                    if new or reason or (want_ids and new_ids):
                        yield _sse(make_chunk(new, new_ids if want_ids else None, reason, False))
                    try:
                        piece = await anext(pieces, None)
                    except APIError as error:
                        # The 200 is already out: the failure travels as an error event.
                        yield _sse(
                            json.dumps(
                                p.error_body(error.message, type=error.type, code=error.code)
                            )
                        )
                        break
                if body.stream_options is not None and body.stream_options.include_usage:
                    yield _sse(_usage_chunk(make_chunk, _usage(len(ids), count)))
                yield _sse("[DONE]")

            async def on_close() -> None:
                await pieces.aclose()  # aborts the sequence if it has not finished
                server.state.in_flight -= 1

            release = False
            return _SSEResponse(events(), on_close)
        finally:
            if release:
                server.state.in_flight -= 1

    @app.post(
        "/v1/completions",
        response_model=p.CompletionResponse,
        tags=["openai"],
        responses=_COMPLETION_RESPONSES,
    )
    async def completions(request: Request, body: p.CompletionRequest) -> Any:
        if body.echo:
            raise APIError(400, "echo is not supported", param="echo")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        max_tokens = body.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS
        if isinstance(prompt, str):
            ids = await server.tokenize(prompt, max_tokens=max_tokens, param="prompt")
        else:
            ids = list(prompt)
        rid, created = p.new_id("cmpl"), p.now()

        def chunk(new: str, new_ids: list[int] | None, reason: str | None, first: bool) -> Any:
            if first:
                return None
            choice = p.CompletionChoice(text=new, finish_reason=reason, token_ids=new_ids)
            return p.CompletionResponse(
                id=rid, created=created, model=config.served_model_name, choices=[choice]
            )

        def response(text: str, out: list[int] | None, reason: str | None, usage: p.Usage) -> Any:
            choice = p.CompletionChoice(text=text, finish_reason=reason, token_ids=out)
            return p.CompletionResponse(
                id=rid,
                created=created,
                model=config.served_model_name,
                choices=[choice],
                usage=usage,
            )

        return await run(request, body, ids, max_tokens, chunk, response)

    @app.post(
        "/v1/chat/completions",
        response_model=p.ChatCompletionResponse,
        tags=["openai"],
        responses=_COMPLETION_RESPONSES,
    )
    async def chat(request: Request, body: p.ChatCompletionRequest) -> Any:
        prompt = _format_chat_prompt(engine.tokenizer, body.messages, body.add_generation_prompt)
        requested = body.max_completion_tokens or body.max_tokens
        ids = await server.tokenize(prompt, max_tokens=requested or 1, param="messages")
        # OpenAI's default for chat: as many tokens as the context has room for.
        max_tokens = requested or max(1, engine.max_model_len - len(ids))
        rid, created = p.new_id("chatcmpl"), p.now()

        def chunk(new: str, new_ids: list[int] | None, reason: str | None, first: bool) -> Any:
            delta = p.ChatDelta(role="assistant", content="") if first else p.ChatDelta(content=new)
            choice = p.ChatChunkChoice(delta=delta, finish_reason=reason, token_ids=new_ids)
            return p.ChatCompletionChunk(
                id=rid, created=created, model=config.served_model_name, choices=[choice]
            )

        def response(text: str, out: list[int] | None, reason: str | None, usage: p.Usage) -> Any:
            choice = p.ChatChoice(
                message=p.ChatMessageOut(content=text), finish_reason=reason, token_ids=out
            )
            return p.ChatCompletionResponse(
                id=rid,
                created=created,
                model=config.served_model_name,
                choices=[choice],
                usage=usage,
            )

        return await run(request, body, ids, max_tokens, chunk, response)

    def batching_state() -> p.BatchingState:
        b = engine.get_batching()
        return p.BatchingState(
            max_batch_size=b.max_batch_size,
            max_wait_ms=b.max_wait_ms,
            max_num_batched_tokens=b.max_num_batched_tokens,
            mode=str(b.mode),
            capacity=b.capacity,
        )

    @app.get(
        "/admin/v1/batching",
        response_model=p.BatchingState,
        tags=["admin"],
        responses=_ADMIN_RESPONSES,
    )
    async def get_batching(request: Request) -> p.BatchingState:
        server.require_admin(request)
        return batching_state()

    @app.put(
        "/admin/v1/batching",
        response_model=p.BatchingState,
        tags=["admin"],
        responses=_ADMIN_RESPONSES,
        openapi_extra={"requestBody": _json_body(p.BatchingUpdate)},
    )
    async def put_batching(request: Request) -> p.BatchingState:
        # The body is read here, not declared, so that FastAPI cannot validate it first.
        server.require_admin(request)
        try:
            update = p.BatchingUpdate.model_validate_json(await request.body())
        except ValidationError as error:
            raise RequestValidationError(error.errors()) from error
        try:
            engine.set_batching(
                max_batch_size=update.max_batch_size, max_wait_ms=update.max_wait_ms
            )
        except ValueError as error:
            raise APIError(422, str(error)) from error
        state = batching_state()
        log.info("admin: batching set to %s", state.model_dump())
        return state


def _json_body(model: type[p.BaseModel]) -> dict[str, Any]:
    """An OpenAPI requestBody for a body a handler reads itself."""
    schema = model.model_json_schema()
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _timing_headers(tracked: _Tracked) -> dict[str, str]:
    """wok's per-request facts for a non-streamed answer (tests and debugging read them)."""
    m = tracked.final_metrics
    if m is None:
        return {}
    return {
        PREEMPTIONS_HEADER: str(m.num_preemptions),
        QUEUE_TIME_HEADER: f"{(m.first_scheduled_time or m.arrival_time) - m.arrival_time:.6f}",
    }


class _SSEResponse(StreamingResponse):
    """A text/event-stream whose `on_close` runs however the stream ends, even if the client
    left before the first byte (then Starlette never iterates the body, so a `finally` inside
    the generator would not run)."""

    def __init__(
        self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


def _usage_chunk(make_chunk: Callable[..., Any], usage: p.Usage) -> Any:
    chunk = make_chunk("", None, None, False)
    return chunk.model_copy(update={"choices": [], "usage": usage})


# --- the process ---------------------------------------------------------------------------------


def read_admin_token(path: str | None) -> str | None:
    if path:
        token = Path(path).read_text().strip()
        if not token:
            raise ValueError(f"--admin-token-file {path} is empty")
        return token
    return os.environ.get("WOK_ADMIN_TOKEN", "").strip() or None


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


def _default_dtype(device: str | None) -> str:
    import torch

    on_cuda = device == "cuda" or (device is None and torch.cuda.is_available())
    return "bfloat16" if on_cuda else "float32"


def _build_runner(args: argparse.Namespace) -> Any:
    """The PyTorch model runner, or the simulated accelerator for `--device sim`."""
    if args.device == "sim":
        from wok_runtime.sim_runner import SimModelRunner

        if args.profile is None:
            raise ValueError("--device sim needs --profile NAME|PATH (e.g. sim:llama-3-8b-80g)")
        if args.kv_cache_bytes is not None:
            raise ValueError(
                "--kv-cache-bytes does not apply to --device sim (the profile sizes it)"
            )
        return SimModelRunner.from_profile(args.profile)
    if args.profile is not None or args.sim_load_seconds is not None:
        raise ValueError("--profile and --sim-load-seconds need --device sim")
    from wok_runtime.model_runner import ModelRunner

    return ModelRunner.from_source(
        args.model,
        dtype=args.dtype or _default_dtype(args.device),
        device=args.device,
        block_size=args.block_size,
        kv_cache_bytes=args.kv_cache_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
    )


def serve_from_args(args: argparse.Namespace) -> int:
    """`wok runtime serve`: loads the model, builds the engine, serves until SIGTERM."""
    from wok_runtime.engine import EngineConfig, LLMEngine

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    classes = parse_priority_classes(args.priority_classes)
    admin_token = read_admin_token(args.admin_token_file)
    runner = _build_runner(args)
    load_seconds = 0.0
    if args.device == "sim":
        load_seconds = runner.profile.load_seconds
        if args.sim_load_seconds is not None:
            load_seconds = args.sim_load_seconds
    config = ServerConfig(
        served_model_name=args.served_model_name or runner.model_name,
        admin_token=admin_token,
        priority_classes=classes,
        default_priority=classes.get("standard", min(classes.values())),
        drain_seconds=args.drain_seconds,
        unready_seconds=args.unready_seconds,
        load_seconds=load_seconds,
        max_request_bytes=args.max_request_bytes,
    )
    engine_config = EngineConfig(
        mode=args.mode,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_queue=args.max_queue,
        queue_timeout_s=args.queue_timeout,
        aging_s=args.aging_seconds,
        tenant_kv_share=args.tenant_kv_share,
        max_model_len=args.max_model_len,
        stream_interval=args.stream_interval,
        batch_max_queue=args.batch_queue_size,
        batch_queue_timeout_s=args.batch_queue_timeout,
        batch_lane_max_batch_size=args.batch_lane_max_batch_size,
        enable_prefix_caching=args.prefix_caching,
    )
    priorities = tuple(sorted(set(classes.values())))
    # The collector reads the engine at scrape time; the engine reports steps to the collector.
    metrics = RuntimeMetrics(
        config.served_model_name,
        lambda: engine.stats(),
        priorities=priorities,
        kv_memory=getattr(runner, "kv_memory", None),
    )
    engine = LLMEngine(runner, engine_config, on_step=metrics.observe_step)
    app = create_app(engine, config, metrics=metrics)
    if config.admin_token is None:
        log.warning(
            "admin API disabled: no --admin-token-file and no WOK_ADMIN_TOKEN "
            "(/admin/* answers 403)"
        )
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    uv = _DrainingServer(uv_config, app.state.server)
    uv.run()
    return 0


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
