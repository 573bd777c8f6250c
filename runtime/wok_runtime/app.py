"""The FastAPI app over an engine: its lifespan (start, simulated load, warm-up, shutdown), the
request-body limit and the error handlers that give every failure OpenAI's error shape."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from wok_runtime.admin_api import add_admin_routes
from wok_runtime.metrics import RuntimeMetrics
from wok_runtime.openai_routes import add_routes
from wok_runtime.server import APIError, Server
from wok_runtime.server_config import ServerConfig

log = logging.getLogger("wok.runtime.server")


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
    add_routes(app, server)
    add_admin_routes(app, server)
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
