"""`wok evaluate --trace PATH[@SCALE,…]`: the matrix's protocol on a trace file of your own.

A trace looked at while deciding the law is a development trace; a file handed to this command
is held out. Its conditions are scored as the matrix's are (from `WARM_UP_S`, every autoscaler
from the same warm start, five seeds, the static frontier, the swept baselines), at each rate
scale asked (overlaid copies), one pod start, each SLO set. The file is read before anything
runs: a file that is no trace, or too short to score, is one clear error.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from wok_sim.evaluation_matrix import (
    SEEDS,
    SLO_SETS,
    TRACES,
    WARM_UP_S,
    Condition,
    _requests,
    split_window,
)

#: The trace files `--trace PATH` reads, by suffix (`wok_contracts.traces.load_trace`).
TRACE_FORMATS = {
    ".csv": "Azure LLM trace CSV",
    ".jsonl": "Mooncake JSONL",
    ".json": "compact ServeGen JSON",
}
HELD_OUT_START_S = 90.0  # a trace file's pod start, unless `--cold-start` says otherwise


def trace_format(path: Path) -> str:
    """The format `load_trace` reads `path` as, by its suffix; a clear error for another."""
    kind = TRACE_FORMATS.get(path.suffix)
    if kind is None:
        known = ", ".join(f"{suffix} ({kind})" for suffix, kind in TRACE_FORMATS.items())
        if not path.suffix and not path.exists():  # most likely a built-in name mistyped
            raise ValueError(
                f"unknown trace {path}: neither a built-in trace ({', '.join(TRACES)}) nor a "
                f"trace file ({known})"
            )
        raise ValueError(
            f"trace {path}: unknown format {path.suffix or '(no suffix)'!r}, want {known}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"trace {path} not found")
    return kind


def parse_scales(text: str, what: str) -> tuple[float, ...]:
    """`X[,X…]`: positive numbers (rate scales, pod starts), each once, in order; a clear error
    for anything else."""
    try:
        factors = tuple(float(x) for x in text.split(","))
    except ValueError:
        factors = ()
    if not factors or not all(math.isfinite(f) and f > 0 for f in factors):
        raise ValueError(f"bad {what}: want positive numbers X[,X…], got {text!r}")
    return tuple(dict.fromkeys(factors))


def parse_traces(values: Sequence[str]) -> tuple[list[str], list[tuple[str, tuple[float, ...]]]]:
    """`--trace` values: the built-in traces named, and each trace file with its rate scales."""
    names: list[str] = []
    files: list[tuple[str, tuple[float, ...]]] = []
    for value in values:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if parts and all(p in TRACES for p in parts):
            names += parts
            continue
        path, at, scales = value.rpartition("@")
        if not at or Path(value).is_file():
            path, scales = value, "1"
        factors = parse_scales(scales, f"--trace {value!r} (PATH[@SCALE,…])")
        trace_format(Path(path))
        files.append((str(Path(path)), factors))
    if not names and not files:
        raise ValueError(f"--trace names no trace (built in: {', '.join(TRACES)}; or a file)")
    return names, files


def held_out(
    files: Sequence[tuple[str, Sequence[float]]], slos: Iterable[str], cold_start_s: float
) -> list[Condition]:
    """A trace file's conditions: each of its scales under each SLO set, at one pod start (a
    file named twice runs once)."""
    conditions = (
        Condition(path, scale, cold_start_s, slo)
        for path, scales in files
        for scale in scales
        for slo in SLO_SETS
        if slo in slos
    )
    return list(dict.fromkeys(conditions))


def check_held_out(conditions: Sequence[Condition]) -> None:
    """Each trace file's first draw, read before any simulation: a file that is not a trace, or
    one too short to be scored from `WARM_UP_S`, is a clear error, and what it holds is said."""
    for trace, scale in dict.fromkeys((c.trace, c.scale) for c in conditions):
        requests = _requests(trace, scale, SEEDS[0])
        path, _ = split_window(trace)
        span = requests[-1].arrival_s if requests else 0.0
        if span <= WARM_UP_S:
            raise ValueError(
                f"trace {trace} ×{scale:g} spans {span:.0f} s: every policy is scored from "
                f"{WARM_UP_S:g} s, so it needs arrivals after that"
            )
        print(
            f"wok evaluate: {trace} ({trace_format(Path(path))}) ×{scale:g}: "
            f"{len(requests):,} requests over {span / 3600:.2f} h",
            file=sys.stderr,
        )
