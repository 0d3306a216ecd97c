"""What a policy sees of an API request (``ServeContext``) and how its tools and tool calls
are written as text.

The text format is the ``<tool_call>`` syntax of harness T2 (``harness/tools/tool_call.py``):
the client's tools are listed in the system prompt (``tools_system_text``), and the server
reads completions with that module's ``parse_completion``: every well-formed block becomes a
tool call of the API's shape (``tool_calls``, ``tool_use`` blocks, ``function_call`` items),
and the text outside the blocks, stripped, is the message's text; a block that does not parse
stays in the text. Earlier assistant tool calls are rendered back the same way
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

from dataclasses import dataclass, field
from typing import Any

from harnessrl.harness.base import ToolSpec
from harnessrl.harness.tools.tool_call import tool_call_text, tools_instructions

API_CHAT, API_RESPONSES, API_MESSAGES = "chat", "responses", "messages"


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
    specs = [ToolSpec(tool["name"], tool.get("description", ""), tool.get("parameters", {})) for tool in tools]
    return tools_instructions(specs)


def render_assistant_text(message: dict[str, Any]) -> str:
    """Returns the completion text that an assistant message (normalized) stands for."""
    parts = [message.get("content") or ""]
    parts += [tool_call_text(call["name"], call["arguments"]) for call in message.get("tool_calls") or ()]
    return "\n".join(part for part in parts if part)
