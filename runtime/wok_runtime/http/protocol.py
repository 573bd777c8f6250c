"""The HTTP API's wire shapes: OpenAI-compatible requests and responses, the admin API, errors.

Pydantic models, so every request is validated before it reaches the engine (request_body.py, off
the event loop for a large body) and the OpenAPI schema matches what the server really accepts
(schemathesis tests against it).

As strict as the OpenAI API: JSON types are checked, never coerced (`"max_tokens": "4"` and
`"stream": "yes"` are errors). OpenAI's fields that wok does not implement (`logprobs`, `tools`,
`response_format`, penalties, …) are declared with only their neutral value allowed, so a request
that asks for one is refused with a message that names it instead of being answered as if it had
not asked. Fields no OpenAI-compatible server knows are ignored, as clients send extras. A lone
UTF-16 surrogate anywhere in a request (JSON allows `"\\ud800"`, but no tokenizer can encode it)
is refused with the field's path.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

#: Bounds that keep one request cheap to validate; the engine checks the real limits
#: (max_model_len, vocabulary size) and answers 400 beyond them.
MAX_TOKENS_LIMIT = 1_000_000
MAX_STOP_STRINGS = 4
MAX_STOP_LEN = 64
TOKEN_ID_LIMIT = 2**31 - 1
#: Counts that bound what one body costs to validate, render and hand between processes: a body
#: under the size limit can still hold hundreds of thousands of tiny messages or parts.
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 2048  # in all messages together
MAX_PROMPT_TOKEN_IDS = MAX_TOKENS_LIMIT

TokenIds = Annotated[
    list[Annotated[int, Field(ge=0, le=TOKEN_ID_LIMIT)]],
    Field(min_length=1, max_length=MAX_PROMPT_TOKEN_IDS),
]
Priority = int | str
#: Request models: JSON types as documented (no coercion), unknown fields ignored.
STRICT = ConfigDict(extra="ignore", strict=True)


def _encodes(text: str) -> bool:
    """Whether `text` is valid Unicode (a scan in C: a prompt may be megabytes)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def lone_surrogate(value: Any, path: str = "") -> str | None:
    """Where `value` (parsed JSON) holds a lone UTF-16 surrogate, as `messages.0.content`; else
    None. JSON's `\\uD800` escapes decode to one in Python, and nothing can encode it as UTF-8.

    A list that starts with a number is not searched: it is token ids (a prompt may hold
    millions), and the models refuse any string among them without quoting it."""
    if isinstance(value, str):
        return None if _encodes(value) else path
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list) and value and isinstance(value[0], (str, list, dict)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and not _encodes(key):
            return f"{path} (a field name)" if path else "a field name"
        found = lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _unsupported(name: str, neutral: str) -> PydanticCustomError:
    return PydanticCustomError(
        "unsupported",
        "not supported by this server: leave {name} out (or send {neutral})",
        {"name": name, "neutral": neutral},
    )


def _explained(
    handler: ValidatorFunctionWrapHandler,
    value: Any,
    explain: Callable[[Any], PydanticCustomError],
) -> Any:
    """The field's own validation, with `explain(value)` as its one error: a union's errors name
    its branches (`prompt.str`, `stop.constrained-str`), which no client wrote."""
    try:
        return handler(value)
    except ValidationError:
        raise explain(value) from None


def _prompt_error(value: Any) -> PydanticCustomError:
    if isinstance(value, list) and len(value) > 1 and isinstance(value[0], (str, list)):
        return PydanticCustomError(
            "batched_prompt",
            "a list of {n} prompts is not supported: send one prompt per request",
            {"n": len(value)},
        )
    return PydanticCustomError(
        "prompt",
        "the prompt must be a non-empty string or list of token ids (integers from 0 to "
        "{most}), or a list of one of either",
        {"most": TOKEN_ID_LIMIT},
    )


def _stop_error(value: Any) -> PydanticCustomError:
    if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
        return PydanticCustomError(
            "too_many_stops",
            "at most {most} stop strings are supported, got {n}",
            {"most": MAX_STOP_STRINGS, "n": len(value)},
        )
    return PydanticCustomError(
        "stop",
        "stop must be a non-empty string or a list of up to {most} non-empty strings of at "
        "most {chars} characters",
        {"most": MAX_STOP_STRINGS, "chars": MAX_STOP_LEN},
    )


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class ResponseFormatText(BaseModel):
    model_config = STRICT
    type: Literal["text"]


#: The neutral value(s) of each OpenAI field wok does not implement (what the error suggests).
UNSUPPORTED_FIELDS = {
    "frequency_penalty": "0",
    "presence_penalty": "0",
    "repetition_penalty": "1",
    "logit_bias": "{}",
    "min_tokens": "0",
    "best_of": "1",
    "suffix": "null",
    "logprobs": "null",  # completions; chat's is a bool (false)
    "top_logprobs": "0",
    "tools": "[]",
    "tool_choice": '"none"',
    "functions": "[]",
    "function_call": '"none"',
    "response_format": '{"type": "text"}',
    "parallel_tool_calls": "null",  # OpenAI too refuses it without tools
    "modalities": '["text"]',
    "audio": "null",
    "prediction": "null",
    "reasoning_effort": "null",  # no reasoning model is served
    "service_tier": '"auto"',  # wok's own tiers are `priority` and the lanes
    "store": "false",  # nothing is stored
}
_NEUTRAL_ZERO = Annotated[float, Field(ge=0, le=0)]


def _false(value: bool) -> bool:
    if value:
        raise ValueError("only false is supported")
    return value


def field_error(param: str, message: str) -> PydanticCustomError:
    """An error of a whole-request check that names the field to change (its `param`)."""
    return PydanticCustomError("invalid_field", "{message}", {"param": param, "message": message})


def _priority_error(value: Any) -> PydanticCustomError:
    return PydanticCustomError(
        "priority",
        "priority must be an integer (0 = most urgent), a class name or a lane, got {got}",
        {"got": json_type(value)},
    )


def _content_error(value: Any) -> PydanticCustomError:
    if isinstance(value, list):
        kinds = {p.get("type") for p in value if isinstance(p, dict)} - {"text"}
        if kinds:
            return PydanticCustomError(
                "content_part",
                "only text content parts are supported, got a part of type {kind}",
                {"kind": ", ".join(sorted(repr(k) for k in kinds))},
            )
    return PydanticCustomError(
        "content",
        'content must be a string or a list of {"type": "text", "text": ...} parts, got {got}',
        {"got": json_type(value)},
    )


def json_type(value: object) -> str:
    """`value`'s JSON type in words, as an error message says what came instead."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


class _Request(BaseModel):
    model_config = STRICT

    model: str | None = Field(default=None, description="served model name (default: the one)")
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0, le=1_000_000, description="wok extension; 0 = off")
    stop: (
        Annotated[str, Field(min_length=1, max_length=MAX_STOP_LEN)]
        | Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_LEN)]],
            Field(max_length=MAX_STOP_STRINGS),
        ]
        | None
    ) = Field(default=None, description=f"a string or up to {MAX_STOP_STRINGS} strings")
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
    # Not implemented: only the neutral value is accepted (UNSUPPORTED_FIELDS).
    frequency_penalty: _NEUTRAL_ZERO | None = Field(default=None, description="not supported")
    presence_penalty: _NEUTRAL_ZERO | None = Field(default=None, description="not supported")
    repetition_penalty: Annotated[float, Field(ge=1, le=1)] | None = Field(
        default=None, description="not supported"
    )
    logit_bias: Annotated[dict[str, Any], Field(max_length=0)] | None = Field(
        default=None, description="not supported"
    )
    min_tokens: Annotated[int, Field(ge=0, le=0)] | None = Field(
        default=None, description="not supported"
    )
    tools: Annotated[list[Any], Field(max_length=0)] | None = Field(
        default=None, description="not supported"
    )
    tool_choice: Literal["none"] | None = Field(default=None, description="not supported")
    functions: Annotated[list[Any], Field(max_length=0)] | None = Field(
        default=None, description="not supported"
    )
    function_call: Literal["none"] | None = Field(default=None, description="not supported")
    parallel_tool_calls: None = Field(default=None, description="not supported (no tools)")
    response_format: ResponseFormatText | None = Field(
        default=None, description='not supported beyond {"type": "text"}'
    )
    #: What the error for an unimplemented field suggests sending instead.
    NEUTRAL: ClassVar[dict[str, str]] = UNSUPPORTED_FIELDS

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = lone_surrogate(data)
        if where is not None:
            raise PydanticCustomError(
                "lone_surrogate",
                "{where} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                "which is not valid Unicode text",
                {"where": where},
            )
        return data

    @field_validator(*UNSUPPORTED_FIELDS, mode="wrap", check_fields=False)
    @classmethod
    def _only_neutral(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        name = info.field_name or "this field"
        return _explained(handler, value, lambda _: _unsupported(name, cls.NEUTRAL[name]))

    @field_validator("stop", mode="wrap")
    @classmethod
    def _readable_stop(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _explained(handler, value, _stop_error)

    @field_validator("priority", mode="wrap")
    @classmethod
    def _readable_priority(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _explained(handler, value, _priority_error)

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> _Request:
        if self.stream_options is not None and not self.stream:
            raise field_error("stream_options", "stream_options is only allowed with stream: true")
        return self

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
    best_of: Annotated[int, Field(ge=1, le=1)] | None = Field(
        default=None, description="not supported"
    )
    suffix: Literal[""] | None = Field(default=None, description="not supported")
    logprobs: None = Field(default=None, description="not supported")

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _readable_prompt(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _explained(handler, value, _prompt_error)


class ContentPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


# The schema says what the validator below enforces, so clients and fuzzers generated from it
# send content on every turn but an assistant's.
_CONTENT_UNLESS_ASSISTANT = {
    "if": {"properties": {"role": {"not": {"const": "assistant"}}}},
    "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
}


class ChatMessage(BaseModel):
    model_config = ConfigDict(**STRICT, json_schema_extra=_CONTENT_UNLESS_ASSISTANT)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @field_validator("content", mode="wrap")
    @classmethod
    def _readable_content(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _explained(handler, value, _content_error)

    @model_validator(mode="after")
    def _content_unless_assistant(self) -> ChatMessage:
        # As in OpenAI's API: only an assistant's turn may go without content.
        if self.content is None and self.role != "assistant":
            raise PydanticCustomError(
                "missing_content", "a {role} message needs content", {"role": self.role}
            )
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions. `max_completion_tokens` is the newer name of `max_tokens`."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    add_generation_prompt: bool = Field(default=True, description="wok extension")
    logprobs: Annotated[bool, AfterValidator(_false)] | None = Field(
        default=None, description="not supported"
    )
    top_logprobs: Annotated[int, Field(ge=0, le=0)] | None = Field(
        default=None, description="not supported"
    )
    modalities: Annotated[list[Literal["text"]], Field(max_length=1)] | None = Field(
        default=None, description='only ["text"]'
    )
    audio: None = Field(default=None, description="not supported")
    prediction: None = Field(default=None, description="not supported")
    reasoning_effort: None = Field(default=None, description="not supported")
    service_tier: Literal["auto", "default"] | None = Field(
        default=None, description='only "auto" or "default" (see `priority`)'
    )
    store: Annotated[bool, AfterValidator(_false)] | None = Field(
        default=None, description="not supported: nothing is stored"
    )
    NEUTRAL: ClassVar[dict[str, str]] = {**UNSUPPORTED_FIELDS, "logprobs": "false"}


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
    """PUT /admin/v1/batching: the fields to change (absent = unchanged). Strict: `true` or
    `"8"` is refused, never read as 1 or 8."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_batch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    max_wait_ms: int | None = Field(default=None, ge=0, le=600_000)
    # The step token budget; above what the runner sized its activations for, it is clamped.
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=1 << 20)


class BatchingState(BaseModel):
    """The effective batching parameters (after clamping to what the KV cache can hold)."""

    max_batch_size: int
    max_wait_ms: int
    max_num_batched_tokens: int
    mode: str
    capacity: int = Field(
        description="the ceiling of max_batch_size: the sequences of max_model_len tokens the KV "
        "cache holds at once"
    )
    max_num_batched_tokens_limit: int = Field(
        description="the largest step token budget: what the model runner sized its activations for"
    )
    clamped: dict[str, str] = Field(
        default_factory=dict,
        description="after a PUT: each field set lower than asked, and why",
    )


class Health(BaseModel):
    status: str  # alive | ready | starting | draining | failed
    detail: str | None = Field(default=None, description="why, when the engine has failed")
