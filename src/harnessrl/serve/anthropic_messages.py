"""Anthropic Messages (``POST /v1/messages``, with or without ``?beta=true``, and
``/v1/messages/count_tokens``): request parsing, the message object and its event stream.

Supported: ``system`` as a string or text blocks; ``messages`` whose content is a string or
blocks (``text``; ``tool_use`` from the assistant; ``tool_result`` with a string or blocks as
content, and ``is_error``; images and documents become a ``[image]``-style placeholder;
``thinking`` blocks are dropped); a ``system`` role mid-conversation; ``tools`` with
``input_schema`` (server tools without a schema are left out; ``tool_choice: {"type":
"none"}`` leaves them all out, ``any`` or ``tool`` forces a call, see
``engine.forced_call_prefix``); ``max_tokens``; ``stop_sequences``; ``temperature``;
``top_p`` (``top_k`` is refused); ``stream``; ``max_tokens`` is required (not by ``count_tokens``); a final assistant message (without tool calls) is a prefill: the
prompt ends with it and the answer holds only its continuation. The stream begins with ``message_start`` and ``ping`` events at once
(and a ``ping`` whenever nothing came for a few seconds); the text block's
``content_block_start`` and ``text_delta`` events go out while the policy samples (see
``serve/streaming.py``); once the completion is known, the rest: per block
``content_block_start`` / deltas (``text_delta``, ``input_json_delta``) /
``content_block_stop``, then ``message_delta`` with the stop reason and ``message_stop``
(or an ``error`` event when the policy failed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from harnessrl.serve import fields
from harnessrl.serve.context import API_MESSAGES
from harnessrl.serve.engine import Completion, CompletionSet, InvalidRequest, ParsedRequest, new_id
from harnessrl.serve.streaming import text_pieces, unsent

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "stop_sequence": "stop_sequence", "tool_calls": "tool_use"}
IGNORED_BLOCKS = ("thinking", "redacted_thinking")


def _user_content(content: Any, where: str) -> list[dict[str, Any]]:
    """Returns a user message's content as normalized messages: one tool message per
    ``tool_result`` block and user messages for the text around them, in order."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts.clear()

    for index, block in enumerate(fields.require_list(content, f"{where}.content")):
        at = f"{where}.content[{index}]"
        block = fields.require_dict(block, at)
        kind = block.get("type")
        if kind == "tool_result":
            flush()
            call_id = fields.require_str(block.get("tool_use_id"), f"{at}.tool_use_id")
            text = fields.text_of_parts(block.get("content"), f"{at}.content", ("text",))
            is_error = fields.optional_bool(block, "is_error")
            out.append({"role": "tool", "tool_call_id": call_id, "name": "", "content": text, "is_error": is_error})
        elif kind == "text":
            texts.append(fields.require_str(block.get("text"), f"{at}.text"))
        elif kind in IGNORED_BLOCKS:
            continue
        elif isinstance(kind, str):
            texts.append(f"[{kind}]")
        else:
            raise InvalidRequest(f"'{at}.type' must be a string", f"{at}.type")
    flush()
    return out


