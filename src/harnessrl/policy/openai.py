"""OpenAI-compatible inference servers as a Policy: token ids in and out over ``/completions``
(vLLM, SGLang), or text only (any endpoint, for evaluation).

``OpenAIPolicy`` talks to a server over plain HTTP with the standard library (``urllib``,
``json``, ``concurrent.futures``); it has no client dependency.

**Token mode** (``mode="tokens"``, the default; trajectories fit for training). Each request
is one ``POST {base_url}/completions`` whose ``prompt`` is the list of prompt token ids, so
the server sees exactly the ids the harness rendered and nothing is re-tokenized. Server
options relied upon:

* ``prompt`` as a list of token ids (or a list of such lists with ``batch_prompts=True``):
  OpenAI's completions schema, accepted by vLLM and SGLang.
* ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``n=1``: standard fields.
* ``ignore_eos: true`` (vLLM and SGLang extension): only the request's stop ids end it, as in
  ``HFPolicy``; the model's EOS ends it only when it is among them.
* ``stop_token_ids`` (vLLM and SGLang extension): the request's stop ids. vLLM keeps a
  sampled stop id as the last output id, which is what the trainer expects; a server that
  drops it returns the completion without it, the chat renderer then closes the message
  with format tokens, and the stop token is never trained.
* ``logprobs: 1``: ``choices[i].logprobs.token_logprobs`` holds the log-probability of
  each sampled token (required; a response without it is an error).
* ``return_tokens_as_token_ids: true`` (vLLM): ``logprobs.tokens`` come back as
  ``"token_id:<id>"`` strings, from which the sampled ids are read.
* ``return_token_ids: true`` (vLLM >= 0.10.2): ``choices[i].token_ids`` (and
  ``prompt_token_ids``) are returned explicitly.

Sampled ids are read, in order of preference, from an explicit id field of the choice
(``token_ids``, ``output_token_ids``, ``output_ids``: vLLM's ``return_token_ids``, SGLang-style
responses), then from ``logprobs.tokens`` in the ``token_id:<id>`` form. When the server echoes
``prompt_token_ids`` they must equal the ids sent (a server that adds a BOS would corrupt the
trajectory), else the generation is an error. Servers that reject unknown fields can drop a
field by mapping it to ``None`` in ``extra_body``.

Log-probability convention: vLLM V1 reports *raw* log-probabilities (before temperature) by
default; start it with ``--logprobs-mode processed_logprobs`` to get the tempered ones that
``HFPolicy`` reports (identical when ``top_p=1``; with ``top_p<1`` vLLM's processed values are
also renormalized over the nucleus). Finish reasons: ``"length"`` -> ``length``; ``"stop"`` and
anything else (``"abort"``, ``None``, ...) -> ``stop``.

**Text mode** (``mode="text"``; for evaluation only, never training). For servers that do
not expose tokens (a hosted model): the prompt ids are decoded with the local tokenizer, sent
as text to ``/completions`` (with the stop ids decoded into at most four ``stop`` strings) or,
with ``chat=True``, parsed back from ChatML into ``messages`` for ``/chat/completions``; the
returned text is re-tokenized locally (``tokenizer.completion_ids`` when the finish reason is
``stop``) and every log-probability is NaN. ``max_tokens`` then counts the server's tokens,
not the local tokenizer's. Such a policy says so: ``token_exact`` is False and
``capabilities["text_only"]`` is True.

**Errors.** ``generate`` never raises: a request that fails (invalid parameters, see
``policy.base.request_problem``; connection refused, timeout, HTTP error, malformed response)
comes back as ``Generation([], [], "error", error=...)``; invalid requests and those with
``max_new_tokens=0`` (the empty ``length`` completion) are answered without the server. Connection errors, timeouts, HTTP 429 and 5xx are
retried ``max_retries`` times with exponential backoff (``Retry-After`` is honoured up to
``max_backoff_s``); other HTTP errors are not retried.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import math
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harnessrl.harness.chat import IM_END, IM_START, ChatTokenizer, HFChatTokenizer
from harnessrl.policy.base import (
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
    triage_requests,
)
from harnessrl.policy.embedded import EMBEDDED_NAMES, resolve_model_path

MODES = ("tokens", "text")
TOKEN_ID_PREFIX = "token_id:"
# Choice fields that carry the sampled ids explicitly, in order of preference.
EXPLICIT_ID_FIELDS = ("token_ids", "output_token_ids", "output_ids")
# The OpenAI completions API accepts at most four stop strings.
MAX_STOP_STRINGS = 4
_CHATML_MESSAGE = re.compile(
    re.escape(IM_START) + r"([^\n]*)\n(.*?)(" + re.escape(IM_END) + r"\n?|$)", re.DOTALL
)


class ServerError(RuntimeError):
    """A request to the server failed (after any retries), or its response was unusable."""


def map_finish_reason(reason: object) -> str:
    """Returns ``length`` for the server's ``"length"`` and ``stop`` for anything else."""
    return "length" if reason == "length" else "stop"


