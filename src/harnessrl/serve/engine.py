"""The API-independent core of the server: request -> prompt ids -> policy batch -> completion.

``PolicyBatcher`` owns the policy: one worker thread calls ``policy.generate`` (policies are
not thread-safe), gathering every request that arrived while the previous batch ran into the
next batch, so parallel agents share forward passes (every batch runs
``policy.generate_stream``, which hands a stream its ids as they are sampled). With a policy
that batches continuously (``HFPolicy``: ``policy/continuous.py``) the worker instead keeps one
decode batch going while requests are waiting or running: a request joins it at the next decode
step rather than after the batch in progress, as in vLLM; the decoder (and the policy's lock) is
let go whenever nothing is running, so a weight sync can come between requests. A request
whose client went away (``PendingCompletion.abandon``: the app watches every connection) is
skipped if still queued and, if already sampling, ended at its next token (``abort``) while
the rest of its batch goes on, as vLLM aborts the requests of a closed connection. Closing the
batcher ends the generation in progress at its next sampled token: a worker thread still
inside the model when the interpreter exits is aborted mid C++ call (``terminate called
without an active exception``). ``ServeEngine.complete`` renders a
parsed request, checks it against the context window, clamps its output length, waits for
the batch without blocking the event loop, applies stop strings, parses tool calls, and
records the exchange.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import json
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from harnessrl.harness.chat import RenderedPrompt
from harnessrl.harness.tools.tool_call import TOOL_CALL_OPEN, parse_completion
from harnessrl.policy.base import Generation, GenerationRequest, Policy, SamplingParams
from harnessrl.serve.context import ServeContext
from harnessrl.serve.prompt import PromptRenderer
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.streaming import StreamedText

T = TypeVar("T")
logger = logging.getLogger("harnessrl.serve")

# Requests with less message text than this are rendered on the event loop (a thread hop
# costs more than rendering them; earlier messages' ids are cached by the tokenizer).
INLINE_RENDER_CHARS = 20_000


class InvalidRequest(Exception):
    """The request body is malformed; ``param`` names the field (an HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


# A prompt whose text is over LENGTH_MARGIN * max_token_bytes characters per context token is
# refused before it is rendered (the margin covers a normalizer composing characters).
LENGTH_MARGIN = 4


class ContextOverflow(Exception):
    """The rendered prompt does not fit the context window (each API has its own error);
    ``at_least``: the prompt was refused for its length before it was tokenized, and
    ``prompt_tokens`` is a lower bound."""

    def __init__(self, prompt_tokens: int, limit: int, at_least: bool = False) -> None:
        count = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        super().__init__(f"prompt of {count} tokens does not fit the context of {limit} tokens")
        self.prompt_tokens, self.limit, self.at_least = prompt_tokens, limit, at_least


class PolicyFailure(Exception):
    """The policy returned an error generation (an HTTP 500)."""


class BatcherClosed(Exception):
    """Raised from the token sink of a generation that a closing batcher ends early."""


@dataclass
class ParsedRequest:
    """One API request in API-independent form (messages and tools normalized, see
    ``context``). ``max_tokens`` None means the server default; ``stop`` holds stop strings."""

    api: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    stream: bool = False
    raw: dict[str, Any] = field(default_factory=dict)
    # the start of the answer, given by the client (an Anthropic final assistant message)
    prefill: str = ""
    # the tool ``tool_choice`` forces: None (none forced), "" (any declared tool) or a name
    forced_tool: str | None = None
    # what one API carries from parsing to its response (e.g. the Responses API's custom tools)
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class Completion:
    """One sampled answer: the ids and log-probs (cut after a stop string), the text they
    decode to, and the text and tool calls parsed from it. ``finish_reason`` is ``stop``
    (end of message), ``stop_sequence`` (a stop string; ``stop_sequence`` says which),
    ``length`` (output limit) or ``tool_calls``."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    content: str
    tool_calls: list[dict[str, Any]]
    stop_sequence: str | None = None


@dataclass
class CompletionSet:
    """The answers to one request, with the prompt's token count and conversation."""

    session: str | None
    prompt_tokens: int
    choices: list[Completion]

    @property
    def completion_tokens(self) -> int:
        return sum(len(choice.token_ids) for choice in self.choices)


@dataclass
class PendingCompletion:
    """A request that is queued: its conversation, prompt size, the task that finishes it
    (its result is the ``CompletionSet``; it raises ``PolicyFailure``) and, for a stream,
    the queue its sampled ids arrive on while the policy works."""

    session: str | None
    prompt_tokens: int
    task: asyncio.Future[CompletionSet]
    # a streamed request's sampled ids as the policy hands them over: (choice index, ids)
    tokens: asyncio.Queue[tuple[int, list[int]]] | None = None
    # set when the client went away: the batcher then skips or ends its generations
    gone: threading.Event = field(default_factory=threading.Event)
    on_abandon: Callable[[], None] | None = None

    def abandon(self) -> None:
        """Gives the request up (its client disconnected): queued generations are skipped,
        running ones end at their next token, and ``task`` is cancelled. Once ``task`` is
        done this does nothing."""
        if self.task.done() or self.gone.is_set():
            return
        self.gone.set()
        self.task.cancel()
        if self.on_abandon is not None:
            self.on_abandon()


def new_id(prefix: str) -> str:
    """Returns a fresh id like ``call_3f2a...`` (24 hex digits)."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


# one queued request: the request, the future of its generation, who hears its tokens, and
# whether its client is gone
_Queued = tuple[
    GenerationRequest, "concurrent.futures.Future[Generation]", "Callable[[Sequence[int]], None] | None",
    "Callable[[], bool] | None",
]


class PolicyBatcher:
    """Runs the policy on one worker thread; concurrent requests share a batch. ``continuous``
    (None: wherever the policy has ``continuous()``) keeps one decode batch that requests join
    between steps (module docstring)."""

    def __init__(self, policy: Policy, max_batch_size: int = 64, continuous: bool | None = None) -> None:
        supported = bool(getattr(policy, "supports_continuous", False))
        if continuous and not supported:
            raise ValueError(f"policy {policy.name} does not batch continuously (it has no continuous())")
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.continuous = supported if continuous is None else continuous
        self._queue: queue.Queue[_Queued | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()  # the running worker's: set when it is to stop
        self._start_lock = threading.Lock()
        self.batches = 0  # how many generate calls ran (continuous: how many times a decoder opened)
        self.requests = 0  # how many requests they held
        self.aborted = 0  # how many of those ended early because their client was gone
        self._decoder: Any = None  # continuous: the open decoder (its waiting requests count as queued)

    def submit(
        self, request: GenerationRequest, on_tokens: Callable[[Sequence[int]], None] | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> concurrent.futures.Future[Generation]:
        """Queues one request (starting the worker if it is not running); returns the future
        of its generation. ``on_tokens`` (called on the worker thread) receives its ids as the
        policy samples them (``Policy.generate_stream``); once ``gone()`` is true the request
        is skipped, or ended at its next token if it is running."""
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._closing = threading.Event()
                self._thread = threading.Thread(target=self._work, args=(self._closing,),
                                                name="harnessrl-serve-policy", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        self._queue.put((request, future, on_tokens, gone))
        return future

    @property
    def queued(self) -> int:
        """How many requests wait for the next batch (skipped ones included until reached);
        continuous: also those in the open decoder waiting for a free row."""
        decoder = self._decoder
        return self._queue.qsize() + (decoder.queued if decoder is not None else 0)

    def close(self) -> None:
        """Stops the worker: the generation in progress ends at its next sampled token and
        queued requests fail (their clients went with the server); a later ``submit`` starts
        a new worker."""
        with self._start_lock:
            thread, self._thread = self._thread, None
            closing = self._closing
        if thread is not None and thread.is_alive():
            closing.set()
            self._queue.put(None)
            thread.join(timeout=30)
            if thread.is_alive():
                logger.warning("the policy worker did not stop within 30 s of closing")

    def _work(self, closing: threading.Event) -> None:
        if self.continuous:
            self._work_continuously(closing)
            return
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            stop = False
            while len(batch) < self.max_batch_size:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            self._run(batch, closing)
            if stop:
                return

    def _work_continuously(self, closing: threading.Event) -> None:
        """The worker with a continuously batching policy: while requests wait or run, one
        decoder runs step by step and takes in whatever arrived before each step; while none
        do, nothing holds the policy."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            self.batches += 1
            with self.policy.continuous() as decoder:  # type: ignore[attr-defined]  # continuous
                self._decoder = decoder
                try:
                    if self._decode(decoder, item, closing):
                        return
                finally:
                    self._decoder = None

    def _decode(self, decoder: Any, first: _Queued, closing: threading.Event) -> bool:
        """Runs ``decoder`` from request ``first`` until nothing is queued or running, or the
        batcher closes (every request it holds then fails); returns True when it took the
        closing marker off the queue (the worker then stops)."""
        futures: dict[int, concurrent.futures.Future[Generation]] = {}
        keys = itertools.count()

        def fail(message: str) -> None:
            for future in futures.values():
                future.set_exception(PolicyFailure(message))

        arrived: list[_Queued] = [first]
        while True:
            for request, future, on_tokens, gone in arrived:
                if not future.set_running_or_notify_cancel():  # given up while queued
                    continue
                if closing.is_set():
                    future.set_exception(PolicyFailure("the server closed before this request ran"))
                    continue
                futures[key := next(keys)] = future
                self.requests += 1
                decoder.add(key, request, self._sink(on_tokens, gone))
            arrived = []
            while True:  # whatever arrived since the last step joins before the next
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:  # the closing marker
                    fail("the server closed during this generation")
                    return True
                arrived.append(item)
            if arrived:
                continue
            if closing.is_set():
                fail("the server closed during this generation")
                return False
            if not decoder.running and not decoder.queued:
                return False
            for key, generation in decoder.step():
                self.aborted += generation.finish_reason == "abort"
                futures.pop(key).set_result(generation)

    @staticmethod
    def _sink(on_tokens: Callable[[Sequence[int]], None] | None, gone: Callable[[], bool] | None
              ) -> Callable[[Sequence[int]], bool | None]:
        """Returns what hears a request's tokens in the decoder: False once its client is gone."""
        def sink(ids: Sequence[int]) -> bool | None:
            if gone is not None and gone():
                return False
            if on_tokens is not None and ids:  # no ids: the decoder asks whether to admit it
                on_tokens(ids)
            return None
        return sink

    def _run(self, batch: list[_Queued], closing: threading.Event) -> None:
        # A request whose caller gave up (its future was cancelled) is not run; the others'
        # futures can no longer be cancelled, so setting their results cannot fail.
        batch = [item for item in batch if item[1].set_running_or_notify_cancel()]
        if not batch:
            return
        if closing.is_set():
            for _, future, _, _ in batch:
                future.set_exception(PolicyFailure("the server closed before this request ran"))
            return
        self.batches += 1
        self.requests += len(batch)
        requests = [request for request, _, _, _ in batch]
        listeners = [on_tokens for _, _, on_tokens, _ in batch]
        gone = [is_gone for _, _, _, is_gone in batch]
        ended: set[int] = set()

        def dispatch(index: int, ids: Sequence[int]) -> bool | None:
            if closing.is_set():
                raise BatcherClosed("the server closed during this generation")
            if gone[index] is not None and gone[index]():
                if index not in ended:
                    ended.add(index)
                    self.aborted += 1
                return False  # the policy ends this request; its batch goes on
            listener = listeners[index]
            if listener is not None:
                listener(ids)
            return None

        try:
            generations = self.policy.generate_stream(requests, dispatch)
            if len(generations) != len(batch):
                raise RuntimeError(f"the policy returned {len(generations)} generations for {len(batch)} requests")
        except Exception as exc:  # a failing batch fails its requests, not the server
            for _, future, _, _ in batch:
                future.set_exception(PolicyFailure(f"generation failed: {type(exc).__name__}: {exc}"))
            return
        for (_, future, _, _), generation in zip(batch, generations, strict=True):
            future.set_result(generation)


class ServeEngine:
    """Turns parsed requests into completions with one policy (see the module docstring).

    ``context_length`` defaults to the policy's (``policy.context_length``; None: no limit);
    ``max_output_tokens`` caps every request; ``default_max_tokens`` is used when a request
    names no limit; ``continuous_batching`` (None: wherever the policy can) lets requests join a
    running decode batch (``PolicyBatcher``).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        recorder: ConversationRecorder | None = None,
        context_length: int | None = None,
        default_max_tokens: int = 1024,
        max_output_tokens: int | None = None,
        max_batch_size: int = 64,
        continuous_batching: bool | None = None,
    ) -> None:
        self.policy = policy
        self.renderer = PromptRenderer(policy.tokenizer)
        self.stop_token_ids = tuple(policy.tokenizer.stop_token_ids)
        self.recorder = recorder
        self.context_length = context_length or getattr(policy, "context_length", None)
        self.default_max_tokens = default_max_tokens
        self.max_output_tokens = max_output_tokens
        self.batcher = PolicyBatcher(policy, max_batch_size=max_batch_size, continuous=continuous_batching)
        self.undeclared_tool_calls = 0  # completions whose calls named no declared tool
        self.abandoned = 0  # requests whose client went away before the answer
        # per named session, the last prompt refused for the context: (prompt tokens, context)
        self.context_overflows: dict[str, tuple[int, int]] = {}

    def close(self) -> None:
        self.batcher.close()

    def count_tokens(self, request: ParsedRequest) -> int:
        """Returns the number of prompt tokens ``request`` renders to."""
        return len(self.renderer.render(request.messages, request.tools, request.prefill))

    def max_token_bytes(self) -> int | None:
        """Returns the tokenizer's bound on the text bytes of one token (None: unknown)."""
        bound = getattr(self.renderer.tokenizer, "max_token_bytes", None)
        return bound() if callable(bound) else None

    def refuse_by_length(self, chars: int) -> None:
        """Raises ``ContextOverflow`` (``at_least``) for a prompt of ``chars`` characters of
        message text that cannot fit the context whatever its tokens, before any tokenizing."""
        bound = self.max_token_bytes()
        if self.context_length is None or not bound:
            return
        floor = chars // (LENGTH_MARGIN * bound)
        if floor >= self.context_length:
            raise ContextOverflow(floor, self.context_length, at_least=True)

    def output_budget(self, requested: int | None, prompt_tokens: int) -> int:
        """Returns how many tokens may be sampled: the request's limit (or the default),
        clamped to the server's cap and to the room left in the context window."""
        budget = requested if requested is not None else self.default_max_tokens
        if self.max_output_tokens is not None:
            budget = min(budget, self.max_output_tokens)
        if self.context_length is not None:
            if prompt_tokens >= self.context_length:
                raise ContextOverflow(prompt_tokens, self.context_length)
            budget = min(budget, self.context_length - prompt_tokens)
        return budget

    async def complete(self, request: ParsedRequest, session: str | None) -> CompletionSet:
        """Returns the request's completions (raises ``ContextOverflow`` or ``PolicyFailure``)."""
        return await (await self.start(request, session)).task

    async def start(self, request: ParsedRequest, session: str | None) -> PendingCompletion:
        """Renders ``request``, checks it against the context window (raising
        ``ContextOverflow``) and queues it; returns at once with the task that finishes it
        (streams begin while the policy works)."""
        chars = sum(len(m["content"]) for m in request.messages if isinstance(m.get("content"), str))
        small = chars < INLINE_RENDER_CHARS
        lead = request.prefill + forced_call_prefix(request.forced_tool)
        try:
            self.refuse_by_length(chars + len(lead))
            prompt = await self._tokenizing(small, self.renderer.render, request.messages, request.tools, lead)
            budget = self.output_budget(request.max_tokens, len(prompt))
        except ContextOverflow as overflow:
            if session is not None:  # what an external run reports as its error
                self.context_overflows[session] = (overflow.prompt_tokens, overflow.limit)
            raise
        thread = 0
        if self.recorder is not None:
            session, thread = self.recorder.assign(request.messages, session)
        context = ServeContext(request.api, session, request.messages, request.tools, request.raw, request.prefill)
        futures = []
        gone = threading.Event()
        tokens: asyncio.Queue[tuple[int, list[int]]] | None = asyncio.Queue() if request.stream else None
        loop = asyncio.get_running_loop()
        for choice in range(request.n):
            seed = None if request.seed is None else request.seed + choice
            params = SamplingParams(request.temperature, request.top_p, budget, self.stop_token_ids, seed)
            on_tokens = None
            if tokens is not None:

                def on_tokens(ids: Sequence[int], choice: int = choice, tokens: asyncio.Queue = tokens) -> None:
                    loop.call_soon_threadsafe(tokens.put_nowait, (choice, list(ids)))

            generation_request = GenerationRequest(list(prompt.ids), params, context)
            futures.append(asyncio.wrap_future(self.batcher.submit(generation_request, on_tokens, gone.is_set)))
        task = asyncio.ensure_future(self._complete(request, session, thread, prompt, futures))
        # A stream whose client went away never awaits its task: retrieve its error anyway.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return PendingCompletion(session, len(prompt), task, tokens, gone, self._count_abandoned)

    def _count_abandoned(self) -> None:
        self.abandoned += 1

    def streamed_text(self, request: ParsedRequest) -> StreamedText:
        """Returns the tracker of one choice's streamed text (see ``serve/streaming.py``)."""
        return StreamedText(
            self.renderer.decode, self.stop_token_ids, request.stop, bool(request.tools),
            lead=forced_call_prefix(request.forced_tool),
        )

    async def _complete(
        self, request: ParsedRequest, session: str | None, thread: int, prompt: RenderedPrompt,
        futures: list[asyncio.Future[Generation]],
    ) -> CompletionSet:
        generations = await asyncio.gather(*futures)
        choices = []
        for generation in generations:
            if generation.finish_reason == "error":
                raise PolicyFailure(generation.error or "the policy returned an error")
            choices.append(await self._tokenizing(True, self._finish, generation, request))
        result = CompletionSet(session, len(prompt), choices)
        first = choices[0]
        # What the client will send back: the prefill and its continuation as one message.
        content = request.prefill + first.content if request.prefill else first.content
        reply = {"role": "assistant", "content": content, "tool_calls": first.tool_calls}
        if first.finish_reason != "stop_sequence" and not request.prefill and request.forced_tool is None:
            # Cut at a stop string, the ids hold text the client never saw (the stop string
            # and what its last token carried); after a prefill or a forced tool call, the
            # message holds text the policy did not sample: such replies are rendered from
            # their text next time.
            self.renderer.remember(reply, first.token_ids)
        if self.recorder is not None and session is not None:
            record = functools.partial(
                self.recorder.record, session, thread, api=request.api, messages=request.messages,
                prompt=prompt, token_ids=first.token_ids, logprobs=first.logprobs,
                finish_reason=first.finish_reason, text=first.text, reply=reply,
                policy=getattr(self.policy, "name", "policy"),
            )
            # Recorded before the answer goes out, so the client's next request finds it;
            # serializing the record (the prompt's ids) and writing it happen off the event loop.
            await asyncio.to_thread(record)
        return result

    async def _tokenizing(self, small: bool, work: Callable[..., T], *args: Any) -> T:
        """Returns ``work(*args)``, which uses the renderer's tokenizer: run on the event loop
        when it is small and the tokenizer is free (a thread hop costs more), else in a
        thread, so that the loop never waits for the tokenizer."""
        lock = self.renderer.lock
        if small and lock.acquire(blocking=False):
            try:
                return work(*args)
            finally:
                lock.release()
        return await asyncio.to_thread(work, *args)

    def _finish(self, generation: Generation, request: ParsedRequest) -> Completion:
        """Returns the completion of one generation: stop strings applied, tool calls parsed."""
        ids, logprobs = list(generation.token_ids), list(generation.logprobs)
        ended = bool(ids) and ids[-1] in self.stop_token_ids
        text = self.renderer.decode(ids[:-1] if ended else ids)
        finish = "stop" if generation.finish_reason == "stop" else "length"
        matched: str | None = None
        if request.stop:
            cut = _first_stop(text, request.stop)
            if cut is not None:
                position, matched = cut
                text = text[:position]
                keep = self._ids_covering(ids, position + len(matched))
                ids, logprobs, finish = ids[:keep], logprobs[:keep], "stop_sequence"
        # A forced tool call's opening is part of the answer, though it was not sampled.
        text = forced_call_prefix(request.forced_tool) + text
        content, calls = parse_completion(text) if request.tools else (text, [])
        declared = {tool["name"] for tool in request.tools}
        undeclared = sorted({call["name"] for call in calls} - declared)
        if undeclared:
            # The client could not run it: the whole answer is text, as a malformed call is.
            self.undeclared_tool_calls += 1
            logger.warning("a completion called undeclared tools %s: returned as text", undeclared)
            content, calls = text.strip(), []
        for call in calls:
            call["id"] = new_id("call_")
        if calls and finish != "length":
            finish = "tool_calls"
        return Completion(ids, logprobs, finish, text, content, calls, matched)

    def _ids_covering(self, ids: Sequence[int], chars: int) -> int:
        """Returns the fewest leading ids whose text is at least ``chars`` characters long
        (the sampled ids up to and including the one that completed a stop string). A
        binary search: the text of a prefix grows with the prefix."""
        low, high = 1, len(ids)
        while low < high:
            middle = (low + high) // 2
            if len(self.renderer.decode(ids[:middle])) >= chars:
                high = middle
            else:
                low = middle + 1
        return high


def forced_call_prefix(forced_tool: str | None) -> str:
    """Returns the text a forced tool call starts the answer with, in the ``<tool_call>``
    syntax the prompt teaches (``harness/tools/tool_call.py``): the opening tag and, for a
    named tool, its name, so that the model only writes the arguments; ``""`` for any tool
    (the model picks a name); nothing when no call is forced."""
    if forced_tool is None:
        return ""
    opening = f'{TOOL_CALL_OPEN}\n{{"name": '
    if not forced_tool:
        return opening + '"'
    return opening + json.dumps(forced_tool, ensure_ascii=False) + ', "arguments": '


def _first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Returns where the earliest stop string starts in ``text`` and which one it is."""
    best: tuple[int, str] | None = None
    for stop in stops:
        position = text.find(stop) if stop else -1
        if position != -1 and (best is None or position < best[0]):
            best = (position, stop)
    return best