def _assistant_content(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content, "tool_calls": []}
    texts, calls = [], []
    for index, block in enumerate(fields.require_list(content, f"{where}.content")):
        at = f"{where}.content[{index}]"
        block = fields.require_dict(block, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(fields.require_str(block.get("text"), f"{at}.text"))
        elif kind == "tool_use":
            name = fields.require_str(block.get("name"), f"{at}.name")
            arguments = fields.require_dict(block.get("input", {}), f"{at}.input")
            calls.append({"id": str(block.get("id") or ""), "name": name, "arguments": arguments})
        elif not isinstance(kind, str):
            raise InvalidRequest(f"'{at}.type' must be a string", f"{at}.type")
    return {"role": "assistant", "content": "\n".join(texts), "tool_calls": calls}


def normalize_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Returns ``system`` and ``messages`` as normalized messages (see ``serve/context.py``)."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None and system != "" and system != []:
        out.append({"role": "system", "content": fields.text_of_parts(system, "system", ("text",))})
    messages = fields.require_list(body.get("messages"), "messages")
    if not messages:
        raise InvalidRequest("messages: at least one message is required", "messages")
    names: dict[str, str] = {}
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        message = fields.require_dict(message, where)
        role = message.get("role")
        content = fields.required_content(message, where)
        if role == "user":
            for item in _user_content(content, where):
                if item["role"] == "tool":
                    item["name"] = names.get(item["tool_call_id"], "")
                out.append(item)
        elif role == "assistant":
            item = _assistant_content(content, where)
            names.update({call["id"]: call["name"] for call in item["tool_calls"]})
            out.append(item)
        elif role == "system":
            out.append({"role": "system", "content": fields.text_of_parts(content, f"{where}.content", ("text",))})
        else:
            raise InvalidRequest(f"{where}.role: Input should be 'user' or 'assistant'", f"{where}.role")
    return out


def normalize_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Returns the client tools with an input schema, normalized."""
    choice = body.get("tool_choice")
    tools = []
    if choice is not None and not (isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none")):
        raise InvalidRequest("tool_choice: must be an object with type auto, any, tool or none", "tool_choice")
    for index, tool in enumerate(fields.optional_list(body, "tools")):
        where = f"tools.{index}"
        tool = fields.require_dict(tool, where)
        if "input_schema" not in tool and tool.get("type") not in (None, "custom"):
            continue  # a server tool (web search, ...): nothing the model could call here
        tools.append(fields.function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), where))
    if isinstance(choice, dict) and choice.get("type") == "none":
        return []
    return tools


def forced_tool(choice: Any, tools: list[dict[str, Any]]) -> str | None:
    """Returns the tool ``tool_choice`` forces (``any``: ``""``; ``tool``: its name; else
    None); ``normalize_tools`` has checked its shape."""
    if not isinstance(choice, dict) or choice.get("type") not in ("any", "tool"):
        return None
    if choice["type"] == "any":
        return fields.forced_tool("", tools, "tool_choice")
    name = choice.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("tool_choice.name: a tool choice of type tool names the tool", "tool_choice.name")
    return fields.forced_tool(name, tools, "tool_choice")


def parse_messages_request(body: dict[str, Any], count_only: bool = False) -> ParsedRequest:
    """Returns the parsed request (raises ``InvalidRequest`` naming the bad field)."""
    fields.optional_str(body, "model")
    fields.optional_dict(body, "metadata")
    messages = normalize_messages(body)
    tools = normalize_tools(body)
    prefill = ""
    if messages[-1]["role"] == "assistant" and not messages[-1]["tool_calls"]:
        # A final assistant message is the start of the answer: the model continues it.
        prefill = messages.pop()["content"]
        if not any(m["role"] != "system" for m in messages):
            raise InvalidRequest("messages: the first message must use the \"user\" role", "messages")
    if count_only:
        return ParsedRequest(api=API_MESSAGES, messages=messages, tools=tools, raw=body, prefill=prefill)
    if body.get("max_tokens") is None:
        raise InvalidRequest("max_tokens: Field required", "max_tokens")
    fields.optional_int(body, "top_k", minimum=0)
    # Top-k filtering is not in the policy's sampling parameters: refused, not ignored.
    fields.refuse_unsupported(body, {"top_k": lambda value: False})
    temperature, top_p = fields.sampling(body, max_temperature=1.0)
    return ParsedRequest(
        api=API_MESSAGES,
        messages=messages,
        tools=tools,
        forced_tool=forced_tool(body.get("tool_choice"), tools),
        max_tokens=fields.optional_int(body, "max_tokens", minimum=1, maximum=fields.MAX_OUTPUT_TOKENS_FIELD),
        temperature=temperature,
        top_p=top_p,
        stop=fields.string_list(body.get("stop_sequences"), "stop_sequences", limit=64),
        stream=fields.optional_bool(body, "stream"),
        raw=body,
        prefill=prefill,
    )


def _blocks(choice: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if choice.content or not choice.tool_calls:
        blocks.append({"type": "text", "text": choice.content})
    for call in choice.tool_calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["name"], "input": call["arguments"]})
    return blocks


def _usage(prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens, "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
    }


def message_response(result: CompletionSet, model: str, message_id: str | None = None) -> dict[str, Any]:
    """Returns the ``message`` object."""
    choice = result.choices[0]
    return {
        "id": message_id or new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(choice),
        "stop_reason": STOP_REASONS[choice.finish_reason],
        "stop_sequence": choice.stop_sequence,
        "usage": _usage(result.prompt_tokens, len(choice.token_ids)),
    }


def sse_event(name: str, payload: dict[str, Any]) -> str:
    """Returns one named server-sent event."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


PING = sse_event("ping", {"type": "ping"})


def message_stream_start(message_id: str, model: str, prompt_tokens: int) -> list[str]:
    """Returns the events sent before the completion is known: ``message_start`` and a ping."""
    start = {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": _usage(prompt_tokens, 1),
    }
    return [sse_event("message_start", {"type": "message_start", "message": start}), PING]


class MessageStream:
    """The content events of one streamed message: text deltas of block 0 while the policy
    samples (``delta``), then the rest of the blocks, ``message_delta`` and ``message_stop``
    (``rest``)."""

    def __init__(self) -> None:
        self.text_open = False  # whether block 0 (text) has started

    def delta(self, index: int, text: str) -> Iterator[str]:
        """Yields the events of ``text`` sampled while the policy works (``index``: the
        choice, always 0 here)."""
        if not self.text_open:
            self.text_open = True
            opening = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            yield sse_event("content_block_start", opening)
        yield sse_event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})

    def rest(self, result: CompletionSet, sent: Sequence[str]) -> Iterator[str]:
        """Yields the events after generation; ``sent`` holds the text already streamed."""
        choice = result.choices[0]
        for index, block in enumerate(_blocks(choice)):
            started = index == 0 and self.text_open
            if block["type"] == "text":
                opening: dict[str, Any] = {"type": "text", "text": ""}
                remainder = unsent(block["text"], sent[0] if started and sent else "")
                deltas = [{"type": "text_delta", "text": piece} for piece in text_pieces(remainder)]
            else:
                opening = {**block, "input": {}}
                arguments = json.dumps(block["input"], ensure_ascii=False)
                deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in text_pieces(arguments)]
            if not started:
                yield sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening})
            for delta in deltas:
                yield sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            yield sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
        yield sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[choice.finish_reason], "stop_sequence": choice.stop_sequence},
            "usage": {"output_tokens": len(choice.token_ids)},
        })
        yield sse_event("message_stop", {"type": "message_stop"})


def stream_error(message: str) -> str:
    """Returns the ``error`` event of a stream that failed after it began."""
    return sse_event("error", {"type": "error", "error": {"type": "api_error", "message": message}})
