"""What a run did, from its result records: the end-of-run report (text or --json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from wok_batch.results import is_final


@dataclass
class Summary:
    total: int  # requests in the input file
    skipped: int = 0  # answered by an earlier run (2xx or rejected), not sent again
    done: int = 0  # answered 2xx in this run
    #: Refused for the line's own body (a 400, say), in this run or an earlier one: final.
    rejected: int = 0
    #: Failed for a reason outside the line (no answer, 5xx, 429, 404/405): a rerun retries them.
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    throttled: int = 0
    retried: int = 0
    elapsed_s: float = 0.0

    def add_earlier(self, record: dict[str, Any]) -> None:
        """A final record left by an earlier run, which this run skips."""
        self.skipped += 1
        if not _is_success(record):
            self.rejected += 1

    def add(self, record: dict[str, Any]) -> None:
        if not _is_success(record):
            if is_final(record):
                self.rejected += 1
            else:
                self.failed += 1
            return
        self.done += 1
        body = record["response"]["body"]
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict):
            self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.completion_tokens += int(usage.get("completion_tokens") or 0)

    @property
    def completion_tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def exit_code(self) -> int:
        """1 when any line has no 2xx answer, so that a Kubernetes Job shows the run failed."""
        return 1 if self.rejected or self.failed else 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "completion_tokens_per_s": self.completion_tokens_per_s}

    def text(self) -> str:
        return (
            f"{self.total} requests: {self.done} done, {self.skipped} skipped (answered by an "
            f"earlier run), {self.rejected} rejected (a 4xx for the line's own body: final), "
            f"{self.failed} failed (no answer, 5xx, 429, 404/405: a rerun retries them)\n"
            f"{self.prompt_tokens:,} prompt and {self.completion_tokens:,} completion tokens in "
            f"{self.elapsed_s:.1f} s ({self.completion_tokens_per_s:,.1f} completion tokens/s); "
            f"{self.throttled} throttled (429), {self.retried} retries"
        )


def _is_success(record: dict[str, Any]) -> bool:
    response = record["response"]
    return response is not None and 200 <= response["status_code"] < 300
