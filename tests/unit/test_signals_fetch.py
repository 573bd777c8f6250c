"""A round against a Prometheus that is down or silent fails fast: the law then holds."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from wok_operator.signals import QUERY_POOL, fetch_round, round_queries


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


class _CountingPrometheus(ThreadingHTTPServer):
    """A local HTTP server that answers every instant query with one sample, slowly, and
    counts how many it holds at once."""

    def __init__(self) -> None:
        self.in_flight = self.most_in_flight = self.answered = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                with server.lock:
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                time.sleep(0.05)
                body = json.dumps(
                    {
                        "status": "success",
                        "data": {
                            "resultType": "vector",
                            "result": [
                                {"metric": {"namespace": "ns", "service": "s"}, "value": [0, "2"]}
                            ],
                        },
                    }
                ).encode()
                with server.lock:
                    server.in_flight -= 1
                    server.answered += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_a_round_runs_its_queries_concurrently_within_the_pool():
    server = _CountingPrometheus()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        queries = round_queries({60}, {3600})
        result = fetch_round(f"http://127.0.0.1:{server.server_address[1]}", queries)
    finally:
        server.shutdown()
        server.server_close()
    assert result.error is None, result.error
    assert set(result.vectors) == set(queries)
    assert all(vector == {("ns", "s"): 2.0} for vector in result.vectors.values())
    assert server.answered == len(queries)
    assert server.most_in_flight == QUERY_POOL
