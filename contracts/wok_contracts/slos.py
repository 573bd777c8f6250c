"""The latency objectives a service is held to: what the planner sizes for and the reports score."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slos:
    ttft_s: float
    tpot_s: float
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0 and (self.e2e_s is None or self.e2e_s > 0)):
            raise ValueError("SLOs must be > 0 seconds")
