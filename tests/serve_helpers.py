"""Shared pieces of the serve tests: a scripted agent-facing policy and a running server."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from harnessrl.policy.scripted import CallbackPolicy
from harnessrl.serve.app import create_app
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.runner import ServerThread

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Returns the weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def agent_reply(context: Any) -> str:
    """A scripted agent: with tools and a fresh user question it calls get_weather on the
    question's last word; after a tool result it answers with the result; otherwise it echoes.
    ``STOPWORD`` in the question makes it say more after the word (for stop strings)."""
    last = context.messages[-1]
    if last["role"] == "tool":
        return f"The weather is {last['content']}."
    if context.tools and last["role"] == "user":
        city = last["content"].split()[-1].strip("?")
        arguments = json.dumps({"city": city})
        return f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
    return f"echo: {last['content']}"


class Scripted(CallbackPolicy):
    """``agent_reply`` that also keeps every context it was asked with."""

    def __init__(self, respond: Any = agent_reply) -> None:
        self.contexts: list[Any] = []

        def remember(context: Any) -> str:
            self.contexts.append(context)
            return respond(context)

        super().__init__(remember, name="scripted")


@contextlib.contextmanager
def running(policy: Any = None, **options: Any) -> Iterator[tuple[ServerThread, Any, ConversationRecorder]]:
    """Yields (server, policy, recorder) for an app over ``policy`` (default ``Scripted()``)."""
    policy = policy if policy is not None else Scripted()
    recorder = options.pop("recorder", None) or ConversationRecorder()
    app = create_app(policy, model_name="test-model", recorder=recorder, **options)
    with ServerThread(app) as server:
        yield server, policy, recorder
