"""The FastAPI app over an engine: its lifespan (start, simulated load, warm-up, shutdown), the
request-body limits and the error handlers that give every failure OpenAI's error shape."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from wok_runtime.http.admin_api import add_admin_routes
from wok_runtime.http.http_limits import BodyLimits
from wok_runtime.http.metrics import RuntimeMetrics
from wok_runtime.http.openai_routes import add_routes
from wok_runtime.http.request_body import describe, printable
from wok_runtime.http.server import APIError, Server
from wok_runtime.http.server_config import ServerConfig

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
            server.body_parser.close()

    app = FastAPI(
        title="wok runtime",
        version="1",
        description="OpenAI-compatible completions, Prometheus metrics and a live admin API.",
        lifespan=lifespan,
    )
    app.state.server = server
    app.add_middleware(
        BodyLimits, max_bytes=config.max_request_bytes, timeout_s=config.body_timeout_s
    )
    _install_error_handlers(app)
    add_routes(app, server)
    add_admin_routes(app, server)
    return app


async def _warm_up(server: Server) -> None:
    """One short generation, so the first real request does not pay for lazy initialisation."""
    from wok_runtime.core.sampling_params import SamplingParams

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
        found = describe(list(error.errors()))
        # OpenAI answers 400 for every invalid request; the admin API keeps FastAPI's 422.
        status = 422 if request.url.path.startswith("/admin/") else 400
        return APIError(status, found.message, param=found.param, code=found.code).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        codes = {413: "request_too_large", 408: "request_timeout", 404: "not_found"}
        return APIError(
            error.status_code,
            printable(error.detail),
            type=kind,
            code=codes.get(error.status_code),
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
