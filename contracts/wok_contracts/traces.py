"""Request traces: what arrives, when, and how long it is.

Readers for the Azure LLM inference trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`), the
Mooncake JSONL format (`timestamp` in ms, `input_length`, `output_length`, `hash_ids`) and the
compact ServeGen day trace (per-window rates, inter-arrival fits and length PMFs, drawn from), plus
Poisson loads (lengths exponential, or uniform as the runtime's benchmarks ask) and scripted
ones, and the rate scaling the fleet simulator offers (`compress` or `overlay`). One record
(`TraceRequest`) and one parser per format, shared with the runtime's benchmarks (this module is
pure Python).
"""

from __future__ import annotations

import bisect
import collections
import csv
import dataclasses
import itertools
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterator

RateMode = Literal["compress", "overlay"]
OVERLAY_JITTER_S = 30.0  # how far an overlay copy may move from its original's arrival
#: Tokens per prefix block of a Mooncake trace's `hash_ids`.
HASH_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float  # seconds from the start of the trace
    prompt_tokens: int
    output_tokens: int
    # Ids of the prompt's HASH_BLOCK_TOKENS-token blocks (Mooncake): two prompts with the same
    # first k ids share their first k blocks, so the ids show what a prefix cache can reuse.
    # Empty when the trace does not say.
    hash_ids: tuple[int, ...] = ()


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
    """A Mooncake JSONL trace (`timestamp` in ms, `input_length`, `output_length`, and
    optionally `hash_ids`)."""
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
                        hash_ids=tuple(int(i) for i in row.get("hash_ids", ())),
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
                raise ValueError(f"{path}:{number} is not a Mooncake trace line: {error}") from None
    if not out:
        raise ValueError(f"trace {path} has no rows")
    start = min(r.arrival_s for r in out)
    return sorted(
        (dataclasses.replace(r, arrival_s=r.arrival_s - start) for r in out),
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


def uniform_poisson(
    count: int,
    *,
    rate: float,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    seed: int = 0,
) -> list[TraceRequest]:
    """`count` requests, the first at 0, then Poisson arrivals at `rate` per second (inf: all at
    once), lengths uniform in the inclusive ranges (`(n, n)`: all n). The arrivals draw from the
    seed's own stream and the lengths from another one, so one seed gives the same arrival times
    whatever the lengths asked."""
    if not rate > 0:
        raise ValueError(f"a request rate must be > 0 (inf: all at once), got {rate}")
    arrivals = random.Random(seed)
    lengths = random.Random(f"lengths:{seed}")
    t = 0.0
    out = []
    for _ in range(count):
        out.append(
            TraceRequest(t, lengths.randint(*prompt_tokens), lengths.randint(*output_tokens))
        )
        if math.isfinite(rate):
            t += arrivals.expovariate(rate)
    return out


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
    compressing an hour into minutes would hide from autoscalers' 5-minute windows. A copy is
    another user's request: it keeps the prefix blocks that requests of the trace share, and
    its own blocks from the first private one on (`private_copy`)."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"--rate-scale must be a positive number, got {factor}")
    if mode == "compress":
        return [dataclasses.replace(r, arrival_s=r.arrival_s / factor) for r in requests]
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
    uses = collections.Counter(i for r in requests for i in r.hash_ids)
    fresh = itertools.count(max(uses, default=-1) + 1)
    out = list(requests)
    for r in requests:
        copies = whole + (1 if rng.random() < fraction else 0)
        for _ in range(copies):
            t = abs(r.arrival_s + rng.uniform(-OVERLAY_JITTER_S, OVERLAY_JITTER_S))
            t = span - abs(span - t)
            ids = private_copy(r.hash_ids, uses, fresh)
            out.append(dataclasses.replace(r, arrival_s=min(max(t, 0.0), span), hash_ids=ids))
    out.sort(key=lambda r: r.arrival_s)
    return out


def private_copy(
    hash_ids: tuple[int, ...], uses: collections.Counter[int], fresh: Iterator[int]
) -> tuple[int, ...]:
    """The blocks of a copy of a prompt: the leading ones that several requests of the trace
    share (a system prompt), then new ids from the first block only this prompt has."""
    shared = len(list(itertools.takewhile(lambda i: uses[i] > 1, hash_ids)))
    return hash_ids[:shared] + tuple(next(fresh) for _ in hash_ids[shared:])


def splice(
    requests: list[TraceRequest],
    other: list[TraceRequest],
    start_s: float,
    end_s: float,
    *,
    seed: int = 0,
) -> list[TraceRequest]:
    """The same arrivals, with the lengths of `other`'s requests (in its order, from a seeded
    place, round and round) for those that arrive in [start_s, end_s): the context mix shifts
    mid-run while the arrival process stays, so what changes is only what each request asks of
    a pod. Spliced prompts carry no prefix ids (another user's prompt shares nothing here)."""
    if not (0 <= start_s < end_s):
        raise ValueError(f"a splice needs 0 <= START < END, got {start_s:g}-{end_s:g}")
    if not other:
        raise ValueError("the spliced trace has no requests")
    lengths = itertools.cycle(other)
    for _ in range(random.Random(seed).randrange(len(other))):
        next(lengths)
    out = []
    for r in requests:
        if start_s <= r.arrival_s < end_s:
            o = next(lengths)
            r = dataclasses.replace(
                r, prompt_tokens=o.prompt_tokens, output_tokens=o.output_tokens, hash_ids=()
            )
        out.append(r)
    return out


def parse_splice(text: str) -> tuple[str, float, float]:
    """`REF@START-END` (`bench/traces/mooncake_conversation.jsonl@600-1200`): the trace whose
    lengths the requests arriving between START and END seconds take."""
    ref, _, window = text.rpartition("@")
    start, _, end = window.partition("-")
    try:
        return ref, float(start), float(end)
    except ValueError:
        raise ValueError(f"bad splice {text!r} (want TRACE@START-END)") from None


def cut_window(requests: list[TraceRequest], start_s: float, end_s: float) -> list[TraceRequest]:
    """The requests that arrive in [start_s, end_s), their clock moved to start there: a window
    of a longer trace (a morning's ramp out of a day) with the draws the whole trace made."""
    if not (0 <= start_s < end_s):
        raise ValueError(f"a window needs 0 <= START < END, got {start_s:g}-{end_s:g}")
    return [
        dataclasses.replace(r, arrival_s=r.arrival_s - start_s)
        for r in requests
        if start_s <= r.arrival_s < end_s
    ]


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_window(text: str) -> tuple[float, float]:
    """`START-END`, each seconds or with a unit (`8h-13h`, `30m-90m`, `600-1200`)."""

    def seconds(part: str) -> float:
        part = part.strip()
        unit = _UNITS.get(part[-1:])
        value = float(part[:-1] if unit else part) * (unit or 1.0)
        if not math.isfinite(value):
            raise ValueError(part)
        return value

    start, dash, end = text.partition("-")
    try:
        window = seconds(start), seconds(end)
    except ValueError:
        window = None
    if not dash or window is None or not (0 <= window[0] < window[1]):
        raise ValueError(
            f"bad window {text!r} (want START-END, e.g. 8h-13h or 600-1200, START < END)"
        )
    return window


def clip_to_model(
    requests: list[TraceRequest], max_model_len: int
) -> tuple[list[TraceRequest], int]:
    """Prompts clipped to max_model_len − 1 tokens and outputs to what then fits (the runtime
    stops a sequence at max_model_len); every request asks for at least one token. Returns the
    requests and how many were clipped."""
    out: list[TraceRequest] = []
    clipped = 0
    for r in requests:
        if r.prompt_tokens >= 1 and 1 <= r.output_tokens <= max_model_len - r.prompt_tokens:
            out.append(r)  # fits as it is (the common case, checked first: a day is millions)
            continue
        prompt = min(max(1, r.prompt_tokens), max_model_len - 1)
        output = min(max(1, r.output_tokens), max_model_len - prompt)
        if (prompt, output) == (r.prompt_tokens, r.output_tokens):
            out.append(r)  # frozen: shared, not copied (a day's trace holds millions)
        else:
            clipped += 1
            out.append(dataclasses.replace(r, prompt_tokens=prompt, output_tokens=output))
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
    """`poisson:RATE:SECONDS`, `script[:…]`, or a path (`.jsonl`: Mooncake; `.json`: a compact
    ServeGen trace, its default day drawn with `seed`; else Azure CSV)."""
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
    if path.suffix == ".json":
        return read_servegen(path, seed=seed)
    return read_azure(path)


DAY_S = 86400.0


def read_servegen(
    path: Path,
    *,
    day: int | None = None,
    seconds: float = DAY_S,
    rate_scale: float | None = None,
    seed: int = 0,
) -> list[TraceRequest]:
    """A seeded request stream drawn from a compact ServeGen trace (bench/traces/servegen.py):
    `seconds` from midnight of `day` (0 is the file's first), times from there; by default the
    file's own day and rate scale. Each stream is a renewal process in its own clock: unit-mean
    gaps from the window's fitted family and shape (the fit gives the burstiness; the window's
    rate × `rate_scale` gives the mean, the shape's CV is kept), spent in seconds at the window's
    rate, so a gap that runs into an idle window resumes when the stream does. Lengths come from
    the PMF of the 6-hour block the arrival falls in: a log bin by its weight, then a token
    count uniform in it."""
    _check_file(path)
    try:
        trace = json.loads(path.read_text())
        window, block = float(trace["window_s"]), float(trace["block_s"])
        streams = [(s["rate"], s["family"], s["shape"]) for s in trace["streams"]]
        edges = [int(e) for e in trace["edges"]]
        pmfs = [_cumulative(trace[f"{k}_ppm"]) for k in ("input", "output")]
        day = int(trace["default_day"]) if day is None else day
        scale = float(trace["default_rate_scale"]) if rate_scale is None else rate_scale
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is not a compact ServeGen trace: {error}") from None
    start_s = day * DAY_S
    end_s = start_s + seconds
    held = len(streams[0][0]) * window
    if not (0 <= start_s < end_s <= held and scale > 0 and math.isfinite(scale)):
        raise ValueError(
            f"{path} holds {held / DAY_S:g} days: want a span inside it and a positive rate "
            f"scale, got day {day}, {seconds:g} s at ×{scale:g}"
        )
    rng = random.Random(seed)
    arrivals = sorted(
        t
        for rates, families, shapes in streams
        for t in _renewal(rng, rates, families, shapes, window, start_s, end_s, scale)
    )
    out = []
    for t in arrivals:
        b = min(int(t // block), len(pmfs[0]) - 1)
        prompt, output = (_draw(rng, edges, pmf[b]) for pmf in pmfs)
        out.append(TraceRequest(t - start_s, prompt, output))
    return out


def _renewal(
    rng: random.Random,
    rates: list[float],
    families: str,
    shapes: list[float],
    window: float,
    start_s: float,
    end_s: float,
    rate_scale: float,
) -> list[float]:
    """One stream's arrival times in [start_s, end_s): `left` is the unit-mean gap still to run,
    spent at each window's rate."""
    out: list[float] = []
    left: float | None = None  # the first gap is drawn in the first busy window
    for w in range(int(start_s // window), math.ceil(end_s / window)):
        rate = rates[w] * rate_scale
        if rate <= 0:
            continue
        lo, hi = max(w * window, start_s), min((w + 1) * window, end_s)
        t = lo
        while True:
            if left is None:
                left = _unit_gap(rng, families[w], shapes[w])
            if t + left / rate >= hi:
                left -= (hi - t) * rate
                break
            t += left / rate
            out.append(t)
            left = None
    return out


def _unit_gap(rng: random.Random, family: str, shape: float) -> float:
    """A gap of mean 1 from a Gamma (`G`) or Weibull (`W`) of this shape."""
    if family == "G":
        return rng.gammavariate(shape, 1.0 / shape)
    if family == "W":
        return rng.weibullvariate(1.0 / math.gamma(1.0 + 1.0 / shape), shape)
    raise ValueError(f"unknown inter-arrival family {family!r} in a busy window")


def _cumulative(blocks: list[list[int]]) -> list[list[float]]:
    """Each block's parts per million as a cumulative distribution over its bins."""
    out = []
    for ppm in blocks:
        total = float(sum(ppm))
        if total <= 0:
            raise ValueError("a length PMF with no weight")
        out.append(list(itertools.accumulate(p / total for p in ppm)))
    return out


def _draw(rng: random.Random, edges: list[int], cumulative: list[float]) -> int:
    """A token count: a bin by its weight, then uniform inside it."""
    k = min(bisect.bisect_right(cumulative, rng.random()), len(cumulative) - 1)
    return rng.randrange(edges[k], edges[k + 1])
