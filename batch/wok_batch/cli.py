"""`wok batch run` and `wok batch validate`, registered into the `wok` CLI.

httpx and tqdm are imported only when a batch runs, so `wok --help` stays instant everywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from wok_batch.batch_file import read_batch_file
from wok_batch.results import ResultWriter, keep_final, truncate_torn_tail
from wok_batch.summary import Summary


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "batch", help="offline work in the OpenAI Batch file format, sent to a live service"
    )
    batch = parser.add_subparsers(dest="batch_command", required=True, metavar="COMMAND")
    run_parser = batch.add_parser(
        "run",
        help="send every request of a batch file; resumes from the output file",
        description="Send every request of a batch file. A rerun skips the lines already "
        "answered 2xx or refused for their own body (4xx), and sends again those that failed for "
        "a reason outside the line (no answer, 5xx, 429, 404/405). Exit 0 when every line has a "
        "2xx answer, 1 when any has not, 2 on an invalid input file or argument.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_arguments(run_parser)
    run_parser.set_defaults(func=run)
    validate_parser = batch.add_parser("validate", help="check a batch file, send nothing")
    validate_parser.add_argument("--input", type=Path, required=True, metavar="FILE")
    validate_parser.set_defaults(func=validate)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", type=Path, required=True, metavar="FILE", help="request lines")
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        metavar="FILE",
        help="result lines, appended; ids answered in it are skipped",
    )
    parser.add_argument(
        "--url",
        required=True,
        help="the service's base URL, with or without /v1, e.g. http://NAME-runtime",
    )
    parser.add_argument("--max-concurrency", type=int, default=32, metavar="N")
    parser.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="per request attempt"
    )
    parser.add_argument(
        "--priority",
        choices=("batch",),
        default=None,
        help="send every request in the runtime's batch lane (body field priority)",
    )
    parser.add_argument("--json", action="store_true", help="the summary as JSON on stdout")


def validate(args: argparse.Namespace) -> int:
    requests = read_batch_file(args.input)
    print(f"{args.input}: {len(requests)} request{'s' * (len(requests) != 1)}, valid")
    return 0


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from wok_batch.client import ClientSettings, send_all

    requests = read_batch_file(args.input)
    settings = ClientSettings(
        url=args.url,
        max_concurrency=args.max_concurrency,
        timeout_s=args.timeout,
        priority=args.priority,
    )
    torn = truncate_torn_tail(args.output)
    if torn:
        print(f"cut a torn last line ({torn} bytes) left by an interrupted run", file=sys.stderr)
    answered, dropped = keep_final(args.output)
    if dropped:
        print(
            f"sending again {dropped} lines that failed for a reason outside the line",
            file=sys.stderr,
        )
    summary = Summary(total=len(requests))
    pending = []
    for request in requests:
        if request.custom_id in answered:
            summary.add_earlier(answered[request.custom_id])
        else:
            pending.append(request)
    started = time.monotonic()
    with (
        ResultWriter(args.output) as writer,
        tqdm(
            total=len(requests),
            initial=summary.skipped,
            unit="req",
            dynamic_ncols=True,
            # In a pod's log a redrawn bar is a line each time: fewer, then.
            mininterval=0.5 if sys.stderr.isatty() else 30.0,
        ) as progress,
    ):

        def on_result(record: dict[str, Any]) -> None:
            writer.append(record)
            summary.add(record)
            progress.update()

        stats = asyncio.run(send_all(pending, settings, on_result=on_result))
    summary.elapsed_s = time.monotonic() - started
    summary.throttled, summary.retried = stats.throttled, stats.retried
    print(json.dumps(summary.as_dict()) if args.json else summary.text())
    return summary.exit_code
