"""The input file: OpenAI Batch request lines, validated whole before anything is sent.

A batch that fails on line 90,000 after hours of work is worse than one refused at once, so every
line is checked first and every problem is reported with its line number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The endpoints a wok runtime serves without streaming.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
#: Problems listed in the error message; the rest are counted (a broken file may have millions).
MAX_REPORTED_PROBLEMS = 20


@dataclass(frozen=True)
class BatchRequest:
    line_number: int
    custom_id: str
    url: str
    body: dict[str, Any]


class BatchFileError(ValueError):
    """The input file is invalid; the message names every bad line (up to a limit)."""

    def __init__(self, source: str, problems: list[tuple[int, str]]) -> None:
        self.problems = problems
        shown = [f"{source}:{line}: {reason}" for line, reason in problems[:MAX_REPORTED_PROBLEMS]]
        if len(problems) > MAX_REPORTED_PROBLEMS:
            shown.append(f"… and {len(problems) - MAX_REPORTED_PROBLEMS} more problems")
        super().__init__(f"invalid batch file ({len(problems)} problems):\n" + "\n".join(shown))


def _problem(record: Any) -> str | None:
    """Why one decoded line is not a batch request, or None when it is one."""
    if not isinstance(record, dict):
        return "a line must be a JSON object"
    missing = [key for key in ("custom_id", "method", "url", "body") if key not in record]
    if missing:
        return f"missing field(s): {', '.join(missing)}"
    if not isinstance(record["custom_id"], str) or not record["custom_id"]:
        return "custom_id must be a non-empty string"
    if record["method"] != "POST":
        return f"method must be POST, got {record['method']!r}"
    if record["url"] not in ENDPOINTS:
        return f"unknown url {record['url']!r}: use one of {', '.join(ENDPOINTS)}"
    if not isinstance(record["body"], dict):
        return "body must be a JSON object"
    if record["body"].get("stream"):
        # One result line per request: a stream of events has no place in the output file.
        return "body.stream must be false in a batch file"
    return None


def parse_batch_lines(
    lines: Iterable[str | bytes], *, source: str = "<input>"
) -> list[BatchRequest]:
    """Every request of the file, or BatchFileError naming each bad line. Blank lines are
    skipped (a trailing newline or two is no reason to refuse a file)."""
    requests: list[BatchRequest] = []
    problems: list[tuple[int, str]] = []
    first_line_of: dict[str, int] = {}
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append((line_number, f"not valid JSON ({error.msg}, column {error.colno})"))
            continue
        except UnicodeDecodeError:
            problems.append((line_number, "not UTF-8 text"))
            continue
        problem = _problem(record)
        if problem is not None:
            problems.append((line_number, problem))
            continue
        custom_id = record["custom_id"]
        if custom_id in first_line_of:
            first = first_line_of[custom_id]
            problems.append((line_number, f"duplicate custom_id {custom_id!r} (first on {first})"))
            continue
        first_line_of[custom_id] = line_number
        requests.append(BatchRequest(line_number, custom_id, record["url"], record["body"]))
    if problems:
        raise BatchFileError(source, problems)
    return requests


def read_batch_file(path: Path) -> list[BatchRequest]:
    # Bytes, so a stray non-UTF-8 line is reported with its number like any other bad line.
    with path.open("rb") as lines:
        return parse_batch_lines(lines, source=str(path))
