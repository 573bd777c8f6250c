"""What a run did, from its result records: the end-of-run report (text or --json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Summary:
    total: int  # requests in the input file
    skipped: int  # already answered in the output file before this run
    done: int = 0  # answered 2xx in this run
    failed: int = 0  # answered otherwise in this run (an HTTP error or no answer)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    throttled: int = 0
    retried: int = 0
    elapsed_s: float = 0.0

    def add(self, record: dict[str, Any]) -> None:
        response = record["response"]
        if response is None or not 200 <= response["status_code"] < 300:
            self.failed += 1
            return
        self.done += 1
        body = response["body"]
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict):
            self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.completion_tokens += int(usage.get("completion_tokens") or 0)

    @property
    def completion_tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "completion_tokens_per_s": self.completion_tokens_per_s}

    def text(self) -> str:
        return (
            f"{self.total} requests: {self.done} done, {self.failed} failed, "
            f"{self.skipped} skipped (answered by an earlier run)\n"
            f"{self.prompt_tokens:,} prompt and {self.completion_tokens:,} completion tokens in "
            f"{self.elapsed_s:.1f} s ({self.completion_tokens_per_s:,.1f} completion tokens/s); "
            f"{self.throttled} throttled (429), {self.retried} retries"
        )
