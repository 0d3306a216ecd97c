"""What a client may make the server hold: the size of a request body (by default what the
served context can hold, `body_limit`), the time it may take to send its headers and its body.

``RequestLimits`` is ASGI middleware that reads each request body before the application
does: a body declared (``Content-Length``) or found (while it streams in) to be over
``max_request_bytes`` gets a 413 at once, without the rest being read; a body not complete
within ``body_timeout_s`` of its headers gets a 408; both close the connection. A client that
disconnects mid-body costs one log line. ``header_timeout_protocol`` makes uvicorn's HTTP
protocol close a connection whose request headers are not complete within ``timeout_s`` of
the connection opening (or of the previous response): uvicorn's keep-alive timer stops at
the first byte, so without it a client sending a header line now and then holds a
connection forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

logger = logging.getLogger("harnessrl.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# (path, HTTP status, message) -> an ASGI response in the path's API error shape
Refusal = Callable[[str, int, str], Any]


BODY_BASE_BYTES = 1 << 20
"""Room a body has beyond its prompt text: JSON structure, tool schemas, pretty-printing."""

JSON_BYTES_PER_TEXT_BYTE = 6
"""The most bytes of JSON one byte of text can take (a control character as ``\\u0001``)."""


def body_limit(context_tokens: int | None, max_token_bytes: int | None, ceiling: int) -> int:
    """Returns the largest request body a prompt that fits ``context_tokens`` can need: each
    token stands for at most ``max_token_bytes`` bytes of text, each byte of text for at most
    `JSON_BYTES_PER_TEXT_BYTE` bytes of JSON, plus `BODY_BASE_BYTES`; never above ``ceiling``
    (and ``ceiling`` when either is unknown)."""
    if not context_tokens or not max_token_bytes:
        return ceiling
    return min(ceiling, BODY_BASE_BYTES + JSON_BYTES_PER_TEXT_BYTE * max_token_bytes * context_tokens)


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RequestLimits:
    """ASGI middleware enforcing ``max_request_bytes`` and ``body_timeout_s`` (see the module
    docstring); ``refusal`` builds the 413 and 408 answers."""

    def __init__(self, app: Any, *, max_request_bytes: int, body_timeout_s: float, refusal: Refusal) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = body_timeout_s
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_request_bytes:
            message = f"the request body ({declared} bytes) is over the limit of {self.max_request_bytes} bytes"
            await self._refuse(scope, receive, send, 413, message)
            return
        body = bytearray()
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), remaining)
            except TimeoutError:
                message_text = f"the request body did not arrive within {self.body_timeout_s:g} s"
                await self._refuse(scope, receive, send, 408, message_text)
                return
            if message["type"] == "http.disconnect":
                logger.warning("client disconnected before sending the whole request body (%s %s, %d bytes received)",
                               scope.get("method"), path, len(body))
                return
            body += message.get("body", b"")
            if len(body) > self.max_request_bytes:
                message_text = f"the request body is over the limit of {self.max_request_bytes} bytes"
                await self._refuse(scope, receive, send, 413, message_text)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: only a disconnect can come

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        response = self.refusal(scope.get("path", ""), status, message)
        response.headers["connection"] = "close"  # the rest of the body is never read
        await response(scope, receive, send)


def header_timeout_protocol(base: type, timeout_s: float) -> type:
    """Returns a subclass of uvicorn's HTTP protocol ``base`` (the h11 or httptools one) that
    closes a connection whose next request's headers are not complete within ``timeout_s``.

    Both protocols make a new ``cycle`` when a request's headers are complete and call
    ``on_response_complete`` when a response is sent: a deadline armed at the connection's
    start, or after a response, passes harmlessly once ``cycle`` has changed.
    """

    class HeaderTimeoutProtocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def _arm_header_deadline(self) -> None:
            self.loop.call_later(timeout_s, self._header_deadline_passed, self.cycle)

        def _header_deadline_passed(self, cycle: Any) -> None:
            if self.cycle is cycle and self.transport is not None and not self.transport.is_closing():
                logger.warning("closed a connection whose request headers did not arrive within %g s", timeout_s)
                self.transport.close()

    HeaderTimeoutProtocol.__name__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol
