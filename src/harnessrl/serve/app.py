"""The FastAPI application: OpenAI Chat Completions and Responses and Anthropic Messages over
one Policy, each at ``/v1/...`` and at ``/s/{session}/v1/...``.

``session`` (the path segment, else the ``X-Harnessrl-Session`` header) names the client
conversation for recording; unnamed requests are grouped by message prefix (see
``serve/recorder.py``). Any API key is accepted unless a key is set (``serve/auth.py``: the
operator's, which may name any session, and session keys, each held to its own session: another
session gets a 403); then it must come as ``Authorization: Bearer <key>`` or ``x-api-key:
<key>``, and ``/health`` without one says only that the server is up. Every error, including malformed
JSON, unknown routes and unexpected exceptions, has the error shape of the route's API:
OpenAI ``{"error": {"message", "type", "param", "code"}}``, Anthropic ``{"type": "error",
"error": {"type", "message"}}``. Unknown fields and headers are ignored. A body over
``max_request_bytes`` gets a 413 before it is read in full, one that does not arrive within
``body_timeout_s`` a 408 (see ``serve/limits.py``); one holding a lone UTF-16 surrogate a 400.
A client that disconnects before its answer is ready gives the request up: it is skipped if
still queued and stopped at its next token if sampling (``PendingCompletion.abandon``;
``/health`` counts both), and the handler ends with a 499 that nobody reads.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from harnessrl.policy.base import Policy
from harnessrl.serve import anthropic_messages, fields, openai_chat, openai_responses
from harnessrl.serve.auth import Credentials, Refused
from harnessrl.serve.engine import (
    CompletionSet,
    ContextOverflow,
    InvalidRequest,
    ParsedRequest,
    PendingCompletion,
    PolicyFailure,
    ServeEngine,
    new_id,
)
from harnessrl.serve.limits import LimitCounters, RequestLimits, body_limit
from harnessrl.serve.recorder import ConversationRecorder

logger = logging.getLogger("harnessrl.serve")

SESSION_HEADER = "x-harnessrl-session"
OPENAI, ANTHROPIC = "openai", "anthropic"


class ClientGone(Exception):
    """The client disconnected before its answer was ready (answered with a 499 nobody reads)."""


class ApiError(Exception):
    """An error answer: HTTP status, error type, message, and the OpenAI ``param``/``code``."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param, self.code = status, kind, message, param, code


def family_of(path: str) -> str:
    """Returns which API's error shape a path answers in."""
    return ANTHROPIC if "/v1/messages" in path else OPENAI


def given_keys(request: Request) -> tuple[str, str]:
    """Returns the keys a request shows: ``x-api-key`` and ``Authorization: Bearer``."""
    authorization = request.headers.get("authorization") or ""
    bearer = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
    return request.headers.get("x-api-key") or "", bearer


def error_response(family: str, error: ApiError) -> JSONResponse:
    """Returns ``error`` in the shape of ``family``."""
    if family == ANTHROPIC:
        body: dict[str, Any] = {"type": "error", "error": {"type": error.kind, "message": error.message}}
    else:
        body = {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}
    return JSONResponse(body, status_code=error.status)


_STATUS_KINDS = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
}
MAX_REQUEST_BYTES = 16 << 20  # far above an agent's largest context, far below what hurts the host
BODY_TIMEOUT_S = 60.0


