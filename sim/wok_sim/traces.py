"""Request traces: what arrives, when, and how long it is.

Readers for the Azure LLM inference trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`) and the
Mooncake JSONL format (`timestamp` in ms, `input_length`, `output_length`), plus Poisson and
scripted loads, and the rate scaling the fleet simulator offers (`compress` or `overlay`). One
parser per format, shared with the runtime's benchmarks (this module is pure Python).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

RateMode = Literal["compress", "overlay"]
OVERLAY_JITTER_S = 30.0  # how far an overlay copy may move from its original's arrival


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float  # seconds from the start of the trace
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Phase:
    """`seconds` of Poisson arrivals whose rate moves linearly from `rate` to `rate_end`."""

    seconds: float
    rate: float
    rate_end: float | None = None


# A busy stretch in miniature: quiet, a ramp, a plateau, a ramp down, a quiet tail (15 minutes).
DEFAULT_SCRIPT = (
    Phase(60, 2.0),
    Phase(240, 2.0, 60.0),
    Phase(180, 60.0),
    Phase(120, 60.0, 2.0),
    Phase(300, 2.0),
)


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"trace {path} not found")


def read_azure(path: Path, limit: int | None = None) -> list[TraceRequest]:
    """An Azure LLM trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens), times from the first
    row; `limit` keeps the first rows only."""
    _check_file(path)
    with path.open(newline="") as f:
        rows = list(itertools.islice(csv.DictReader(f), limit))
    if not rows:
        raise ValueError(f"trace {path} has no rows")
    try:
        # The trace has 7 fractional digits; datetime takes 6.
        times = [datetime.fromisoformat(r["TIMESTAMP"].strip()[:26]) for r in rows]
        start = times[0]
        return [
            TraceRequest(
                arrival_s=(t - start).total_seconds(),
                prompt_tokens=int(r["ContextTokens"]),
                output_tokens=int(r["GeneratedTokens"]),
            )
            for t, r in zip(times, rows, strict=True)
        ]
    except (KeyError, ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not an Azure LLM trace CSV: {error}") from None


def read_mooncake(path: Path, limit: int | None = None) -> list[TraceRequest]:
    """A Mooncake JSONL trace (`timestamp` in ms, `input_length`, `output_length`)."""
    _check_file(path)
    out: list[TraceRequest] = []
    with path.open() as f:
        lines = (line for line in f if line.strip())
        for number, line in enumerate(itertools.islice(lines, limit), start=1):
            try:
                row = json.loads(line)
                out.append(
                    TraceRequest(
                        arrival_s=float(row["timestamp"]) / 1000.0,
                        prompt_tokens=int(row["input_length"]),
                        output_tokens=int(row["output_length"]),
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                raise ValueError(f"{path}:{number} is not a Mooncake trace line: {error}") from None
    if not out:
        raise ValueError(f"trace {path} has no rows")
    start = min(r.arrival_s for r in out)
    return sorted(
        (TraceRequest(r.arrival_s - start, r.prompt_tokens, r.output_tokens) for r in out),
        key=lambda r: r.arrival_s,
    )


def _lengths(rng: random.Random, mean: float) -> int:
    """A geometric-like length with the given mean (at least 1): short ones common, long ones
    rare, as in real LLM traffic."""
    return max(1, round(rng.expovariate(1.0 / mean)))


def poisson(
    rate: float,
    seconds: float,
    *,
    mean_prompt: float = 512,
    mean_output: float = 128,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals at `rate` per second for `seconds`, exponential lengths (seeded)."""
    return scripted(
        (Phase(seconds, rate),), mean_prompt=mean_prompt, mean_output=mean_output, seed=seed
    )


