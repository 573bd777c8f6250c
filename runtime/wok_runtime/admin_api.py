"""The versioned admin API the operator drives: get and set the batching parameters live, behind
a bearer token (`Server.require_admin`)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from wok_runtime import protocol as p
from wok_runtime.server import APIError, Server

log = logging.getLogger("wok.runtime.server")


_ADMIN_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": p.ErrorResponse, "description": "missing or wrong bearer token"},
    403: {"model": p.ErrorResponse, "description": "admin API disabled (no token configured)"},
    422: {"model": p.ErrorResponse, "description": "invalid values"},
}


def add_admin_routes(app: FastAPI, server: Server) -> None:
    engine = server.engine

    def batching_state() -> p.BatchingState:
        b = engine.get_batching()
        return p.BatchingState(
            max_batch_size=b.max_batch_size,
            max_wait_ms=b.max_wait_ms,
            max_num_batched_tokens=b.max_num_batched_tokens,
            mode=str(b.mode),
            capacity=b.capacity,
            max_num_batched_tokens_limit=b.max_num_batched_tokens_limit,
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
                max_batch_size=update.max_batch_size,
                max_wait_ms=update.max_wait_ms,
                max_num_batched_tokens=update.max_num_batched_tokens,
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
