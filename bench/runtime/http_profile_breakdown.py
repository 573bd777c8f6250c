"""Where a wok server's threads spend a busy step, from a py-spy profile of the server.

Why: the engine's step is measured without HTTP (bench/runtime/runtime_engine_ab.py), but a server
also runs the event loop (uvicorn, SSE, detokenization) beside it in one process, sharing the GIL.
This sorts py-spy's samples of the engine thread and of the event loop's thread into the parts of a
step, so a change to the server path can be aimed at its largest part.

    py-spy record -p PID -r 250 --threads --idle --format raw -o prof.txt -d 12  # under load
    python bench/runtime/http_profile_breakdown.py prof.txt --step-ms 11.5

Each sample is counted in the first part whose frame it holds, in the order listed below (a
socket write inside the SSE path counts as a socket write). `--step-ms` turns shares into
milliseconds of a step (the load's TPOT P50).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

# (part, frame names that put a sample in it), first match wins
ENGINE_PARTS = [
    ("waits for work (Condition.wait)", ["Condition.wait"]),
    ("wakes the event loop (self-pipe write)", ["_write_to_self"]),
    ("hands outputs over (on_output, metrics)", ["LLMEngine._emit"]),
    ("model forward", ["ModelRunner.forward"]),
    ("sampling", ["Sampler.sample"]),
    ("step plan, sampler glue", ["SampledStep.execute"]),
    ("scheduler, post-processing (under the lock)", ["LLMEngine._iteration"]),
]
LOOP_PARTS = [
    ("idle (epoll)", ["EpollSelector.select"]),
    ("socket writes (SSE chunks, responses)", ["_SelectorSocketTransport.write"]),
    ("SSE chunk JSON", ["_ChunkRenderer.event", "_sse", "chunk", "model_dump_json"]),
    ("detokenization, stop strings", ["IncrementalText.add"]),
    (
        "outputs into request queues (wake-ups)",
        ["_Mailbox._deliver", "Queue.put_nowait", "_read_from_self"],
    ),
    ("streaming path (generators, Starlette, h11)", ["StreamingResponse.stream_response"]),
    ("request admission (HTTP parse, FastAPI, validation)", ["_read_ready", "run_asgi"]),
]


def frame_names(frame: str) -> set[str]:
    """`Class.method` and `method` for a py-spy frame `Class.method (file.py:line)`."""
    name = frame.split(" (", 1)[0]
    return {name, name.rsplit(".", 1)[-1]}


def breakdown(path: Path, thread: str, parts: list[tuple[str, list[str]]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if thread not in frames[0]:
            continue
        names = set().union(*(frame_names(f) for f in frames[1:]))
        part = next((p for p, keys in parts if names.intersection(keys)), "other")
        counts[part] += int(n)
    return counts


def table(title: str, counts: Counter[str], order: list[str], step_ms: float) -> list[str]:
    total = sum(counts.values()) or 1
    lines = [f"| {title} | share | ms of a {step_ms:g} ms step |", "|---|---|---|"]
    for part in [*order, "other"]:
        share = counts[part] / total
        lines.append(f"| {part} | {share:.1%} | {share * step_ms:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--step-ms", type=float, required=True, help="the load's TPOT P50")
    args = parser.parse_args(argv)
    lines = table(
        "engine thread",
        breakdown(args.profile, "wok-engine", ENGINE_PARTS),
        [p for p, _ in ENGINE_PARTS],
        args.step_ms,
    )
    loop = breakdown(args.profile, "MainThread", LOOP_PARTS)
    lines += ["", *table("event loop thread", loop, [p for p, _ in LOOP_PARTS], args.step_ms)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
