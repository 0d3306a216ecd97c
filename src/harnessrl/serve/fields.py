"""Reading request bodies field by field: every malformed field is an ``InvalidRequest``
that names it (the APIs turn it into a 400 in their own error shape); unknown fields are
ignored, but no string anywhere in a body may hold a lone UTF-16 surrogate (JSON lets
``"\\ud800"`` through; no tokenizer or UTF-8 file can take it)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from harnessrl.serve.engine import InvalidRequest

# A JSON escape of a UTF-16 surrogate: only bodies that hold one need the walk below.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


INT64 = (-(2**63), 2**63 - 1)
"""The range of every integer field: a number outside it (``2**63``, ``1e30``) is refused."""

MAX_OUTPUT_TOKENS_FIELD = 2**31 - 1
"""The largest output limit (``max_tokens`` and kin) a request may name; the engine then caps
it to what the context leaves."""


def optional_int(body: dict[str, Any], name: str, minimum: int | None = None, maximum: int | None = None) -> int | None:
    """Returns the integer field ``name`` (None when absent or null); NaN, infinities,
    fractions and numbers outside `INT64` (or ``minimum``/``maximum``) are refused."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float) and not value.is_integer()):
        raise InvalidRequest(f"'{name}' must be an integer, got {json.dumps(value)[:80]}", name)
    value = int(value)
    if not INT64[0] <= value <= INT64[1]:
        raise InvalidRequest(f"'{name}' must be an integer between -2^63 and 2^63-1, got {str(value)[:40]}", name)
    if minimum is not None and value < minimum:
        raise InvalidRequest(f"'{name}' must be at least {minimum}, got {value}", name)
    if maximum is not None and value > maximum:
        raise InvalidRequest(f"'{name}' must be at most {maximum}, got {value}", name)
    return value


def optional_number(body: dict[str, Any], name: str, low: float, high: float, default: float) -> float:
    """Returns the number field ``name`` within [low, high] (``default`` when absent or null;
    NaN and infinities are refused)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a number, got {json.dumps(value)[:80]}", name)
    if not low <= value <= high:
        raise InvalidRequest(f"'{name}' must be between {low} and {high}, got {value}", name)
    return float(value)


def optional_bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be a boolean, got {json.dumps(value)[:80]}", name)
    return value


def string_list(value: Any, name: str, limit: int = 16) -> list[str]:
    """Returns a string or a list of strings as a list (None: empty)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value) and len(value) <= limit:
        return list(value)
    raise InvalidRequest(f"'{name}' must be a string or a list of at most {limit} strings", name)


def require_str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string, got {type(value).__name__}", name)
    return value


def require_dict(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{name}' must be an object, got {type(value).__name__}", name)
    return value


def require_list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRequest(f"'{name}' must be an array, got {type(value).__name__}", name)
    return value


def arguments_object(value: Any, name: str) -> dict[str, Any]:
    """Returns tool-call arguments given as a JSON string (OpenAI) or an object."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise InvalidRequest(f"'{name}' is not a JSON object string", name) from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{name}' must be a JSON object", name)
    reject_surrogates(value, name)  # the body's check saw the escape as text inside a string
    return value


def text_of_parts(value: Any, name: str, text_types: tuple[str, ...]) -> str:
    """Returns the text of content given as a string or a list of parts (``{"type": t,
    "text": ...}`` for t in ``text_types``; other parts, e.g. images, become a placeholder)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"'{name}' must be a string or an array of content parts", name)
    texts = []
    for index, part in enumerate(value):
        where = f"{name}[{index}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        part = require_dict(part, where)
        kind = part.get("type")
        if kind in text_types or (kind is None and "text" in part):
            texts.append(require_str(part.get("text"), f"{where}.text"))
        elif isinstance(kind, str):
            texts.append(f"[{kind}]")
        else:
            raise InvalidRequest(f"'{where}.type' must be a string", f"{where}.type")
    return "\n".join(texts)


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """Returns a normalized tool ``{"name", "description", "parameters"}``."""
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"'{where}.name' must be a non-empty string", f"{where}.name")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"'{where}.description' must be a string", f"{where}.description")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"'{where}' parameters must be a JSON schema object", where)
    return {"name": name, "description": description or "", "parameters": parameters}


def sampling(body: dict[str, Any], max_temperature: float) -> tuple[float, float]:
    """Returns (temperature, top_p); ``top_p: 0`` keeps only the most likely token: greedy."""
    temperature = optional_number(body, "temperature", 0.0, max_temperature, 1.0)
    top_p = optional_number(body, "top_p", 0.0, 1.0, 1.0)
    return (0.0, 1.0) if top_p == 0.0 else (temperature, top_p)


