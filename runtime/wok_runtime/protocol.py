"""The HTTP API's wire shapes: OpenAI-compatible requests and responses, the admin API, errors.

Pydantic models, so FastAPI validates every request before it reaches the engine and publishes an
OpenAPI schema that matches what the server really accepts (schemathesis tests against it). Only
what wok implements is declared; unknown fields are ignored, as OpenAI clients send extras.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Bounds that keep one request cheap to validate; the engine checks the real limits
#: (max_model_len, vocabulary size) and answers 400 beyond them.
MAX_TOKENS_LIMIT = 1_000_000
MAX_STOP_STRINGS = 4
MAX_STOP_LEN = 64
TOKEN_ID_LIMIT = 2**31 - 1

TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=TOKEN_ID_LIMIT)]], Field(min_length=1)]
Priority = int | str


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(default=None, description="served model name (default: the one)")
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0, le=1_000_000, description="wok extension; 0 = off")
    stop: (
        Annotated[str, Field(max_length=MAX_STOP_LEN)]
        | Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_LEN)]],
            Field(max_length=MAX_STOP_STRINGS),
        ]
        | None
    ) = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    n: int = Field(default=1, ge=1, le=1, description="only n=1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = Field(
        default=False, description="vLLM extension: the output runs to max_tokens"
    )
    return_token_ids: bool = Field(default=False, description="wok extension: the output ids")
    priority: Priority | None = Field(
        default=None,
        description="wok extension: a number (0 = most urgent), a class name, or a lane: "
        '"batch" (offline work, served only from what online traffic leaves free) or "online"',
    )

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]


class CompletionRequest(_Request):
    """POST /v1/completions. `prompt` is text or token ids (a list of one of either is accepted)."""

    prompt: (
        str
        | TokenIds
        | Annotated[list[str], Field(min_length=1, max_length=1)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
    )
    echo: bool = Field(default=False, description="not supported: must be false")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions. `max_completion_tokens` is the newer name of `max_tokens`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    add_generation_prompt: bool = Field(default=True, description="wok extension")


# --- responses -----------------------------------------------------------------------------------

FinishReason = Literal["stop", "length", "abort"] | None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReason = None
    token_ids: list[int] | None = Field(default=None, description="with return_token_ids")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: FinishReason = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: FinishReason = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "wok"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: the official clients parse `error.message` and `error.code`."""

    error: ErrorDetail


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return ErrorResponse(
        error=ErrorDetail(message=message, type=type, param=param, code=code)
    ).model_dump()


# --- admin ---------------------------------------------------------------------------------------


class BatchingUpdate(BaseModel):
    """PUT /admin/v1/batching: the fields to change (absent = unchanged)."""

    model_config = ConfigDict(extra="forbid")
    max_batch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    max_wait_ms: int | None = Field(default=None, ge=0, le=600_000)


class BatchingState(BaseModel):
    """The effective batching parameters (after clamping to what the KV cache can hold)."""

    max_batch_size: int
    max_wait_ms: int
    max_num_batched_tokens: int
    mode: str
    capacity: int = Field(description="the most sequences the KV cache can hold at once")


class Health(BaseModel):
    status: str  # alive | ready | starting | draining | failed
    detail: str | None = Field(default=None, description="why, when the engine has failed")
