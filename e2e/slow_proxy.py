"""A TCP proxy that holds every chunk a client sends for `delay_s` before passing it on: the real
apiserver behind it, answering as late as a loaded one (TLS passes through untouched, so the
client still verifies the apiserver's certificate)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class SlowProxy:
    def __init__(self, upstream: tuple[str, int], delay_s: float) -> None:
        self.upstream, self.delay_s = upstream, delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closed = False

    def __enter__(self) -> SlowProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, slow: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if slow:
                    time.sleep(self.delay_s)
                sink.sendall(chunk)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
