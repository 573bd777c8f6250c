"""The output file: append-only result lines, so a run may die at any instant and resume.

Each result is one whole line, written and fsynced before it counts as answered. A crash can at
worst leave a torn last line; a run first cuts that tail away, then reads which ids are answered
and skips them, so every custom_id ends with exactly one result line however often it is killed.
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


def answered_ids(path: Path) -> set[str]:
    """The custom_ids that already have a result line (call after truncate_torn_tail)."""
    if not path.exists():
        return set()
    answered: set[str] = set()
    with path.open("rb") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                custom_id = json.loads(line)["custom_id"]
            except (ValueError, KeyError, TypeError):
                custom_id = None
            if not isinstance(custom_id, str):
                # Appending to a file that is not ours could bury someone's data in ours.
                raise ValueError(f"{path}:{line_number}: not a batch result line; not resuming")
            answered.add(custom_id)
    return answered


class ResultWriter:
    """Appends result lines, each with one O_APPEND write and an fsync before it returns."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        pending = memoryview(line.encode("utf-8"))
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
