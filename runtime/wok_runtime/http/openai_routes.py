"""The public routes: health and readiness probes, /metrics, and the OpenAI-compatible
/v1/models, /v1/completions and /v1/chat/completions (JSON or server-sent events)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic.json_schema import models_json_schema

from wok_runtime.http import protocol as p
from wok_runtime.http.detokenizer import IncrementalText
from wok_runtime.http.request_body import request_body_schema
from wok_runtime.http.server import APIError, Server, _format_chat_prompt, _Tracked
from wok_runtime.http.server_config import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    PREEMPTIONS_HEADER,
    QUEUE_TIME_HEADER,
)

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": p.ErrorResponse, "description": "invalid request"},
    404: {"model": p.ErrorResponse, "description": "no such model (model_not_found)"},
    408: {"model": p.ErrorResponse, "description": "the body did not arrive in time"},
    413: {"model": p.ErrorResponse, "description": "the body is over the size limit"},
    429: {"model": p.ErrorResponse, "description": "queue full (see Retry-After)"},
    503: {"model": p.ErrorResponse, "description": "queue timeout or draining"},
}
_COMPLETION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_ERROR_RESPONSES,
    200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when stream=true"},
}


def _usage(prompt: int, completion: int) -> p.Usage:
    return p.Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def _sse(payload: p.BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=False)
    return f"data: {data}\n\n"


MakeChunk = Callable[[str, list[int] | None, str | None, bool], p.BaseModel | None]


class _ChunkRenderer:
    """A stream's SSE events. Nearly every chunk differs from the one before only in its text and
    token ids, so the chunk model's JSON is rendered once with markers where they go, and each
    token's event fills them in (`json.dumps` escapes a string exactly as pydantic does). A model
    built and dumped per token and request was 4 % of a busy event loop's time (32 streams,
    bench/runtime/results/runtime_http_profile.md). A chunk with a finish reason, one per stream, is
    built by the model."""

    _TEXT = "wok-chunk-text-marker"
    _IDS = -7_777_777_777  # no token id is negative

    def __init__(self, make_chunk: MakeChunk) -> None:
        self._make_chunk = make_chunk
        self._plain = self._template(None)  # [head, tail] around the text
        self._with_ids = self._template([self._IDS])  # [head, middle, tail]

    def _template(self, ids: list[int] | None) -> list[str] | None:
        """The JSON around the markers; None where a marker is not there exactly once (a model
        name that holds it): such chunks are built by the model."""
        chunk = self._make_chunk(self._TEXT, ids, None, False)
        parts = "" if chunk is None else chunk.model_dump_json()
        head, *rest = parts.split(json.dumps(self._TEXT))
        if len(rest) != 1:
            return None
        if ids is None:
            return [head, rest[0]]
        middle, *tail = rest[0].split(f"[{self._IDS}]")
        return [head, middle, tail[0]] if len(tail) == 1 else None

    def event(self, new: str, new_ids: list[int] | None, reason: str | None) -> str:
        template = self._plain if new_ids is None else self._with_ids
        if template is None or reason is not None:
            chunk = self._make_chunk(new, new_ids, reason, False)
            assert chunk is not None  # only a stream's first (role) chunk may be None
            return _sse(chunk)
        text = json.dumps(new, ensure_ascii=False)
        if new_ids is None:
            head, tail = template
            return f"data: {head}{text}{tail}\n\n"
        head, middle, tail = template
        return f"data: {head}{text}{middle}[{','.join(map(str, new_ids))}]{tail}\n\n"


class _Answer:
    """The OpenAI shapes of one request's answer, a completion or a chat completion: its stream
    chunks and its whole response, which share the id, the creation time and the model name."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self._head = {
            "id": p.new_id("chatcmpl" if chat else "cmpl"),
            "created": p.now(),
            "model": model,
        }

    def chunk(
        self, new: str, new_ids: list[int] | None, reason: str | None, first: bool
    ) -> p.BaseModel | None:
        """A stream's chunk; `first`: the chat's role chunk (a completion has none)."""
        if not self.chat:
            if first:
                return None
            choice = p.CompletionChoice(text=new, finish_reason=reason, token_ids=new_ids)
            return p.CompletionResponse(**self._head, choices=[choice])
        delta = p.ChatDelta(role="assistant", content="") if first else p.ChatDelta(content=new)
        chunk = p.ChatChunkChoice(delta=delta, finish_reason=reason, token_ids=new_ids)
        return p.ChatCompletionChunk(**self._head, choices=[chunk])

    def response(
        self, text: str, out: list[int] | None, reason: str | None, usage: p.Usage
    ) -> p.BaseModel:
        if not self.chat:
            choice = p.CompletionChoice(text=text, finish_reason=reason, token_ids=out)
            return p.CompletionResponse(**self._head, choices=[choice], usage=usage)
        message = p.ChatChoice(
            message=p.ChatMessageOut(content=text), finish_reason=reason, token_ids=out
        )
        return p.ChatCompletionResponse(**self._head, choices=[message], usage=usage)

    def usage_chunk(self, usage: p.Usage) -> p.BaseModel:
        """The stream's last chunk when the client asked for usage: no choices, only usage."""
        chunk = self.chunk("", None, None, False)
        assert chunk is not None
        return chunk.model_copy(update={"choices": [], "usage": usage})


