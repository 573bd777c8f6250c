"""The one quantile every report of wok quotes: nearest-rank, so a P99 is a latency that
occurred, never an interpolation between two requests."""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(values: Sequence[float], q: float = 0.99) -> float:
    """The nearest-rank `q` quantile (q in (0, 1]) of non-empty `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
