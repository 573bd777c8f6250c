"""Request bodies read as JSON and validated off the event loop.

Why a module of its own: parsing and validating a body is one long C call (the JSON decoder,
pydantic-core) that holds the GIL. A 7.8 MB chat body of 230k one-character messages took seconds
of it, and the event loop that answers the readiness probe and feeds every running stream waited
that long: a worker thread would not help. So a body larger than `INLINE_BYTES` is parsed in a
worker process (`BodyParser`); it also refuses counts beyond the protocol's bounds (messages,
content parts, stop strings, token ids) before validating anything, so that what comes back to the
event loop is bounded too. A small body, nearly every request, is parsed where it is: a round trip
to the worker costs more than its parse.

`parse` is the whole of it, a pure function; every failure is a `BodyError` in OpenAI's terms
(the message, the `param` to change, the `code`), with the client's field names only: no loc of a
union's branch (`prompt.str`, `priority.int`) reaches a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from wok_runtime.http import protocol as p

log = logging.getLogger("wok.runtime.server")

#: Bodies up to this size are parsed on the event loop: a few milliseconds at worst.
INLINE_BYTES = 32 * 1024
WORKER_NICENESS = 10

Kind = Literal["completion", "chat"]
MODELS: dict[Kind, type[p._Request]] = {
    "completion": p.CompletionRequest,
    "chat": p.ChatCompletionRequest,
}
#: Parts of pydantic's error locations that name a union's branch or a validator, not a field.
_BRANCH_MARKS = ("[", "-", " ")
_BRANCH_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}


@dataclass(frozen=True)
class BodyError:
    """Why a body was refused, in OpenAI's error terms."""

    message: str
    param: str | None = None
    code: str = "invalid_value"


def printable(value: object) -> str:
    """Text safe to put in a UTF-8 answer: a lone surrogate in a client's field name would
    otherwise fail the error's own encoding (a 500 for a 400)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _field_path(loc: tuple[Any, ...]) -> list[str]:
    """The location as the client wrote it: list indices and field names, no branch tags."""
    path = []
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, str) and (
            part in _BRANCH_NAMES or any(mark in part for mark in _BRANCH_MARKS)
        ):
            continue
        path.append(printable(part))
    return path


def describe(errors: list[Any]) -> BodyError:
    """The first of pydantic's (or FastAPI's) validation errors, as one readable BodyError."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        message = printable(first.get("msg", "Invalid JSON"))
        return BodyError(message if message.startswith("Invalid JSON") else f"Invalid JSON: "
                         f"{message}", code="invalid_json")  # fmt: skip
    path = _field_path(tuple(first.get("loc", ())))
    ctx = first.get("ctx") or {}
    param = path[0] if path else ctx.get("param")
    what = ".".join(path) or param or "body"
    message = f"{what}: {printable(first.get('msg', 'invalid request'))}"
    if str(first.get("type", "")).endswith("_type"):  # say what came instead
        message += f", got {p.json_type(first.get('input'))}"
    return BodyError(message, param=param)


def _too_many(param: str, what: str, most: int, got: int) -> BodyError:
    return BodyError(f"{param}: at most {most:,} {what} are supported, got {got:,}", param=param)


def _count_problem(data: Any) -> BodyError | None:
    """A count past the protocol's bounds, found without validating (or walking) the items."""
    if not isinstance(data, dict):
        return None
    messages = data.get("messages")
    if isinstance(messages, list):
        if len(messages) > p.MAX_MESSAGES:
            return _too_many("messages", "messages", p.MAX_MESSAGES, len(messages))
        parts = sum(
            len(m["content"])
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), list)
        )
        if parts > p.MAX_CONTENT_PARTS:
            return _too_many(
                "messages", "content parts (in all messages)", p.MAX_CONTENT_PARTS, parts
            )
    stop = data.get("stop")
    if isinstance(stop, list) and len(stop) > p.MAX_STOP_STRINGS:
        return _too_many("stop", "stop strings", p.MAX_STOP_STRINGS, len(stop))
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]  # a list of one prompt of token ids
    if isinstance(prompt, list) and len(prompt) > p.MAX_PROMPT_TOKEN_IDS:
        return _too_many("prompt", "token ids", p.MAX_PROMPT_TOKEN_IDS, len(prompt))
    return None


def parse(kind: Kind, body: bytes, content_type: str | None = None) -> p._Request | BodyError:
    """The validated request, or why it is refused. The body is read as JSON whatever its
    content type says (a missing one included), as OpenAI's own API does."""
    try:
        data = json.loads(body)
    except RecursionError:
        return BodyError("Invalid JSON: nested too deeply", code="invalid_json")
    except ValueError as error:  # a JSONDecodeError, or UnicodeDecodeError for invalid UTF-8
        said = f" (the Content-Type was {content_type})" if content_type else ""
        return BodyError(f"Invalid JSON{said}: {printable(error)}", code="invalid_json")
    if not isinstance(data, dict):
        return BodyError(f"the body must be a JSON object, got {p.json_type(data)}")
    problem = _count_problem(data)
    if problem is not None:
        return problem
    try:
        return MODELS[kind].model_validate(data)
    except ValidationError as error:
        return describe(error.errors(include_url=False))
    except RecursionError:  # a deep value in a field that takes any JSON (`tools`)
        return BodyError("Invalid JSON: nested too deeply", code="invalid_json")


class BodyParser:
    """Parses large bodies in one worker process (spawned, so it shares no thread or lock of
    the engine's), small ones inline. The worker starts with the first large body, so a server
    that never gets one never pays for it (a second of start, tens of MB); `close` at shutdown."""

    def __init__(self, inline_bytes: int = INLINE_BYTES) -> None:
        self.inline_bytes = inline_bytes
        self._pool: ProcessPoolExecutor | None = None

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")
        # Niced: on a busy host the engine and the event loop get the cores first.
        return ProcessPoolExecutor(
            max_workers=1, mp_context=context, initializer=os.nice, initargs=(WORKER_NICENESS,)
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def parse(
        self, kind: Kind, body: bytes, content_type: str | None
    ) -> p._Request | BodyError:
        if len(body) <= self.inline_bytes:
            return parse(kind, body, content_type)
        if self._pool is None:
            self._pool = self._new_pool()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, parse, kind, body, content_type)
        except BrokenProcessPool:
            # The worker died (killed for memory, say): one more try on a new one.
            log.warning("the body parser's worker died; starting a new one")
            self._pool = self._new_pool()
            return await loop.run_in_executor(self._pool, parse, kind, body, content_type)


def request_body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """An OpenAPI requestBody for a body a handler reads itself (its schema under
    components/schemas, where `add_schemas` puts it)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"required": True, "content": {"application/json": {"schema": ref}}}