def create_app(
    policy: Policy,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    credentials: Credentials | None = None,
    recorder: ConversationRecorder | None = None,
    default_max_tokens: int = 1024,
    max_output_tokens: int | None = None,
    context_length: int | None = None,
    max_batch_size: int = 64,
    stream_keepalive_s: float = 5.0,
    max_request_bytes: int | None = None,
    max_inflight_bytes: int | None = None,
    body_timeout_s: float = BODY_TIMEOUT_S,
    continuous_batching: bool | None = None,
) -> FastAPI:
    """Returns the server application over ``policy``.

    ``model_name`` is the id ``/v1/models`` lists and responses carry (default: the policy's
    name); ``api_key`` is the operator's key, or ``credentials`` holds it and the session keys
    (``serve/auth.py``; give one or neither); ``recorder`` keeps every exchange; ``default_max_tokens`` applies when a request
    names no output limit, ``max_output_tokens`` caps every request, ``context_length``
    overrides the policy's context window; at most ``max_batch_size`` requests share one
    ``policy.generate`` call; a stream sends a keep-alive every ``stream_keepalive_s`` while
    the policy works; a request body may hold at most ``max_request_bytes`` (default: what
    the served context can hold, ``limits.body_limit``, at most ``MAX_REQUEST_BYTES``) and
    must arrive within ``body_timeout_s``; all bodies in flight together at most
    ``max_inflight_bytes`` (default ``limits.INFLIGHT_BODIES`` largest bodies: beyond, a 503);
    ``continuous_batching`` (None: wherever the policy can, ``HFPolicy``) lets a request join the
    decode batch that is running at its next step (``serve/engine.py:PolicyBatcher``).
    """
    engine = ServeEngine(
        policy, recorder=recorder, context_length=context_length, default_max_tokens=default_max_tokens,
        max_output_tokens=max_output_tokens, max_batch_size=max_batch_size, continuous_batching=continuous_batching,
    )
    if credentials is not None and api_key is not None:
        raise ValueError("create_app takes api_key or credentials (which holds the operator key), not both")
    credentials = credentials or Credentials(api_key)
    model = model_name or getattr(policy, "name", "policy")
    created = int(time.time())
    app = FastAPI(title="harnessrl serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    app.state.recorder = recorder
    app.state.model_name = model
    app.state.credentials = credentials
    app.router.add_event_handler("shutdown", engine.close)

    def refusal(path: str, status: int, message: str) -> JSONResponse:
        return error_response(family_of(path), ApiError(status, _STATUS_KINDS[status], message))

    if max_request_bytes is None:
        max_request_bytes = body_limit(engine.context_length, engine.max_token_bytes(), MAX_REQUEST_BYTES)
    app.state.max_request_bytes = max_request_bytes
    app.state.limits = LimitCounters()
    app.add_middleware(RequestLimits, max_request_bytes=max_request_bytes, body_timeout_s=body_timeout_s, refusal=refusal,
                       max_inflight_bytes=max_inflight_bytes, counters=app.state.limits)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = _STATUS_KINDS.get(exc.status_code, "invalid_request_error")
        message = str(exc.detail) if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
        return error_response(family_of(request.url.path), ApiError(exc.status_code, kind, message))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(family_of(request.url.path), ApiError(400, "invalid_request_error", str(exc)[:500]))

    def check_key(request: Request) -> None:
        """Resolves the request's session (``request.state.session``) from its key and the
        session it names (see ``serve/auth.py``), or raises the 401/403."""
        named = request.path_params.get("session") or request.headers.get(SESSION_HEADER) or None
        try:
            request.state.session = credentials.authorize(given_keys(request), named)
        except Refused as exc:
            # OpenAI calls a wrong key an invalid request; Anthropic an authentication error.
            anthropic = family_of(request.url.path) == ANTHROPIC
            kind = ("authentication_error" if anthropic else "invalid_request_error") if exc.status == 401 \
                else "permission_error"
            raise ApiError(exc.status, kind, exc.message, code="invalid_api_key" if exc.status == 401 else None) from None

    async def read_body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise ApiError(400, "invalid_request_error", "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request_error", "the request body must be a JSON object")
        fields.reject_surrogates(body, raw=raw)
        return body

    async def start(request: Request, parsed: ParsedRequest) -> PendingCompletion:
        """Queues ``parsed`` and watches its connection until the answer is ready: a client
        that disconnects first abandons the request (skipped if queued, stopped if sampling)."""
        pending = await engine.start(parsed, session=request.state.session)

        async def until_gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass  # after the body only a disconnect comes; anything else is skipped
            pending.abandon()

        watcher = asyncio.ensure_future(until_gone())
        pending.task.add_done_callback(lambda _: watcher.cancel())
        return pending

    async def answer(pending: PendingCompletion) -> CompletionSet:
        """Returns the finished request's completions (``ClientGone`` if it was abandoned)."""
        try:
            return await pending.task
        except asyncio.CancelledError:
            if pending.gone.is_set():
                raise ClientGone() from None
            raise

    Handler = Callable[[Request], Awaitable[Response]]

    def api_route(handler: Callable[[Request], Awaitable[Response]]) -> Handler:
        """Wraps a handler so that every failure becomes an error of the route's API."""

        async def wrapped(request: Request) -> Response:
            family = family_of(request.url.path)
            try:
                check_key(request)
                return await handler(request)
            except ClientGone:
                return Response(status_code=499)
            except ApiError as exc:
                return error_response(family, exc)
            except InvalidRequest as exc:
                return error_response(family, ApiError(400, "invalid_request_error", exc.message, exc.param))
            except ContextOverflow as exc:
                return error_response(family, overflow_error(family, request.url.path, exc))
            except PolicyFailure as exc:
                return error_response(family, ApiError(500, "api_error" if family == ANTHROPIC else "server_error", str(exc)))
            except Exception as exc:  # never a bare 500 page
                logger.exception("unexpected error on %s", request.url.path)
                kind = "api_error" if family == ANTHROPIC else "server_error"
                return error_response(family, ApiError(500, kind, f"internal error: {type(exc).__name__}"))

        wrapped.__name__ = handler.__name__
        return wrapped

    def sse(
        pending: PendingCompletion,
        parsed: ParsedRequest,
        head: list[str],
        delta: Callable[[int, str], Iterator[str]],
        rest: Callable[[CompletionSet, list[str]], Iterator[str]],
        keepalive: str,
        failed: Callable[[str], str],
    ) -> StreamingResponse:
        """Returns a stream that sends ``head`` at once, then ``delta(choice, text)`` for each
        piece of text that became final while the policy samples (see ``serve/streaming.py``),
        ``keepalive`` whenever ``stream_keepalive_s`` passed with nothing to send, and at the
        end ``rest(result, sent)`` (or ``failed(message)`` when the policy failed): a slow
        model never leaves a client waiting on a silent connection."""

        async def events() -> AsyncIterator[str]:
            try:
                async for event in stream():
                    yield event
            finally:  # the response ended before the answer (the client went away): give it up
                pending.abandon()

        async def stream() -> AsyncIterator[str]:
            for event in head:
                yield event
            texts = [engine.streamed_text(parsed) for _ in range(parsed.n)]
            tokens = pending.tokens
            while not pending.task.done():
                getter = asyncio.ensure_future(tokens.get()) if tokens is not None else None
                waiting = {pending.task} if getter is None else {pending.task, getter}
                await asyncio.wait(waiting, timeout=stream_keepalive_s, return_when=asyncio.FIRST_COMPLETED)
                if getter is None or not getter.done():
                    if getter is not None:
                        getter.cancel()
                    if not pending.task.done():
                        yield keepalive
                    continue
                arrived = [getter.result()]
                while not tokens.empty():  # everything sampled since: one decode per choice
                    arrived.append(tokens.get_nowait())
                by_choice: dict[int, list[int]] = {}
                for choice, ids in arrived:
                    by_choice.setdefault(choice, []).extend(ids)
                for choice, ids in sorted(by_choice.items()):
                    text = texts[choice].add(ids)
                    if text:
                        for event in delta(choice, text):
                            yield event
            try:
                result = pending.task.result()
            except asyncio.CancelledError:  # abandoned: the client is gone
                return
            except PolicyFailure as exc:
                yield failed(str(exc))
                return
            for event in rest(result, [text.sent for text in texts]):
                yield event

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # ------------------------------------------------------------ OpenAI
    def model_card() -> dict[str, Any]:
        # OpenAI's fields plus Anthropic's (type, display_name, created_at): one card for both.
        return {
            "id": model, "object": "model", "created": created, "owned_by": "harnessrl",
            "type": "model", "display_name": model,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        }

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()], "has_more": False, "first_id": model, "last_id": model})

    async def get_model(request: Request) -> Response:
        return JSONResponse(model_card())

    async def chat_completions(request: Request) -> Response:
        parsed = openai_chat.parse_chat_request(await read_body(request))
        pending = await start(request, parsed)
        if parsed.stream:
            chat = openai_chat.ChatStream(parsed, model)
            return sse(pending, parsed, [], chat.delta, chat.rest, openai_chat.KEEPALIVE, openai_chat.stream_error)
        result = await answer(pending)
        return JSONResponse(openai_chat.chat_response(result, parsed, model, engine.renderer.decode))

    # ------------------------------------------------------------ OpenAI Responses
    store = openai_responses.ResponseStore()
    app.state.response_store = store

    async def responses(request: Request) -> Response:
        parsed = openai_responses.parse_responses_request(await read_body(request), store)
        pending = await start(request, parsed)
        skeleton = openai_responses.response_skeleton(parsed, model, new_id("resp_"))
        if parsed.stream:
            events = openai_responses.ResponseEvents()

            def rest(result: CompletionSet, sent: list[str]) -> Iterator[str]:
                return events.rest(openai_responses.response_object(result, parsed, model, store, skeleton), sent[0])

            failed = functools.partial(events.failed, skeleton)
            return sse(pending, parsed, events.start(skeleton), events.delta, rest, openai_chat.KEEPALIVE, failed)
        result = await answer(pending)
        return JSONResponse(openai_responses.response_object(result, parsed, model, store, skeleton))

    # ------------------------------------------------------------ Anthropic Messages
    async def messages(request: Request) -> Response:
        parsed = anthropic_messages.parse_messages_request(await read_body(request))
        pending = await start(request, parsed)
        message_id = new_id("msg_")
        if parsed.stream:
            head = anthropic_messages.message_stream_start(message_id, model, pending.prompt_tokens)
            blocks = anthropic_messages.MessageStream()
            return sse(pending, parsed, head, blocks.delta, blocks.rest, anthropic_messages.PING,
                       anthropic_messages.stream_error)
        result = await answer(pending)
        return JSONResponse(anthropic_messages.message_response(result, model, message_id))

    async def count_tokens(request: Request) -> Response:
        parsed = anthropic_messages.parse_messages_request(await read_body(request), count_only=True)
        return JSONResponse({"input_tokens": await asyncio.to_thread(engine.count_tokens, parsed)})

    routes: list[tuple[str, Handler, str]] = [
        ("/v1/models", list_models, "GET"),
        ("/v1/models/{model_id:path}", get_model, "GET"),
        ("/v1/chat/completions", chat_completions, "POST"),
        ("/v1/responses", responses, "POST"),
        ("/v1/messages", messages, "POST"),
        ("/v1/messages/count_tokens", count_tokens, "POST"),
    ]
    for path, handler, method in routes:
        for prefix in ("", "/s/{session}"):
            app.add_api_route(prefix + path, api_route(handler), methods=[method], include_in_schema=False)

    @app.get("/health", include_in_schema=False)
    async def health(request: Request) -> dict[str, Any]:
        # With keys in force, the counters (which tell one client about others) need a key.
        if not credentials.holder(given_keys(request))[0]:
            return {"status": "ok"}
        return {"status": "ok", "model": model, "batches": engine.batcher.batches, "requests": engine.batcher.requests,
                "undeclared_tool_calls": engine.undeclared_tool_calls, "queued_requests": engine.batcher.queued,
                "abandoned_requests": engine.abandoned,
                "aborted_generations": engine.batcher.aborted, "inflight_bytes": app.state.limits.inflight_bytes,
                "refused": {"too_large": app.state.limits.too_large, "too_slow": app.state.limits.too_slow,
                            "busy": app.state.limits.busy}}

    return app


def overflow_error(family: str, path: str, exc: ContextOverflow) -> ApiError:
    """Returns each API's error for a prompt over the context window."""
    count = f"at least {exc.prompt_tokens}" if exc.at_least else str(exc.prompt_tokens)
    if family == ANTHROPIC:
        return ApiError(400, "invalid_request_error", f"prompt is too long: {count} tokens > {exc.limit} maximum")
    param = "input" if path.endswith("/responses") else "messages"
    message = (
        f"This model's maximum context length is {exc.limit} tokens. However, your messages resulted in "
        f"{count} tokens. Please reduce the length of the messages."
    )
    return ApiError(400, "invalid_request_error", message, param, "context_length_exceeded")