def parse_token_id(token: object) -> int:
    """Returns the id of a ``"token_id:<id>"`` string (vLLM's ``return_tokens_as_token_ids``)."""
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        try:
            return int(token[len(TOKEN_ID_PREFIX):])
        except ValueError:
            pass
    raise ServerError(
        f"logprobs.tokens holds {token!r}, not a 'token_id:<id>' string: the server ignored "
        "return_tokens_as_token_ids (vLLM supports it; for other servers use one that returns "
        "token ids, or mode='text')"
    )


def parse_token_choice(choice: dict[str, Any], prompt_ids: Sequence[int] | None = None) -> Generation:
    """Returns the generation in one completions ``choice`` of a token-mode request.

    Ids come from an explicit id field (``token_ids``, ``output_token_ids``, ``output_ids``),
    else from ``logprobs.tokens`` in the ``token_id:<id>`` form; log-probabilities from
    ``logprobs.token_logprobs`` (a ``null`` entry becomes NaN). Raises ``ServerError`` when
    either is missing, their lengths differ, or an echoed ``prompt_token_ids`` differs from
    ``prompt_ids``.
    """
    if prompt_ids is not None and choice.get("prompt_token_ids") is not None:
        echoed = [int(i) for i in choice["prompt_token_ids"]]
        if echoed != list(prompt_ids):
            raise ServerError(
                f"the server changed the prompt: it echoed {len(echoed)} prompt ids for the "
                f"{len(prompt_ids)} sent (does it add a BOS token to token prompts?)"
            )
    logprobs = choice.get("logprobs") or {}
    if not isinstance(logprobs, dict):
        raise ServerError(f"choice.logprobs is a {type(logprobs).__name__}, expected an object")
    token_ids: list[int] | None = None
    for name in EXPLICIT_ID_FIELDS:
        if choice.get(name) is not None:
            token_ids = [int(i) for i in choice[name]]
            break
    if token_ids is None and logprobs.get("tokens") is not None:
        token_ids = [parse_token_id(token) for token in logprobs["tokens"]]
    if token_ids is None:
        raise ServerError(
            "the response has no token ids: send return_tokens_as_token_ids (vLLM) or "
            "return_token_ids, or use mode='text' for servers that do not expose tokens"
        )
    token_logprobs = logprobs.get("token_logprobs")
    if token_logprobs is None:
        raise ServerError("the response has no logprobs.token_logprobs (the request asks for logprobs: 1)")
    if len(token_logprobs) != len(token_ids):
        raise ServerError(
            f"the response has {len(token_ids)} token ids but {len(token_logprobs)} log-probabilities"
        )
    values = [math.nan if value is None else float(value) for value in token_logprobs]
    return Generation(token_ids, values, map_finish_reason(choice.get("finish_reason")))


