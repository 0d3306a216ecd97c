"""JSON arguments of tool calls: strict object schemas, checking arguments against them,
finding JSON objects in free text and reading a ``{"name": ..., "arguments": ...}`` call."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harnessrl.harness.base import ToolCall, ToolSpec
from harnessrl.harness.tools.common import encodable

MAX_JSON_ATTEMPTS = 64  # '{' or '[' positions tried when looking for a JSON object in free text


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
_JSON_TYPE_NAMES = {
    str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object",
    type(None): "null",
}


def _type_name(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _check_value(name: str, value: Any, schema: dict[str, Any]) -> str | None:
    """Returns what is wrong with one argument value, or None (a small JSON-schema subset)."""
    expected = schema.get("type")
    if expected is not None:
        options = expected if isinstance(expected, list) else [expected]
        if not any(_JSON_TYPES[t](value) for t in options):
            wanted = " or ".join(options)
            return f"argument `{name}` must be of type {wanted}, got {_type_name(value)}"
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"argument `{name}` must be one of {allowed}, got {json.dumps(value, default=str)[:80]}"
    if _JSON_TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"argument `{name}` must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"argument `{name}` must be <= {schema['maximum']}, got {value}"
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"argument `{name}` needs at least {schema['minItems']} item(s), got {len(value)}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"argument `{name}` takes at most {schema['maxItems']} item(s), got {len(value)}"
        item_schema = schema.get("items")
        if isinstance(item_schema, dict):
            for index, item in enumerate(value):
                problem = _check_value(f"{name}[{index}]", item, item_schema)
                if problem:
                    return problem
    return None


def validate_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """Returns a model-facing message naming the bad argument and showing the schema, or None."""
    schema = spec.parameters
    problem: str | None = None
    if not isinstance(arguments, dict):
        problem = f"the arguments must be a JSON object, got {_type_name(arguments)}"
    else:
        properties: dict[str, Any] = schema.get("properties", {})
        missing = [name for name in schema.get("required", []) if name not in arguments]
        unknown = [name for name in arguments if name not in properties]
        if missing:
            problem = f"missing required argument `{missing[0]}`"
        elif unknown and schema.get("additionalProperties", True) is False:
            problem = f"unexpected argument `{str(unknown[0])[:80]}`"
        else:
            for name, value in arguments.items():
                if name in properties:
                    problem = _check_value(name, value, properties[name])
                    if problem:
                        break
    if problem is None:
        return None
    return (
        f"Invalid arguments for tool `{spec.name}`: {problem}.\n"
        f"Expected arguments (JSON schema): {json.dumps(schema, ensure_ascii=False)}"
    )


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """Returns a strict JSON schema of an object with ``properties``."""
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class JsonFound:
    """JSON objects found in free text, and the first decoding error on the way."""

    objects: tuple[Any, ...]
    first_error: str | None
    start: int  # where the first object starts (-1 when none)


_JSON_START = re.compile(r"[\[{]")


def find_json_objects(text: str) -> JsonFound:
    """Returns the top-level JSON objects and arrays in ``text`` in order (the outermost value
    at each place; text around them is tolerated)."""
    decoder = json.JSONDecoder()
    objects: list[Any] = []
    first_error: str | None = None
    start = -1
    match = _JSON_START.search(text)
    attempts = 0
    while match is not None and attempts < MAX_JSON_ATTEMPTS:
        attempts += 1
        position = match.start()
        try:
            value, end = decoder.raw_decode(text, position)
        except (ValueError, RecursionError) as exc:
            if first_error is None and text[position] == "{":
                first_error = str(exc) if isinstance(exc, ValueError) else "the JSON is nested too deeply"
            match = _JSON_START.search(text, position + 1)
            continue
        if isinstance(value, dict | list):
            objects.append(value)
            if start < 0 and isinstance(value, dict):
                start = position
        match = _JSON_START.search(text, end)
    return JsonFound(tuple(objects), first_error, start)


def call_from_json(value: Any) -> ToolCall | str:
    """Returns the call in a decoded ``{"name": ..., "arguments": {...}}`` object, or a message."""
    if not isinstance(value, dict):
        return f"a tool call must be a JSON object, got a JSON {_type_name(value)}"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return "the tool call needs a \"name\" that is a non-empty string"
    arguments = value.get("arguments", {})
    shown = encodable(name[:80])
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return f"the \"arguments\" of `{shown}` are a string that is not valid JSON"
    if not isinstance(arguments, dict):
        return f"the \"arguments\" of `{shown}` must be a JSON object, got {_type_name(arguments)}"
    extra = sorted(set(value) - {"name", "arguments"})
    if extra:
        key = encodable(str(extra[0])[:80])
        return f"unexpected key `{key}` in the tool call; use only \"name\" and \"arguments\""
    return ToolCall(name=name, arguments=arguments)


def tag_safe_json(value: Any) -> str:
    """Returns ``value`` as JSON that cannot close an XML-like tag (``</`` is written ``<\\/``)."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")
