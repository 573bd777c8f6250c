"""Request traces: what arrives, when, and how long it is.

Readers for the Azure LLM inference trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`) and the
Mooncake JSONL format (`timestamp` in ms, `input_length`, `output_length`), plus Poisson and scripted
loads, and the rate scaling the fleet simulator offers (`compress` or `overlay`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float  # seconds from the start of the trace
    prompt_tokens: int
    output_tokens: int