def parse_chatml(text: str) -> list[dict[str, str]]:
    """Returns the ``{"role", "content"}`` messages of a ChatML prompt.

    The final open ``<|im_start|>assistant\\n`` (the generation prompt) is dropped. Raises
    ``ValueError`` for text outside the messages or for an unfinished message with content
    (a chat endpoint cannot continue a partial message).
    """
    messages: list[dict[str, str]] = []
    position = 0
    for match in _CHATML_MESSAGE.finditer(text):
        if text[position:match.start()].strip():
            raise ValueError(f"text outside ChatML messages: {text[position:match.start()][:60]!r}")
        position = match.end()
        role, content, closing = match.group(1).strip(), match.group(2), match.group(3)
        if not closing:  # the last message is still open
            if content:
                raise ValueError(f"the prompt ends inside a {role!r} message with content; chat mode cannot continue it")
            continue
        messages.append({"role": role, "content": content})
    if text[position:].strip():
        raise ValueError(f"text outside ChatML messages: {text[position:][:60]!r}")
    if not messages:
        raise ValueError("the prompt holds no ChatML message")
    return messages


def load_tokenizer(tokenizer_path: str | os.PathLike[str] | None) -> HFChatTokenizer:
    """Returns the ChatML tokenizer of a local HF folder; ``None`` (or an embedded name) means
    the embedded default model's folder. Nothing is fetched from a hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    if tokenizer_path is None or str(tokenizer_path).strip().lower() in EMBEDDED_NAMES:
        folder = resolve_model_path(None)
    else:
        folder = Path(tokenizer_path).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"tokenizer_path {str(folder)!r} is not a folder holding a tokenizer")
    return HFChatTokenizer(AutoTokenizer.from_pretrained(folder, local_files_only=True))


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _http_error_detail(error: urllib.error.HTTPError) -> str:
    """Returns the server's message in an error response (OpenAI ``{"error": {"message"}}``)."""
    try:
        body = error.read().decode("utf-8", errors="replace")
    except Exception:
        return error.reason if isinstance(error.reason, str) else ""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:300]
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
        if isinstance(inner, str):
            return inner[:300]
        if payload.get("message"):
            return str(payload["message"])[:300]
    return body[:300]


def _error(message: str) -> Generation:
    return Generation([], [], "error", error=message)


