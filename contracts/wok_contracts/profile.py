"""Engine step-time profiles: what one iteration of the runtime costs on a given device.

A step that runs `decodes` decoding sequences, `prefill_tokens` prompt tokens (chunked prefill) and
reads `context_tokens` cached tokens (Σ of every scheduled sequence's context) costs

    t = a + b·decodes + c·prefill_tokens + d·context_tokens   seconds.

`a` is the fixed cost (reading the weights once, launches), `b` the per-sequence cost (sampling,
bookkeeping), `c` the prompt FLOPs, and `d` the attention's KV reads, which dominate with long
contexts. A server whose HTTP front end is a process of its own (vLLM's API server) also spends
`request_overhead_s` per request outside the steps (request handling, detokenizing, streaming):
a serial stage in front of the engine, 0 where it is not measured. Profiles are measured (`wok
profile`, a least-squares fit over a grid) or derived from a
device's bandwidth and FLOP figures (labelled `kind: model`). The fleet simulator, `wok plan` and
the runtime's simulated accelerator all read this one format.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

ProfileKind = Literal["measured", "model"]
BUILTIN_PREFIX = "sim:"


class StepCosts:
    """The one step-cost model, `a + b·decodes + c·prefill_tokens + d·context_tokens` seconds,
    for any record with the four costs (a profile, the profiler's fit)."""

    a_s: float
    b_s_per_seq: float
    c_s_per_prefill_token: float
    d_s_per_context_token: float

    def step_seconds(self, decodes: float, prefill_tokens: float, context_tokens: float) -> float:
        return (
            self.a_s
            + self.b_s_per_seq * decodes
            + self.c_s_per_prefill_token * prefill_tokens
            + self.d_s_per_context_token * context_tokens
        )


@dataclass(frozen=True)
class StepProfile(StepCosts):
    name: str
    kind: ProfileKind
    device: str
    a_s: float  # fixed cost per step
    b_s_per_seq: float  # per decoding sequence
    c_s_per_prefill_token: float
    d_s_per_context_token: float
    step_token_budget: int  # max_num_batched_tokens: prefill + decode tokens per step
    kv_capacity_tokens: int
    block_size: int = 16
    max_model_len: int = 8192
    load_seconds: float = 60.0  # time to load the weights before the pod is ready
    request_overhead_s: float = 0.0  # per request, in the server's front end, outside the steps
    notes: str = ""
    fit: dict[str, Any] = field(default_factory=dict)  # how it was measured (grid, residuals)

    def __post_init__(self) -> None:
        costs = (self.a_s, self.b_s_per_seq, self.c_s_per_prefill_token, self.d_s_per_context_token)
        if min(costs) < 0 or self.a_s <= 0 or self.request_overhead_s < 0:
            raise ValueError(f"profile {self.name}: costs must be >= 0 and a > 0")
        if self.step_token_budget < 1 or self.kv_capacity_tokens < self.block_size:
            raise ValueError(f"profile {self.name}: token budget and KV capacity must be positive")

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepProfile:
        try:
            return cls(**data)
        except TypeError as error:
            raise ValueError(f"not a wok step profile: {error}") from None


def builtin_names() -> list[str]:
    folder = resources.files("wok_contracts") / "profiles"
    return sorted(
        BUILTIN_PREFIX + p.name.removesuffix(".json")
        for p in folder.iterdir()
        if p.name.endswith(".json")
    )


def load_profile(ref: str | Path) -> StepProfile:
    """A profile by builtin name (`sim:llama-3-8b-80g`) or JSON path."""
    text_ref = str(ref)
    if text_ref.startswith(BUILTIN_PREFIX):
        name = text_ref.removeprefix(BUILTIN_PREFIX)
        resource = resources.files("wok_contracts") / "profiles" / f"{name}.json"
        if not resource.is_file():
            known = ", ".join(builtin_names())
            raise ValueError(f"unknown builtin profile {text_ref!r} (known: {known})")
        return StepProfile.from_dict(json.loads(resource.read_text()))
    path = Path(text_ref)
    if not path.is_file():
        raise FileNotFoundError(f"profile {path} not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    return StepProfile.from_dict(data)
