"""What one HTTP connection may cost the server: the body's size and the time to send a request.

Why a module of its own: uvicorn bounds neither. A body over the limit is answered 413, and one
that takes longer than `body_timeout_s` to arrive 408 (`BodyLimits`, ASGI middleware); headers
that take longer than `header_timeout_s` close the connection (`protocol_with_header_timeout`, a
subclass of uvicorn's h11 protocol: nothing reaches the app before the headers are complete).
Without them a client that sends half a request holds its connection, and its memory, forever
(nginx's `client_header_timeout` and `client_body_timeout`, Node's `headersTimeout` and
`requestTimeout` do the same).

A 413 is sent only once the body has been read (and dropped, up to `MAX_DISCARD_BYTES`): a client
that sends `Connection: close` (Python's urllib and http.client) writes its whole body before it
reads, and a server that closes on unread data makes the kernel answer with a reset, so such a
client never saw the status.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

#: The most of a refused body that is read and dropped before answering 413; past it the
#: connection is answered and closed at once (a client sending more is not waiting to read).
MAX_DISCARD_BYTES = 64 * 1024 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
_CLOSE = {"Connection": "close"}


class BodyLimits:
    """Answers 413 to a body over `max_bytes` (after reading it, bounded, so the client reads
    the answer) and 408 to one not received within `timeout_s` of its headers."""

    def __init__(self, app: Any, max_bytes: int, timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    def too_large(self) -> StarletteHTTPException:
        return StarletteHTTPException(
            413,
            f"the request body is larger than this server's limit of {self.max_bytes} bytes "
            "(wok runtime serve --max-request-bytes)",
            headers=_CLOSE,
        )

    def too_slow(self) -> StarletteHTTPException:
        return StarletteHTTPException(
            408,
            f"the request body did not arrive within {self.timeout_s:g} s "
            "(wok runtime serve --body-timeout)",
            headers=_CLOSE,
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        more = True  # the body has not all arrived
        seen = 0

        async def body_part() -> Any:
            nonlocal more
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise self.too_slow() from None
            more = message["type"] == "http.request" and message.get("more_body", False)
            return message

        async def discard_rest() -> None:
            """Reads what the client still sends, bounded in bytes and time."""
            dropped = seen
            while more and dropped <= MAX_DISCARD_BYTES:
                message = await body_part()
                dropped += len(message.get("body", b""))

        async def limited_receive() -> Any:
            nonlocal seen
            if not more:  # the body is in: what comes now is the disconnect, whenever it comes
                return await receive()
            message = await body_part()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                await discard_rest()
                raise self.too_large()  # FastAPI's handler answers an HTTPException
            return message

        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isascii() and length.isdigit() and int(length) > self.max_bytes:
            from wok_runtime.http.server import APIError

            try:
                if int(length) <= MAX_DISCARD_BYTES:
                    await discard_rest()
                error = self.too_large()
            except StarletteHTTPException as timed_out:
                error = timed_out
            answer = APIError(
                error.status_code,
                str(error.detail),
                code="request_too_large" if error.status_code == 413 else "request_timeout",
                headers=_CLOSE,
            )
            await answer.response()(scope, receive, send)
            return
        await self.app(scope, limited_receive, send)


def protocol_with_header_timeout(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers have not all arrived
    within `timeout_s` of the connection (or, on a kept-alive one, of the request's first byte).
    A client that sent part of a request gets a 408 first."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0

        def _awaiting_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_bytes = 0
                self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._awaiting_headers():
                self._arm()  # a kept-alive connection's next request begins
                self._header_bytes += len(data)
            super().data_received(data)
            if not self._awaiting_headers():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # The keep-alive timeout now bounds the idle wait for the next request.
            self._disarm()

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or not self._awaiting_headers():
                return
            if self._header_bytes:
                self.transport.write(
                    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
                    b"Content-Length: 0\r\n\r\n"
                )
            self.transport.close()

    return HeaderTimeoutProtocol
