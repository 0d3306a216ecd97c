"""Normalized messages -> exact prompt token ids, with a span label per token.

The rendering is the ChatML of ``harness/chat.py`` (one message at a time, so every token's
label is known). Tools go into the system prompt (``context.tools_system_text``); tool
results become a user turn of ``<tool_response>`` blocks; an assistant message the server
itself produced is rendered from the ids the policy sampled for it (token-in, token-out: the
conversation's next prompt extends the previous prompt and completion exactly), any other
assistant message from its text.

Span labels: ``system`` (system prompts and the tool list), ``task`` (user text),
``observation`` (tool results), ``policy`` (ids this server sampled), ``reminder``
(assistant text the client wrote or changed: not sampled here, never trained), ``format``
(ChatML scaffolding).
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from harnessrl.harness.base import (
    SPAN_OBSERVATION,
    SPAN_POLICY,
    SPAN_REMINDER,
    SPAN_SYSTEM,
    SPAN_TASK,
    Message,
)
from harnessrl.harness.chat import ChatTokenizer, RenderedPrompt
from harnessrl.serve.context import render_assistant_text, tools_system_text


def message_key(message: dict[str, Any]) -> str:
    """Returns what identifies a normalized message across requests (ids left out: clients
    may rewrite them; surrounding whitespace left out: clients may strip it)."""
    calls = [[c["name"], c["arguments"]] for c in message.get("tool_calls") or ()]
    content = (message.get("content") or "").strip()
    return json.dumps([message["role"], content, calls], sort_keys=True, ensure_ascii=False)


class PromptRenderer:
    """Renders normalized messages with a tokenizer and remembers the sampled ids of the
    assistant messages this server produced (the most recent ``cache_size`` of them)."""

    def __init__(self, tokenizer: ChatTokenizer, cache_size: int = 20_000) -> None:
        # A copy of its own: the policy's thread may use the policy's tokenizer meanwhile
        # (scripted policies tokenize their text), and an HF tokenizer is not safe to call
        # from two threads at once.
        try:
            self.tokenizer = copy.deepcopy(tokenizer)
        except Exception:  # an uncopyable tokenizer is shared (the lock still orders our calls)
            self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._sampled: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.lock = threading.RLock()  # every use of self.tokenizer holds it
        self._sampled_lock = threading.Lock()  # held only for a dict operation

    def remember(self, message: dict[str, Any], token_ids: Sequence[int]) -> None:
        """Records that ``message`` (normalized assistant message) was sampled as ``token_ids``."""
        key = message_key(message)
        with self._sampled_lock:
            self._sampled[key] = tuple(token_ids)
            self._sampled.move_to_end(key)
            while len(self._sampled) > self.cache_size:
                self._sampled.popitem(last=False)

    def chat_messages(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[Message]:
        """Returns the ChatML messages for normalized ``messages`` and ``tools``."""
        out: list[Message] = []
        rest = list(messages)
        if tools:
            system = tools_system_text(list(tools))
            if rest and rest[0]["role"] == "system":
                system = f"{rest.pop(0)['content']}\n\n{system}"
            out.append(Message("system", system, SPAN_SYSTEM))
        results: list[str] = []
        for index, message in enumerate(rest):
            role = message["role"]
            if role == "tool":
                results.append(f"<tool_response>\n{message.get('content', '')}\n</tool_response>")
                if index + 1 < len(rest) and rest[index + 1]["role"] == "tool":
                    continue
                out.append(Message("user", "\n".join(results), SPAN_OBSERVATION))
                results = []
            elif role == "system":
                out.append(Message("system", message.get("content", ""), SPAN_SYSTEM))
            elif role == "user":
                out.append(Message("user", message.get("content", ""), SPAN_TASK))
            else:
                key = message_key(message)
                with self._sampled_lock:
                    sampled = self._sampled.get(key)
                text = render_assistant_text(message)
                if sampled is not None:
                    out.append(Message("assistant", text, SPAN_POLICY, token_ids=sampled))
                else:
                    out.append(Message("assistant", text, SPAN_REMINDER))
        return out

    def render(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], prefill: str = ""
    ) -> RenderedPrompt:
        """Returns the prompt ids (ending with the assistant header, then the ``prefill``
        text the answer must continue, if any) and their span labels."""
        with self.lock:
            prompt = self.tokenizer.render(self.chat_messages(messages, tools))
            if prefill:
                prompt.extend(self.tokenizer.encode(prefill), SPAN_REMINDER)
            return prompt

    def decode(self, ids: Sequence[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids)
