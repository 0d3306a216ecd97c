"""What a client may make the server hold: the size of a request body (by default what the
served context can hold, `body_limit`), the bytes of all bodies in flight together, and the
time it may take to send its headers and its body.

``RequestLimits`` is ASGI middleware that reads each request body before the application
does: a body declared (``Content-Length``) or found (while it streams in) to be over
``max_request_bytes`` gets a 413 at once, without the rest being read; a body not complete
within ``body_timeout_s`` of its headers gets a 408; both close the connection. Every body
holds its bytes (declared, else as they arrive) against ``max_inflight_bytes``, shared by all
connections, until its answer is sent: one that would pass it gets a 503 with ``Retry-After``
and is not read, so the server's memory is bounded by design (what a body costs while it is
parsed and answered is a small multiple of its size, ``benchmarks/bench_serve_memory.py``).
The body is passed on as one bytes object, not copied. A client that disconnects mid-body
costs one log line. ``header_timeout_protocol`` makes uvicorn's HTTP
protocol close a connection whose request headers are not complete within ``timeout_s`` of
the connection opening (or of the previous response): uvicorn's keep-alive timer stops at
the first byte, so without it a client sending a header line now and then holds a
connection forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
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

INFLIGHT_BODIES = 4
"""Default ``max_inflight_bytes``: this many largest bodies at once, across all connections."""

RETRY_AFTER_S = 1
"""What a 503 for too many bytes in flight asks the client to wait (``Retry-After``)."""


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


@dataclass
class LimitCounters:
    """What the limits hold and refused so far (``/health`` shows them): the bytes of the
    bodies in flight now, and the requests refused as too large (413), too slow (408) and
    over the in-flight bound (503)."""

    inflight_bytes: int = 0
    too_large: int = 0
    too_slow: int = 0
    busy: int = 0


class RequestLimits:
    """ASGI middleware enforcing ``max_request_bytes``, ``body_timeout_s`` and
    ``max_inflight_bytes`` (see the module docstring); ``refusal`` builds the 413, 408 and 503
    answers; ``counters`` (shared with whoever reports them) counts what it holds and refused."""

    def __init__(self, app: Any, *, max_request_bytes: int, body_timeout_s: float, refusal: Refusal,
                 max_inflight_bytes: int | None = None, counters: LimitCounters | None = None) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = body_timeout_s
        self.refusal = refusal
        self.max_inflight_bytes = max_inflight_bytes or INFLIGHT_BODIES * max_request_bytes
        self.counters = counters if counters is not None else LimitCounters()  # one event loop: no lock

    def _reserve(self, size: int) -> bool:
        if size > 0 and self.counters.inflight_bytes + size > self.max_inflight_bytes:
            self.counters.busy += 1
            return False
        self.counters.inflight_bytes += size
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held = 0  # the bytes this request holds against max_inflight_bytes, until it is answered
        try:
            declared = _declared_length(scope)
            if declared is not None and declared > self.max_request_bytes:
                message = f"the request body ({declared} bytes) is over the limit of {self.max_request_bytes} bytes"
                await self._refuse(scope, receive, send, 413, message)
                return
            if declared is not None:
                if not self._reserve(declared):
                    await self._busy(scope, receive, send)
                    return
                held = declared
            chunks: list[bytes] = []
            size = 0
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
                                   scope.get("method"), scope.get("path", ""), size)
                    return
                chunk = message.get("body", b"")
                if chunk:
                    chunks.append(chunk)
                    size += len(chunk)
                if size > self.max_request_bytes:
                    message_text = f"the request body is over the limit of {self.max_request_bytes} bytes"
                    await self._refuse(scope, receive, send, 413, message_text)
                    return
                if size > held:  # chunked, or longer than declared: hold what arrived
                    if not self._reserve(size - held):
                        await self._busy(scope, receive, send)
                        return
                    held = size
                if not message.get("more_body", False):
                    break
            # one copy of the body: a single chunk is passed on as it came (bytes.join of one
            # item returns it), several are joined once and let go
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # after the body: only a disconnect can come

            await self.app(scope, replay, send)
        finally:
            self.counters.inflight_bytes -= held

    async def _busy(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = (f"the server is holding {self.counters.inflight_bytes} bytes of request bodies (at most"
                   f" {self.max_inflight_bytes}); retry in {RETRY_AFTER_S} s")
        await self._refuse(scope, receive, send, 503, message)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        if status == 413:
            self.counters.too_large += 1
        elif status == 408:
            self.counters.too_slow += 1
        response = self.refusal(scope.get("path", ""), status, message)
        response.headers["connection"] = "close"  # the rest of the body is never read
        if status == 503:
            response.headers["retry-after"] = str(RETRY_AFTER_S)
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
