"""The output file: append-only result lines, so a run may die at any instant and resume.

Each result is one whole line, written and fsynced before it counts as answered. A crash can at
worst leave a torn last line; a run first cuts that tail away, then drops the lines that failed
for a reason outside the line (they are sent again) and skips the ids still answered, so every
custom_id ends with exactly one result line however often it is killed or rerun.
The lines are OpenAI's batch output format.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

#: How far back a torn tail is searched for its line start per read.
_TAIL_CHUNK = 64 * 1024

#: 4xx answers that say nothing about the line's own body: a wrong endpoint (404, 405, e.g. a
#: --url that pointed elsewhere), a request timeout (408) or throttling (429). A rerun retries
#: them, as it does 5xx answers and requests that got no answer at all.
RETRIED_4XX = frozenset({404, 405, 408, 429})


def result_record(
    custom_id: str,
    *,
    response: dict[str, Any] | None = None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One output line. `response` is {status_code, request_id, body} for every HTTP answer
    (errors included, as OpenAI writes them); `error` is {code, message} when none came."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }


def result_line(record: dict[str, Any]) -> bytes:
    """One record as the bytes of its output line, newline included."""
    line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
    return line.encode("utf-8")


def truncate_torn_tail(path: Path) -> int:
    """Cut the bytes after the last newline (a line a crash tore); returns how many were cut."""
    if not path.exists():
        return 0
    with path.open("r+b") as file:
        size = file.seek(0, os.SEEK_END)
        keep, end = 0, size
        while end > 0:
            start = max(0, end - _TAIL_CHUNK)
            file.seek(start)
            newline = file.read(end - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        if keep < size:
            file.truncate(keep)
            os.fsync(file.fileno())
        return size - keep


def is_final(record: dict[str, Any]) -> bool:
    """Whether a result line stands on a rerun: a 2xx, or a 4xx for the line's own body (it would
    fail the same way again, as a 404 `model_not_found` does). No answer, a 5xx or another
    `RETRIED_4XX` is sent again."""
    response = record["response"]
    if response is None:
        return False
    status = response["status_code"]
    if status == 404 and _error_code(response) == "model_not_found":
        return True  # the line names a model the server lacks: a rerun fails the same way
    return status < 500 and status not in RETRIED_4XX


def _error_code(response: dict[str, Any]) -> str | None:
    body = response.get("body")
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def read_results(path: Path) -> list[dict[str, Any]]:
    """The result lines of an output file (call after truncate_torn_tail); [] if there is none."""
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    with path.open("rb") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                valid = isinstance(record["custom_id"], str) and "response" in record
            except (ValueError, KeyError, TypeError):
                valid = False
            if not valid:
                # Appending to a file that is not ours could bury someone's data in ours.
                raise ValueError(f"{path}:{line_number}: not a batch result line; not resuming")
            records.append(record)
    return records


def keep_final(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """Drops the result lines a rerun sends again (see `is_final`), rewriting the file atomically
    when there are any; returns the final records by custom_id and how many lines were dropped."""
    records = read_results(path)
    final = [record for record in records if is_final(record)]
    dropped = len(records) - len(final)
    if dropped:
        scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        with scratch.open("wb") as file:
            file.writelines(result_line(record) for record in final)
            file.flush()
            os.fsync(file.fileno())
        # A crash before the rename leaves the old file whole: the next run does this again.
        os.replace(scratch, path)
    return {record["custom_id"]: record for record in final}, dropped


class ResultWriter:
    """Appends result lines, each with one O_APPEND write and an fsync before it returns."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        pending = memoryview(result_line(record))
        while pending:
            pending = pending[os.write(self._fd, pending) :]
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
