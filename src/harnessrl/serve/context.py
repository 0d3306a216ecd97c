"""What a policy sees of an API request (``ServeContext``) and the tool-call text format.

Tool-call text format (Hermes / Qwen style, the format of harness T2). The client's tools
are rendered into the system prompt (``tools_system_text``) as one JSON line per tool
(``{"type": "function", "function": {"name", "description", "parameters"}}``) between
``<tools></tools>`` tags, with the instruction to call them as::

    Some optional text first.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A completion may hold several ``<tool_call>`` blocks; each body is a JSON object with a
``name`` (string) and ``arguments`` (an object, or a string holding a JSON object). The
server parses completions with ``parse_completion``: every well-formed block becomes a
tool call of the API's shape (``tool_calls``, ``tool_use`` blocks, ``function_call`` items),
and the text outside the blocks, stripped, is the message's text. A block that does not
parse stays in the text. Earlier assistant tool calls are rendered back the same way
(``render_assistant_text``), and tool results are rendered as a user turn holding
``<tool_response>\\n...\\n</tool_response>`` per result, as Qwen's chat template does.

Normalized messages (``ServeContext.messages``) are dicts, whatever the API:

* ``{"role": "system", "content": str}`` (OpenAI ``developer`` and Anthropic ``system``
  included, at the position they were given);
* ``{"role": "user", "content": str}``;
* ``{"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments": dict}]}``;
* ``{"role": "tool", "tool_call_id": str, "name": str, "content": str, "is_error": bool}``.

Normalized tools are ``{"name", "description", "parameters"}`` (a JSON schema).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from harnessrl.harness.tools import HERMES_TOOL_USE, call_from_json, tag_safe_json

API_CHAT, API_RESPONSES, API_MESSAGES = "chat", "responses", "messages"

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass
class ServeContext:
    """The request a policy is asked to complete, as ``GenerationRequest.context``.

    ``api`` is ``chat``, ``responses`` or ``messages``; ``session`` the client conversation
    (from the ``/s/{session}`` path or the ``X-Harnessrl-Session`` header, else the one the
    recorder grouped the request into, else None); ``messages`` and ``tools`` are normalized
    (see the module docstring); ``raw`` is the request body as sent; ``prefill`` is the start
    of the answer the client wrote (an Anthropic final assistant message, left out of
    ``messages`` and rendered at the end of the prompt): the policy writes what follows it.
    A scripted policy answers in the tool-call text format of the module docstring.
    """

    api: str
    session: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    prefill: str = ""  # text the answer must continue (already in the prompt), if any


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """Returns the system-prompt section that lists ``tools`` (normalized) and the call syntax."""
    lines = [
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool.get("parameters", {}),
                },
            },
            ensure_ascii=False,
        )
        for tool in tools
    ]
    return HERMES_TOOL_USE.format(tools="\n".join(lines))


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """Returns one ``<tool_call>`` block calling ``name`` with ``arguments``."""
    return f"<tool_call>\n{tag_safe_json({'name': name, 'arguments': arguments})}\n</tool_call>"


def render_assistant_text(message: dict[str, Any]) -> str:
    """Returns the completion text that an assistant message (normalized) stands for."""
    parts = [message.get("content") or ""]
    parts += [tool_call_text(call["name"], call["arguments"]) for call in message.get("tool_calls") or ()]
    return "\n".join(part for part in parts if part)


def parse_completion(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Returns the text outside well-formed ``<tool_call>`` blocks (stripped) and the calls,
    each ``{"name": str, "arguments": dict}``, in order."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        try:
            call = call_from_json(json.loads(match.group(1)))
        except (ValueError, RecursionError):
            call = "not JSON"
        if isinstance(call, str):  # malformed: leave it in the text for the client to see
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append({"name": call.name, "arguments": call.arguments})
    kept.append(text[position:])
    content = "".join(kept) if calls else text
    return content.strip(), calls
