"""A stand-in workload for backed-pod tests: stdlib HTTP on the pod IP, /metrics, /readyz, and an
admin endpoint guarded by a token read from a file (a Secret volume), like wok's runtime.

/readyz answers 503 until an authorized POST /admin/ready, so tests can watch Ready follow the
real probe. Usage: podserver.py --host IP --port N --token-file PATH --name NAME
"""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    token = Path(args.token_file).read_text().strip()
    state = {"ready": False, "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            state["requests"] += 1
            if self.path == "/metrics":
                self._reply(
                    200,
                    f'wok_test_up{{served_by="{args.name}"}} 1\n'
                    f"wok_test_requests_total {state['requests']}\n",
                )
            elif self.path == "/readyz":
                self._reply(200 if state["ready"] else 503, "ok\n" if state["ready"] else "no\n")
            else:
                self._reply(404, "not found\n")

        def do_POST(self) -> None:
            if self.path != "/admin/ready":
                self._reply(404, "not found\n")
            elif self.headers.get("Authorization") != f"Bearer {token}":
                self._reply(401, "unauthorized\n")
            else:
                state["ready"] = True
                self._reply(200, "ready\n")

        def log_message(self, format: str, *rest: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
