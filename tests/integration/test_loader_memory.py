"""The loader streams: loading builtin:smollm2-135m as bfloat16 (from its float32 checkpoint) in
a fresh process peaks at about the weights once on the host, not the checkpoint plus fused
copies (3.3× the weights before the streaming loader; bench/runtime/results/loader_rss.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "runtime" / "loader_rss.py"


def test_loading_holds_no_second_copy_of_the_weights():
    argv = [sys.executable, str(BENCH), "--json", "--dtype", "bfloat16"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    r = json.loads(done.stdout.strip().splitlines()[-1])
    extra = r["peak_rss"] - r["baseline_rss"]
    # On the CPU the weights stay on the host: one copy, plus the largest tensor in flight.
    assert extra < 1.6 * r["weights_bytes"], r
