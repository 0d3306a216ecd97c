"""OpenAI Chat Completions (``POST /v1/chat/completions``): request parsing, the response
object and its stream of ``chat.completion.chunk`` events.

Supported: ``messages`` (system, developer, user, assistant with ``tool_calls``, tool, and
the legacy function role), ``tools`` / legacy ``functions`` (``tool_choice: "none"`` leaves
them out of the prompt; ``"required"`` or a named function starts the answer with the
``<tool_call>`` opening, and the name, see ``engine.forced_call_prefix``; a call to an
undeclared tool comes back as text), ``max_completion_tokens`` or ``max_tokens``,
``temperature``, ``top_p``, ``n``, ``stop``, ``seed``, ``logprobs`` (the sampled token's
log-probability; ``top_logprobs`` above 0, ``response_format`` other than text, a
``logit_bias`` or a penalty are refused with a 400), ``stream`` with ``stream_options.include_usage``. A stream
sends content deltas while the policy samples (token by token for a policy that decodes step
by step, ``Policy.generate_stream``; held back where it may still change, see
``serve/streaming.py``), SSE comments (``: keep-alive``) when nothing came for a while, then
the rest of the content, each tool call as a header delta and arguments deltas (or one
``{"error": ...}`` chunk when the policy failed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

from harnessrl.serve import fields
from harnessrl.serve.context import API_CHAT
from harnessrl.serve.engine import CompletionSet, InvalidRequest, ParsedRequest, new_id
from harnessrl.serve.streaming import text_pieces, unsent

TEXT_PARTS = ("text", "input_text", "output_text")
FINISH_REASONS = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


def _assistant_calls(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    calls = []
    given = message.get("tool_calls")
    for index, call in enumerate([] if given is None else fields.require_list(given, f"{where}.tool_calls")):
        at = f"{where}.tool_calls[{index}]"
        call = fields.require_dict(call, at)
        function = fields.require_dict(call.get("function"), f"{at}.function")
        name = fields.require_str(function.get("name"), f"{at}.function.name")
        arguments = fields.arguments_object(function.get("arguments"), f"{at}.function.arguments")
        calls.append({"id": str(call.get("id") or ""), "name": name, "arguments": arguments})
    legacy = message.get("function_call")
    if isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
        arguments = fields.arguments_object(legacy.get("arguments"), f"{where}.function_call.arguments")
        calls.append({"id": "", "name": legacy["name"], "arguments": arguments})
    return calls


def normalize_messages(value: Any) -> list[dict[str, Any]]:
    """Returns Chat Completions ``messages`` as normalized messages (see ``serve/context.py``)."""
    messages = fields.require_list(value, "messages")
    if not messages:
        raise InvalidRequest("'messages' must hold at least one message", "messages")
    names: dict[str, str] = {}  # tool_call_id -> tool name
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        message = fields.require_dict(message, where)
        role = message.get("role")
        # Content is required, except from an assistant that calls tools instead.
        if role != "assistant" or not (message.get("tool_calls") or message.get("function_call")):
            fields.required_content(message, where)
        content = fields.text_of_parts(message.get("content"), f"{where}.content", TEXT_PARTS)
        if role in ("system", "developer"):
            out.append({"role": "system", "content": content})
        elif role == "user":
            out.append({"role": "user", "content": content})
        elif role == "assistant":
            calls = _assistant_calls(message, where)
            names.update({call["id"]: call["name"] for call in calls})
            out.append({"role": "assistant", "content": content, "tool_calls": calls})
        elif role in ("tool", "function"):
            call_id = message.get("tool_call_id") or ""
            if not isinstance(call_id, str):
                raise InvalidRequest(f"'{where}.tool_call_id' must be a string", f"{where}.tool_call_id")
            name = message.get("name") if isinstance(message.get("name"), str) else names.get(call_id, "")
            out.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content, "is_error": False})
        else:
            raise InvalidRequest(
                f"'{where}.role' must be one of system, developer, user, assistant, tool; got {json.dumps(role)[:40]}",
                f"{where}.role",
            )
    return out


def normalize_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Returns the request's function tools (``tools`` and legacy ``functions``), normalized."""
    tools = []
    for index, tool in enumerate(fields.optional_list(body, "tools")):
        where = f"tools[{index}]"
        tool = fields.require_dict(tool, where)
        if tool.get("type", "function") != "function":
            continue  # built-in tool types (web search, ...) have no function to render
        function = fields.require_dict(tool.get("function"), f"{where}.function")
        tools.append(fields.function_tool(function.get("name"), function.get("description"), function.get("parameters"), f"{where}.function"))
    for index, function in enumerate(fields.optional_list(body, "functions")):
        where = f"functions[{index}]"
        function = fields.require_dict(function, where)
        tools.append(fields.function_tool(function.get("name"), function.get("description"), function.get("parameters"), where))
    if body.get("tool_choice") == "none" or body.get("function_call") == "none":
        return []
    return tools


