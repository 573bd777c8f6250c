"""Request bodies as the runtime reads them (request_body.py): counts refused before anything is
validated, every JSON failure an `invalid_json`, the client's field names only in messages, each
OpenAI parameter wok does not implement refused by name, and the worker process that parses
large bodies giving the same answers as the inline parse."""

from __future__ import annotations

import asyncio
import json

import pytest

from wok_runtime.http import protocol as p
from wok_runtime.http.request_body import BodyError, BodyParser, Kind, parse

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
PART = {"type": "text", "text": "x"}


def refusal(kind: Kind, body: object) -> BodyError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    out = parse(kind, raw)
    assert isinstance(out, BodyError), out
    return out


@pytest.mark.parametrize(
    ("kind", "body", "param", "says"),
    [
        ("chat", {"messages": [{"role": "user", "content": "x"}] * 2049}, "messages",
         "at most 2,048 messages are supported, got 2,049"),
        ("chat", {"messages": [{"role": "user", "content": [PART] * 1025}] * 2}, "messages",
         "at most 2,048 content parts (in all messages) are supported, got 2,050"),
        ("completion", {"prompt": "x", "stop": ["a"] * 1_300_000}, "stop",
         "at most 4 stop strings are supported, got 1,300,000"),
        ("completion", {"prompt": [1] * 1_000_001}, "prompt",
         "at most 1,000,000 token ids are supported, got 1,000,001"),
        ("completion", {"prompt": [[1] * 1_000_001]}, "prompt", "token ids are supported"),
    ],
)  # fmt: skip
def test_counts_past_the_bounds_are_refused_naming_the_field(kind, body, param, says):
    error = refusal(kind, body)
    assert error.param == param and says in error.message, error
    assert error.code == "invalid_value"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"prompt": "\xff"}', "Invalid JSON"),  # not UTF-8
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"prompt": "x", "tools": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too"),
        (b'{"prompt": ', "Invalid JSON"),
        (b"", "Invalid JSON"),
    ],
)
def test_every_json_failure_is_invalid_json(body, says):
    error = refusal("completion", body)
    assert error.code == "invalid_json" and says in error.message, error


def test_a_body_without_a_content_type_is_read_as_json():
    out = parse("completion", b'{"prompt": "x", "max_tokens": 2}', None)
    assert isinstance(out, p.CompletionRequest) and out.max_tokens == 2
    error = parse("completion", b"prompt=x", "application/x-www-form-urlencoded")
    assert isinstance(error, BodyError) and "Content-Type was application/x-www" in error.message
    assert refusal("completion", [1, 2]).message == "the body must be a JSON object, got an array"


@pytest.mark.parametrize(
    ("kind", "body", "param", "message"),
    [
        ("completion", {"prompt": "x", "priority": 1.5}, "priority",
         "priority: priority must be an integer (0 = most urgent), a class name or a lane, "
         "got a number"),
        ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages",
         'messages.0.content: content must be a string or a list of {"type": "text", '
         '"text": ...} parts, got an integer'),
        ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages", "messages.0.content: only text content parts are supported, got a part "
         "of type 'image_url'"),
        ("chat", {"messages": [{"role": "user"}]}, "messages",
         "messages.0: a user message needs content"),
        ("chat", {"messages": [{"role": "system", "content": None}]}, "messages",
         "messages.0: a system message needs content"),
        ("completion", {"prompt": "x", "stream_options": {"include_usage": True}},
         "stream_options", "stream_options: stream_options is only allowed with stream: true"),
        ("completion", {"prompt": "x", "stop": ""}, "stop",
         "stop: stop must be a non-empty string or a list of up to 4 non-empty strings of at "
         "most 64 characters"),
    ],
)  # fmt: skip
def test_messages_name_the_clients_fields_only(kind, body, param, message):
    error = refusal(kind, body)
    assert (error.param, error.message) == (param, message)


@pytest.mark.parametrize(
    ("kind", "field", "value", "neutral"),
    [
        ("completion", "response_format", {"type": "json_object"}, '{"type": "text"}'),
        ("completion", "tools", [{"type": "function"}], "[]"),
        ("chat", "modalities", ["text", "audio"], '["text"]'),
        ("chat", "audio", {"voice": "alloy"}, "null"),
        ("chat", "reasoning_effort", "low", "null"),
        ("chat", "service_tier", "flex", '"auto"'),
        ("chat", "store", True, "false"),
        ("chat", "parallel_tool_calls", True, "null"),
        ("chat", "logprobs", True, "false"),
        ("completion", "logprobs", 2, "null"),
    ],
)
def test_unimplemented_parameters_are_refused_by_name(kind, field, value, neutral):
    base = CHAT if kind == "chat" else {"prompt": "x"}
    error = refusal(kind, {**base, field: value})
    assert error.param == field
    assert error.message == (
        f"{field}: not supported by this server: leave {field} out (or send {neutral})"
    )


def test_the_neutral_values_and_an_assistant_turn_without_content_are_accepted():
    neutral = {"modalities": ["text"], "service_tier": "auto", "store": False, "audio": None}
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]
    out = parse("chat", json.dumps({"messages": messages, **neutral}).encode())
    assert isinstance(out, p.ChatCompletionRequest), out
    out = parse("completion", b'{"prompt": "x", "response_format": {"type": "text"}}')
    assert isinstance(out, p.CompletionRequest), out


def test_the_worker_process_answers_as_the_inline_parse():
    huge = json.dumps({"messages": [{"role": "user", "content": "x"}] * 230_000}).encode()
    fine = json.dumps({"messages": [{"role": "user", "content": "y" * 100_000}]}).encode()

    async def go() -> tuple[object, object]:
        parser = BodyParser(inline_bytes=1024)
        try:
            return await parser.parse("chat", huge, None), await parser.parse("chat", fine, None)
        finally:
            parser.close()

    refused, parsed = asyncio.run(go())
    assert refused == parse("chat", huge)
    assert isinstance(parsed, p.ChatCompletionRequest) and parsed == parse("chat", fine)
