"""The ``<tool_call>`` syntax (Hermes / Qwen): the tool-use instructions, reading calls out of a
completion and writing them; shared by T2 (``fine_grained_tagged``) and ``harnessrl serve``.

Tools are listed as one JSON line per tool (``{"type": "function", "function": {"name",
"description", "parameters"}}``) between ``<tools></tools>`` tags, with the instruction to
call them as::

    Some optional text first.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A completion may hold several blocks; each body is a JSON object with a ``name`` (string) and
``arguments`` (an object, or a string holding a JSON object). Two readings: T2 takes every
block in order, an unterminated last one included, and rejects the whole response when one is
malformed (``tagged_bodies``); the server keeps a malformed block in the message text for the
client to see (``parse_completion``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from harnessrl.harness.base import ToolSpec
from harnessrl.harness.tools.arguments import call_from_json, tag_safe_json

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

HERMES_TOOL_USE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def tools_instructions(specs: Iterable[ToolSpec]) -> str:
    """Returns the tool-use instructions listing ``specs`` (OpenAI function form, one per line)."""
    lines = "\n".join(json.dumps(spec.to_openai(), ensure_ascii=False) for spec in specs)
    return HERMES_TOOL_USE.format(tools=lines)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """Returns one ``<tool_call>`` block calling ``name`` with ``arguments``."""
    return f"{TOOL_CALL_OPEN}\n{tag_safe_json({'name': name, 'arguments': arguments})}\n{TOOL_CALL_CLOSE}"


def tagged_bodies(text: str) -> tuple[list[str], int]:
    """Returns the bodies of ``<tool_call>`` blocks (an unterminated last one included) and
    where the first block starts (-1 when none)."""
    bodies: list[str] = []
    end = 0
    for match in _TOOL_CALL.finditer(text):
        bodies.append(match.group(1))
        end = match.end()
    rest = text.find(TOOL_CALL_OPEN, end)
    if rest != -1:  # generation stopped before the closing tag
        bodies.append(text[rest + len(TOOL_CALL_OPEN):])
    return bodies, text.find(TOOL_CALL_OPEN)


def parse_completion(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Returns the text outside well-formed ``<tool_call>`` blocks (stripped) and the calls,
    each ``{"name": str, "arguments": dict}``, in order."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL.finditer(text):
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