def parse_chat_request(body: dict[str, Any]) -> ParsedRequest:
    """Returns the parsed request (raises ``InvalidRequest`` naming the bad field)."""
    fields.optional_str(body, "model")
    fields.optional_str(body, "user")
    fields.optional_bool(body, "parallel_tool_calls", default=True)
    messages = normalize_messages(body.get("messages"))
    tools = normalize_tools(body)
    forced = fields.openai_tool_choice(body, tools)
    max_tokens = fields.optional_int(body, "max_completion_tokens", minimum=1, maximum=fields.MAX_OUTPUT_TOKENS_FIELD)
    if max_tokens is None:
        max_tokens = fields.optional_int(body, "max_tokens", minimum=1, maximum=fields.MAX_OUTPUT_TOKENS_FIELD)
    temperature, top_p = fields.sampling(body, max_temperature=2.0)
    fields.optional_bool(body, "logprobs")
    fields.optional_int(body, "top_logprobs", minimum=0, maximum=20)
    # What the policy cannot do is refused, never ignored: it returns only the sampled
    # token's log-probability, samples no constrained format and applies no penalties.
    fields.refuse_unsupported(body, {
        "top_logprobs": lambda value: value == 0,
        "response_format": lambda value: isinstance(value, dict) and value.get("type") == "text",
        "logit_bias": lambda value: value == {},
        "presence_penalty": lambda value: value == 0,
        "frequency_penalty": lambda value: value == 0,
    })
    options = body.get("stream_options")
    if options is not None:
        fields.require_dict(options, "stream_options")
    return ParsedRequest(
        api=API_CHAT,
        messages=messages,
        tools=tools,
        forced_tool=forced,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=fields.optional_int(body, "seed"),
        stop=fields.string_list(body.get("stop"), "stop", limit=4),
        n=fields.optional_int(body, "n", minimum=1, maximum=16) or 1,
        stream=fields.optional_bool(body, "stream"),
        raw=body,
    )


def _openai_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
        for c in calls
    ]


def _usage(result: CompletionSet) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _logprobs(decode: Any, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(ids, logprobs, strict=True):
        token = decode([token_id])
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []})
    return {"content": content, "refusal": None}


def chat_response(result: CompletionSet, request: ParsedRequest, model: str, decode: Any) -> dict[str, Any]:
    """Returns the ``chat.completion`` object."""
    choices = []
    for index, choice in enumerate(result.choices):
        message: dict[str, Any] = {
            "role": "assistant",
            "content": choice.content if (choice.content or not choice.tool_calls) else None,
            "refusal": None,
        }
        if choice.tool_calls:
            message["tool_calls"] = _openai_calls(choice.tool_calls)
        choices.append({
            "index": index,
            "message": message,
            "finish_reason": FINISH_REASONS[choice.finish_reason],
            "logprobs": _logprobs(decode, choice.token_ids, choice.logprobs) if request.raw.get("logprobs") is True else None,
        })
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": _usage(result),
    }


def sse_data(payload: Any) -> str:
    """Returns one server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: every client skips it


def stream_error(message: str) -> str:
    """Returns the chunk of a stream whose policy failed after the stream began."""
    return sse_data({"error": {"message": message, "type": "server_error", "param": None, "code": None}}) + "data: [DONE]\n\n"


class ChatStream:
    """The server-sent events of one streamed chat completion: content deltas while the
    policy samples (``delta``), then the rest, the tool calls, the finish reasons, the usage
    and ``[DONE]`` (``rest``)."""

    def __init__(self, request: ParsedRequest, model: str) -> None:
        options = request.raw.get("stream_options") or {}
        self.include_usage = options.get("include_usage") is True
        self.base = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk", "created": int(time.time()), "model": model, "system_fingerprint": None}
        self.opened: set[int] = set()  # choices whose first (role) chunk went out

    def chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        payload = {**self.base, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if self.include_usage:
            payload["usage"] = None
        return sse_data(payload)

    def _open(self, index: int) -> Iterator[str]:
        if index not in self.opened:
            self.opened.add(index)
            yield self.chunk(index, {"role": "assistant", "content": "", "refusal": None})

    def delta(self, index: int, text: str) -> Iterator[str]:
        """Yields the chunks of ``text`` sampled for choice ``index`` while the policy works."""
        yield from self._open(index)
        yield self.chunk(index, {"content": text})

    def rest(self, result: CompletionSet, sent: Sequence[str]) -> Iterator[str]:
        """Yields the events after generation, ending with ``[DONE]``; ``sent`` holds each
        choice's content already streamed."""
        for index, choice in enumerate(result.choices):
            yield from self._open(index)
            for piece in text_pieces(unsent(choice.content, sent[index] if index < len(sent) else "")):
                yield self.chunk(index, {"content": piece})
            for position, call in enumerate(_openai_calls(choice.tool_calls)):
                header = {"index": position, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}
                yield self.chunk(index, {"tool_calls": [header]})
                for piece in text_pieces(call["function"]["arguments"]):
                    yield self.chunk(index, {"tool_calls": [{"index": position, "function": {"arguments": piece}}]})
            yield self.chunk(index, {}, FINISH_REASONS[choice.finish_reason])
        if self.include_usage:
            yield sse_data({**self.base, "choices": [], "usage": _usage(result)})
        yield "data: [DONE]\n\n"
