"""The versioned admin API the operator drives: get and set the batching parameters live, behind
a bearer token (`Server.require_admin`). Every path under /admin/ asks for the token first, a
path that does not exist too: without it nothing tells a caller which paths do."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from wok_runtime.http import protocol as p
from wok_runtime.http.server import APIError, Server

log = logging.getLogger("wok.runtime.server")


_ADMIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": p.ErrorResponse, "description": "missing or wrong bearer token"},
    403: {"model": p.ErrorResponse, "description": "admin API disabled (no token configured)"},
    422: {"model": p.ErrorResponse, "description": "invalid values"},
}


def add_admin_routes(app: FastAPI, server: Server) -> None:
    engine = server.engine

    def batching_state(clamped: dict[str, str] | None = None) -> p.BatchingState:
        b = engine.get_batching()
        return p.BatchingState(
            max_batch_size=b.max_batch_size,
            max_wait_ms=b.max_wait_ms,
            max_num_batched_tokens=b.max_num_batched_tokens,
            mode=str(b.mode),
            capacity=b.kv_safe_batch_size,
            max_num_batched_tokens_limit=b.max_num_batched_tokens_limit,
            clamped=clamped or {},
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
        before = engine.get_batching()
        batch, clamped = update.max_batch_size, {}
        if batch is not None and batch > before.kv_safe_batch_size:
            # More would overcommit the pool: running sequences preempt each other as they grow.
            batch = before.kv_safe_batch_size
            clamped["max_batch_size"] = (
                f"{update.max_batch_size} clamped to {batch}: the sequences of "
                f"max_model_len={engine.max_model_len} tokens the KV pool holds"
            )
        limit = before.max_num_batched_tokens_limit
        tokens = update.max_num_batched_tokens
        if tokens is not None and tokens > limit:
            clamped["max_num_batched_tokens"] = (
                f"{tokens} clamped to {limit}: the step the model runner sized its activations for"
            )
        try:
            engine.set_batching(
                max_batch_size=batch,
                max_wait_ms=update.max_wait_ms,
                max_num_batched_tokens=tokens,
            )
        except ValueError as error:
            raise APIError(422, str(error)) from error
        state = batching_state(clamped)
        log.info("admin: batching set to %s", state.model_dump())
        return state

    @app.api_route(
        "/admin/{path:path}",
        methods=["GET", "PUT", "POST", "PATCH", "DELETE"],
        include_in_schema=False,
    )
    async def unknown_admin(request: Request, path: str) -> None:
        server.require_admin(request)
        known = {"v1/batching": "GET, PUT"}
        if path in known:
            raise StarletteHTTPException(405, headers={"Allow": known[path]})
        raise StarletteHTTPException(404, f"no admin API at /admin/{path}")


def _json_body(model: type[p.BaseModel]) -> dict[str, Any]:
    """An OpenAPI requestBody for a body a handler reads itself."""
    schema = model.model_json_schema()
    return {"required": True, "content": {"application/json": {"schema": schema}}}