def scripted(
    phases: tuple[Phase, ...] = DEFAULT_SCRIPT,
    *,
    mean_prompt: float = 512,
    mean_output: float = 128,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson arrivals whose rate follows `phases` (by thinning at the phase's peak rate)."""
    if not phases or any(p.seconds <= 0 or p.rate < 0 or (p.rate_end or 0) < 0 for p in phases):
        raise ValueError("a load script needs phases with seconds > 0 and rates >= 0")
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    start = 0.0
    for phase in phases:
        end_rate = phase.rate if phase.rate_end is None else phase.rate_end
        peak = max(phase.rate, end_rate)
        t = 0.0
        while peak > 0:
            t += rng.expovariate(peak)
            if t >= phase.seconds:
                break
            rate = phase.rate + (end_rate - phase.rate) * t / phase.seconds
            if rng.random() * peak < rate:
                out.append(
                    TraceRequest(start + t, _lengths(rng, mean_prompt), _lengths(rng, mean_output))
                )
        start += phase.seconds
    return out


def scale_rate(
    requests: list[TraceRequest], factor: float, *, mode: RateMode, seed: int = 0
) -> list[TraceRequest]:
    """`compress` divides arrival times by `factor`; `overlay` keeps the clock and gives each
    request factor − 1 copies on average (the floor, plus one more with the fraction's
    probability), each moved by a seeded uniform jitter of ±30 s, with the same lengths. A copy
    jittered past either end of the trace is reflected back inside it: clipping would stack every
    such copy on the first or last instant (168 requests at one instant at the end of the code
    trace ×3), a burst the trace never had. Overlay keeps the trace's minute-scale shape, which
    compressing an hour into minutes would hide from autoscalers' 5-minute windows."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"--rate-scale must be a positive number, got {factor}")
    if mode == "compress":
        return [
            TraceRequest(r.arrival_s / factor, r.prompt_tokens, r.output_tokens) for r in requests
        ]
    if mode != "overlay":
        raise ValueError(f"--rate-mode must be compress or overlay, got {mode!r}")
    if factor < 1:
        raise ValueError(f"overlay can only add load: --rate-scale must be >= 1, got {factor}")
    if not requests:
        return []
    rng = random.Random(seed)
    span = max(r.arrival_s for r in requests)
    extra = factor - 1.0
    whole, fraction = math.floor(extra), extra - math.floor(extra)
    out = list(requests)
    for r in requests:
        copies = whole + (1 if rng.random() < fraction else 0)
        for _ in range(copies):
            t = abs(r.arrival_s + rng.uniform(-OVERLAY_JITTER_S, OVERLAY_JITTER_S))
            t = span - abs(span - t)
            out.append(TraceRequest(min(max(t, 0.0), span), r.prompt_tokens, r.output_tokens))
    out.sort(key=lambda r: r.arrival_s)
    return out


def clip_to_model(
    requests: list[TraceRequest], max_model_len: int
) -> tuple[list[TraceRequest], int]:
    """Prompts clipped to max_model_len − 1 tokens and outputs to what then fits (the runtime
    stops a sequence at max_model_len); every request asks for at least one token. Returns the
    requests and how many were clipped."""
    out: list[TraceRequest] = []
    clipped = 0
    for r in requests:
        prompt = min(max(1, r.prompt_tokens), max_model_len - 1)
        output = min(max(1, r.output_tokens), max_model_len - prompt)
        clipped += (prompt, output) != (r.prompt_tokens, r.output_tokens)
        out.append(TraceRequest(r.arrival_s, prompt, output))
    return out, clipped


def parse_script(text: str) -> tuple[Phase, ...]:
    """`script` (the default script) or `script:S@RATE[-RATE_END],…` (`script:60@1,240@1-20`)."""
    body = text.removeprefix("script").removeprefix(":")
    if not body:
        return DEFAULT_SCRIPT
    phases = []
    for part in body.split(","):
        try:
            seconds, _, rates = part.partition("@")
            start, _, end = rates.partition("-")
            phases.append(Phase(float(seconds), float(start), float(end) if end else None))
        except ValueError:
            raise ValueError(
                f"bad load script phase {part!r} (want SECONDS@RATE[-RATE_END])"
            ) from None
    return tuple(phases)


def load_trace(ref: str, *, seed: int = 0) -> list[TraceRequest]:
    """`poisson:RATE:SECONDS`, `script[:…]`, or a path (`.jsonl`: Mooncake, else Azure CSV)."""
    if ref.startswith("poisson:"):
        try:
            _, rate, seconds = ref.split(":")
            return poisson(float(rate), float(seconds), seed=seed)
        except ValueError:
            raise ValueError(f"bad trace {ref!r} (want poisson:RATE:SECONDS)") from None
    if ref == "script" or ref.startswith("script:"):
        return scripted(parse_script(ref), seed=seed)
    path = Path(ref)
    if path.suffix == ".jsonl":
        return read_mooncake(path)
    return read_azure(path)
