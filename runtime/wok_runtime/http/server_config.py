"""The HTTP server's settings: `ServerConfig` (validated at construction), the priority classes
and the headers and limits the routes share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wok_runtime.http.http_limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S

DEFAULT_PRIORITY_CLASSES = {"interactive": 0, "standard": 1, "batch": 2}
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SAMPLING_EPS = 1e-5
PRIORITY_HEADER = "x-wok-priority"
LANE_HEADER = "x-wok-lane"  # online | batch; overrides a lane named by the body's priority
TENANT_HEADER = "x-wok-tenant"
PREEMPTIONS_HEADER = "x-wok-preemptions"  # on non-streamed answers: times it was preempted
QUEUE_TIME_HEADER = "x-wok-queue-seconds"  # on non-streamed answers: arrival to first step
MAX_TENANT_LEN = 128
#: vLLM 0.32's answer past `--max-num-queued-reqs` (vllm/exceptions.py, QueueOverflowError).
VLLM_QUEUE_OVERFLOW = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
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
    # A request's headers, then its body, must arrive within these (http_limits.py).
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    # Answer as a vLLM 0.32 server does where wok's runtime differs: 503 past the queue bound
    # (vLLM's --max-num-queued-reqs) and `/health` (`wok runtime serve --as-vllm`).
    as_vllm: bool = False

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
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name.replace('_', ' ')} must be > 0, got {value}")

    @property
    def max_priority(self) -> int:
        return max(self.priority_classes.values())