class OpenAIPolicy(Policy):
    """A policy served by an OpenAI-compatible server (see the module docstring for the
    protocol, the server options relied upon and the error conventions).

    ``model`` is the server's model name; ``base_url`` ends with the API version
    (``http://host:8000/v1``). The tokenizer is ``tokenizer``, else the HF tokenizer in the
    local folder ``tokenizer_path``, else the embedded default model's; in token mode it must
    be the served model's tokenizer. A batch's requests go out concurrently on up to
    ``max_concurrency`` threads, or, with ``batch_prompts=True``, as one HTTP request per
    group of requests with identical sampling parameters (a list of prompts; not for
    ``chat``). ``timeout_s`` bounds the connection and each wait for data, so with
    non-streamed responses it bounds the time to the whole answer. ``extra_body`` is merged
    into every request body (``None`` values remove a field), e.g. ``{"top_k": -1}``.
    ``context_length`` is the served model's context in tokens (``"server"``: read once from
    ``GET /models``, vLLM's ``max_model_len``; None: unknown); when known, a prompt that fills
    it is an ``error`` generation and ``max_tokens`` is capped at the room left, as in
    ``HFPolicy``, and ``harnessrl serve`` applies it as its context limit.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "http://127.0.0.1:8000/v1",
        *,
        tokenizer: ChatTokenizer | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        mode: str = "tokens",
        chat: bool = False,
        batch_prompts: bool = False,
        max_concurrency: int = 32,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 16.0,
        extra_body: dict[str, Any] | None = None,
        context_length: int | str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if chat and mode != "text":
            raise ValueError("chat=True needs mode='text': /chat/completions takes text messages, not token ids")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if max_retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError("max_retries and backoff_s must be >= 0 and timeout_s > 0")
        if not model:
            raise ValueError("model must name the served model (the server's 'model' field)")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.name = f"openai:{model}"
        self.tokenizer: ChatTokenizer = tokenizer if tokenizer is not None else load_tokenizer(tokenizer_path)
        self.api_key = api_key
        self.mode, self.chat, self.batch_prompts = mode, chat, batch_prompts and not chat
        self.max_concurrency, self.timeout_s = max_concurrency, timeout_s
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.endpoint = "/chat/completions" if chat else "/completions"
        self.token_exact = mode == "tokens"
        self.capabilities: dict[str, Any] = {
            "token_exact": self.token_exact,
            "logprobs": self.token_exact,
            "text_only": not self.token_exact,
            "endpoint": self.endpoint,
        }
        # A local server is reached directly even when the environment sets a proxy.
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.base_url) else []
        self._opener = urllib.request.build_opener(*handlers)
        if context_length == "server":
            context_length = self.server_context_length()
        if context_length is not None and (not isinstance(context_length, int) or context_length < 2):
            raise ValueError(f"context_length must be an int >= 2, 'server' or None, got {context_length!r}")
        self.context_length: int | None = context_length
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        # Text mode decodes and encodes on the request threads; HF tokenizers are not
        # guaranteed to be safe under concurrent calls, and the work is tiny next to HTTP.
        self._tokenizer_lock = threading.Lock()

    # ---------------------------------------------------------------- public API

    def server_context_length(self) -> int | None:
        """Returns the served model's context (``max_model_len`` of ``GET /models``, a vLLM
        field), or None when the server does not say (or cannot be reached)."""
        try:
            request = urllib.request.Request(self.base_url + "/models", headers=self._headers())
            with self._opener.open(request, timeout=min(self.timeout_s, 10.0)) as response:
                listing = json.loads(response.read())
        except (OSError, ValueError, http.client.HTTPException):
            return None
        entries = listing.get("data") if isinstance(listing, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and entry.get("id") == self.model:
                length = entry.get("max_model_len")
                return int(length) if isinstance(length, int) and length >= 2 else None
        return None

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns one generation per request, in order; failed requests come back as
        ``error`` generations, never as exceptions."""
        results, runnable = triage_requests(requests, context_length=self.context_length)
        jobs: list[list[int]] = []  # each job: indices of the requests sent in one HTTP call
        groups: dict[SamplingParams, list[int]] = {}
        for index in runnable:
            if self.batch_prompts:
                groups.setdefault(requests[index].params, []).append(index)
            else:
                jobs.append([index])
        jobs.extend(groups.values())

        def run(job: list[int]) -> list[Generation]:
            try:
                return self._complete([requests[i] for i in job])
            except Exception as exc:  # every failure becomes an error generation
                message = str(exc) if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"
                return [_error(message) for _ in job]

        # One call runs on the caller's thread; more share the pool.
        outcomes = [run(jobs[0])] if len(jobs) == 1 else list(self._pool().map(run, jobs))
        for job, generations in zip(jobs, outcomes, strict=True):
            for index, generation in zip(job, generations, strict=True):
                results[index] = generation
        return [g if g is not None else _error("no result") for g in results]

    def close(self) -> None:
        """Stops the request threads."""
        with self._executor_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    # ---------------------------------------------------------------- requests

    def _pool(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="openai-policy")
            return self._executor

    def _complete(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns the generations of requests that share one HTTP call (one request unless
        ``batch_prompts``, in which case they share their sampling parameters)."""
        params = requests[0].params
        if self.mode == "tokens":
            prompts: list[Any] = [list(r.prompt_ids) for r in requests]
        else:
            with self._tokenizer_lock:
                prompts = [self.tokenizer.decode(r.prompt_ids) for r in requests]
        body = self._body(prompts, params)
        response = self._post(self.endpoint, body)
        choices = response.get("choices") if isinstance(response, dict) else None
        if not isinstance(choices, list) or len(choices) != len(requests):
            count = len(choices) if isinstance(choices, list) else "no"
            raise ServerError(f"the response has {count} choices for {len(requests)} prompts")
        ordered = sorted(choices, key=lambda c: c.get("index", 0)) if len(choices) > 1 else choices
        if self.mode == "tokens":
            return [parse_token_choice(choice, r.prompt_ids) for choice, r in zip(ordered, requests, strict=True)]
        return [self._text_generation(choice, params) for choice in ordered]

    def _body(self, prompts: list[Any], params: SamplingParams) -> dict[str, Any]:
        """Returns the JSON body for ``prompts`` (one unless batched) under ``params``."""
        max_tokens = params.max_new_tokens
        if self.context_length is not None and self.mode == "tokens":
            # The room the longest prompt leaves, as HFPolicy caps it (the server rejects more).
            max_tokens = min(max_tokens, self.context_length - max(len(p) for p in prompts))
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
            "stream": False,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if self.chat:
            body["messages"] = parse_chatml(prompts[0])
        else:
            body["prompt"] = prompts[0] if len(prompts) == 1 else prompts
        if self.mode == "tokens":
            body["logprobs"] = 1
            body["return_tokens_as_token_ids"] = True
            body["return_token_ids"] = True
            # Only the request's stop ids end it (HFPolicy's convention), not the model's EOS.
            body["ignore_eos"] = True
            if params.stop_token_ids:
                body["stop_token_ids"] = list(params.stop_token_ids)
        elif not self.chat:
            stops = self._stop_strings(params)
            if stops:
                body["stop"] = stops
        body.update(self.extra_body)
        return {key: value for key, value in body.items() if value is not None}

    def _stop_strings(self, params: SamplingParams) -> list[str]:
        """Returns the text of the request's stop ids (text mode), at most four."""
        stops: list[str] = []
        for token_id in params.stop_token_ids:
            text = self.tokenizer.decode([token_id])
            if text.strip() and text not in stops:
                stops.append(text)
        return stops[:MAX_STOP_STRINGS]

    def _text_generation(self, choice: dict[str, Any], params: SamplingParams) -> Generation:
        """Returns a text-mode generation: the returned text re-tokenized locally, NaN log-probs."""
        if self.chat:
            message = choice.get("message") or {}
            text = message.get("content") if isinstance(message, dict) else None
        else:
            text = choice.get("text")
        text = text if isinstance(text, str) else ""
        finish_reason = map_finish_reason(choice.get("finish_reason"))
        for stop in self._stop_strings(params):  # a server that includes the stop string
            if text.endswith(stop):
                text, finish_reason = text[: -len(stop)], "stop"
        with self._tokenizer_lock:
            ids = self.tokenizer.completion_ids(text) if finish_reason == "stop" else self.tokenizer.encode(text)
        return Generation(ids, [math.nan] * len(ids), finish_reason)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "harnessrl"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        """Returns the decoded JSON response of ``POST base_url+path``, retrying connection
        errors, timeouts, 429 and 5xx with exponential backoff; raises ``ServerError``."""
        url = self.base_url + path
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", **self._headers()}
        last_error = ""
        for attempt in range(self.max_retries + 1):
            delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
            try:
                http_request = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with self._opener.open(http_request, timeout=self.timeout_s) as response:
                    payload = response.read()
            except urllib.error.HTTPError as exc:
                detail = _http_error_detail(exc)
                if exc.code != 429 and exc.code < 500:
                    raise ServerError(f"HTTP {exc.code} from {url}: {detail}") from None
                last_error = f"HTTP {exc.code}: {detail}"
                retry_after = exc.headers.get("Retry-After") if exc.headers else None
                if retry_after is not None:
                    with contextlib.suppress(ValueError):  # an HTTP date: keep the backoff
                        delay = min(self.max_backoff_s, max(0.0, float(retry_after)))
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out
                reason = getattr(exc, "reason", None) or exc
                last_error = f"{type(reason).__name__}: {reason}"
            else:
                try:
                    decoded = json.loads(payload)
                except ValueError:
                    raise ServerError(f"{url} returned a body that is not JSON: {payload[:200]!r}") from None
                if isinstance(decoded, dict) and "choices" not in decoded and decoded.get("error"):
                    raise ServerError(f"{url} returned an error: {str(decoded['error'])[:300]}")
                return decoded
            if attempt < self.max_retries:
                time.sleep(delay)
        attempts = self.max_retries + 1
        raise ServerError(f"POST {url} failed after {attempts} attempt{'s' if attempts > 1 else ''}: {last_error}")