def optional_str(body: dict[str, Any], name: str) -> str | None:
    """Returns the string field ``name`` (None when absent or null)."""
    value = body.get(name)
    if value is None:
        return None
    return require_str(value, name)


def optional_dict(body: dict[str, Any], name: str) -> dict[str, Any]:
    """Returns the object field ``name`` ({} when absent or null)."""
    value = body.get(name)
    return {} if value is None else require_dict(value, name)


def optional_list(body: dict[str, Any], name: str) -> list[Any]:
    """Returns the array field ``name`` ([] when absent or null; ``{}`` or ``""`` is an error)."""
    value = body.get(name)
    return [] if value is None else require_list(value, name)


def required_content(message: dict[str, Any], where: str) -> Any:
    """Returns a message's ``content``, which must be given and not null."""
    if message.get("content") is None:
        raise InvalidRequest(f"'{where}.content' is required", f"{where}.content")
    return message["content"]


def _surrogate_at(value: Any, where: str) -> str | None:
    """Returns the path of the first string (or object key) in ``value`` holding a lone
    surrogate, else None."""
    stack = [(value, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return at
        elif isinstance(node, dict):
            for key, child in node.items():
                stack.append((key, at))
                stack.append((child, f"{at}.{key}" if at else str(key)))
        elif isinstance(node, list):
            stack.extend((child, f"{at}[{index}]") for index, child in enumerate(node))
    return None


def reject_surrogates(value: Any, where: str = "", raw: bytes | None = None) -> None:
    """Raises ``InvalidRequest`` naming where ``value`` holds a lone UTF-16 surrogate; with
    ``raw`` (the JSON text ``value`` came from), only looks when the text escapes one."""
    if raw is not None and not _SURROGATE_ESCAPE.search(raw):
        return
    at = _surrogate_at(value, where)
    if at is not None:
        raise InvalidRequest(f"'{at or 'body'}' holds a lone UTF-16 surrogate, which is not valid Unicode text", at or None)


def openai_tool_choice(body: dict[str, Any], tools: list[dict[str, Any]]) -> str | None:
    """Returns the tool an OpenAI ``tool_choice`` (Chat Completions, with the legacy
    ``function_call``, and Responses) forces: None (``auto``, ``none``, absent), ``""`` (any
    declared tool: ``required``) or a tool's name (``{"type": "function", ...}`` naming one
    of ``tools``). Forms the server cannot honour (``allowed_tools``, built-in tools) are an
    ``InvalidRequest`` that says so, never ignored."""
    value = body.get("tool_choice")
    if value is None and body.get("function_call") is not None:
        legacy = body["function_call"]
        value = {"type": "function", "function": legacy} if isinstance(legacy, dict) else legacy
    if value is None or value in ("none", "auto"):
        return None
    if value == "required":
        return forced_tool("", tools, "tool_choice")
    if not isinstance(value, dict):
        raise InvalidRequest("'tool_choice' must be \"none\", \"auto\", \"required\" or an object naming a tool", "tool_choice")
    kind = value.get("type")
    if kind in ("function", "custom"):
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else value.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("'tool_choice' must name the tool: {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        return forced_tool(name, tools, "tool_choice")
    raise InvalidRequest(
        f"'tool_choice' of type {json.dumps(kind)[:40]} is not supported by this server: use \"none\", \"auto\", "
        "\"required\" or a function by name", "tool_choice",
    )


def forced_tool(name: str, tools: list[dict[str, Any]], param: str) -> str:
    """Returns ``name`` (``""``: any tool) once it is sure ``tools`` can honour it."""
    if not tools:
        raise InvalidRequest(f"'{param}' forces a tool call, but the request declares no tools", param)
    if name and name not in {tool["name"] for tool in tools}:
        raise InvalidRequest(f"'{param}' names the tool {json.dumps(name)[:80]}, which is not among the request's tools", param)
    return name


def refuse_unsupported(body: dict[str, Any], checks: dict[str, Any]) -> None:
    """Raises ``InvalidRequest`` for the first field of ``checks`` whose value in ``body``
    asks for what the server cannot do: ``checks`` maps a field to a predicate of its value
    that is true when the server can honour it (an absent or null field always can)."""
    for name, honoured in checks.items():
        value = body.get(name)
        if value is not None and not honoured(value):
            raise InvalidRequest(f"'{name}' = {json.dumps(value)[:80]} is not supported by this server", name)