def add_routes(app: FastAPI, server: Server) -> None:
    _add_probes(app, server)

    # The bodies are read by the handlers, not declared, so that FastAPI does not parse them on
    # the event loop (request_body.py); the schema still shows them.
    @app.post(
        "/v1/completions",
        response_model=p.CompletionResponse,
        tags=["openai"],
        responses=_COMPLETION_RESPONSES,
        openapi_extra={"requestBody": request_body_schema(p.CompletionRequest)},
    )
    async def completions(request: Request) -> Any:
        body: p.CompletionRequest = await server.read_request(request, "completion")
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
        answer = _Answer(chat=False, model=server.config.served_model_name)
        return await _run(server, request, body, ids, max_tokens, answer, prompt_param="prompt")

    @app.post(
        "/v1/chat/completions",
        response_model=p.ChatCompletionResponse,
        tags=["openai"],
        responses=_COMPLETION_RESPONSES,
        openapi_extra={"requestBody": request_body_schema(p.ChatCompletionRequest)},
    )
    async def chat(request: Request) -> Any:
        body: p.ChatCompletionRequest = await server.read_request(request, "chat")
        engine = server.engine
        # Python, on a thread: the GIL passes to the event loop every few milliseconds.
        prompt = await asyncio.to_thread(
            _format_chat_prompt, engine.tokenizer, body.messages, body.add_generation_prompt
        )
        requested = body.max_completion_tokens or body.max_tokens
        ids = await server.tokenize(prompt, max_tokens=requested or 1, param="messages")
        # OpenAI's default for chat: as many tokens as the context has room for.
        max_tokens = requested or max(1, engine.max_model_len - len(ids))
        answer = _Answer(chat=True, model=server.config.served_model_name)
        return await _run(server, request, body, ids, max_tokens, answer, prompt_param="messages")

    _publish_schemas(app, [p.CompletionRequest, p.ChatCompletionRequest])


def _add_probes(app: FastAPI, server: Server) -> None:
    """The probes, /metrics and /v1/models."""
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

    if config.as_vllm:

        @app.get("/health", **probe)
        async def health() -> Any:
            """vLLM's one probe: 200 once the model has loaded, 503 once the engine died (vLLM
            does not listen while it loads; here the port is open and answers 503)."""
            failed = engine_failed()
            if failed is not None:
                return failed
            if server.state.loading or not (server.state.ready or server.state.draining):
                return JSONResponse({"status": "starting"}, status_code=503)
            return p.Health(status="alive")

    @app.get("/metrics", tags=["metrics"], response_class=Response)
    async def metrics() -> Response:
        body, content_type = server.metrics.render()
        return Response(content=body, media_type=content_type)

    def card() -> p.ModelCard:
        return p.ModelCard(
            id=config.served_model_name, created=p.now(), max_model_len=engine.max_model_len
        )

    @app.get("/v1/models", response_model=p.ModelList, tags=["openai"])
    async def models() -> p.ModelList:
        return p.ModelList(data=[card()])

    @app.get(
        "/v1/models/{model:path}",
        response_model=p.ModelCard,
        tags=["openai"],
        responses={404: _ERROR_RESPONSES[404]},
    )
    async def model(model: str) -> p.ModelCard:
        server.check_model(model)
        return card()


async def _run(
    server: Server,
    request: Request,
    body: p._Request,
    ids: list[int],
    max_tokens: int,
    answer: _Answer,
    *,
    prompt_param: str,
) -> Any:
    """Submits one request and answers it: JSON once it is done, or a stream of SSE events."""
    server.check_prompt(ids, max_tokens, param=prompt_param)
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
        text = IncrementalText(server.engine.tokenizer.decode, stops)
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
            whole = answer.response(text.text, out_ids if want_ids else None, reason, usage)
            return JSONResponse(whole.model_dump(), headers=_timing_headers(tracked))
        # Waits for the first piece before the 200 goes out (a timeout is still a 503).
        first = await anext(pieces)
        tracked.stop_watching()

        async def on_close() -> None:
            await pieces.aclose()  # aborts the sequence if it has not finished
            server.state.in_flight -= 1

        release = False
        usage = body.stream_options is not None and body.stream_options.include_usage
        events = _events(answer, first, pieces, len(ids), want_ids=want_ids, usage=usage)
        return _SSEResponse(events, on_close)
    finally:
        if release:
            server.state.in_flight -= 1


async def _events(
    answer: _Answer,
    first: tuple[str, list[int], str | None],
    pieces: AsyncIterator[tuple[str, list[int], str | None]],
    prompt_tokens: int,
    *,
    want_ids: bool,
    usage: bool,
) -> AsyncIterator[str]:
    """A stream's SSE events: the role chunk (chat), a chunk per piece of text, an error event if
    the request fails once the 200 is out, the usage chunk if asked for, then [DONE]."""
    renderer = _ChunkRenderer(answer.chunk)
    count = 0
    role = answer.chunk("", None, None, True)
    if role is not None:
        yield _sse(role)
    piece: tuple[str, list[int], str | None] | None = first
    while piece is not None:
        new, new_ids, reason = piece
        count += len(new_ids)
        if new or reason or (want_ids and new_ids):
            yield renderer.event(new, new_ids if want_ids else None, reason)
        try:
            piece = await anext(pieces, None)
        except APIError as error:
            # The 200 is already out: the failure travels as an error event.
            yield _sse(json.dumps(p.error_body(error.message, type=error.type, code=error.code)))
            break
    if usage:
        yield _sse(answer.usage_chunk(_usage(prompt_tokens, count)))
    yield _sse("[DONE]")


def _publish_schemas(app: FastAPI, models: list[type[p.BaseModel]]) -> None:
    """Puts the request models (and the models they use) under components/schemas of the
    OpenAPI document, where the handlers' requestBody refers to them."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            _, defs = models_json_schema(
                [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


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
