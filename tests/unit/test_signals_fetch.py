"""A round against a Prometheus that is down or silent fails fast: the law then holds."""

from __future__ import annotations

import socket
import time

from wok_operator.signals import fetch_round, round_queries


def test_a_prometheus_that_accepts_but_never_answers_fails_the_round_within_its_timeout():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes handshakes; nothing ever answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = fetch_round(url, round_queries({60}), timeout_s=0.5)
        elapsed = time.monotonic() - started
    assert result.error is not None and "Timeout" in result.error, result.error
    assert result.vectors == {}
    assert elapsed < 10, f"a silent Prometheus held the round for {elapsed:.1f} s"


def test_a_refused_connection_fails_the_round_without_retries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        result = fetch_round(f"http://127.0.0.1:{port}", round_queries({60}))
    assert result.error is not None and "ConnectionError" in result.error, result.error
