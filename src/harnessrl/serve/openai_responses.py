"""OpenAI Responses (``POST /v1/responses``): request parsing, the response object and its
stream of typed events, and ``previous_response_id`` chaining.

Supported: ``input`` as a string or items (messages with string or ``input_text`` /
``output_text`` parts; ``function_call`` and ``function_call_output``; ``custom_tool_call``
and ``custom_tool_call_output``; ``reasoning`` items are dropped), ``instructions``,
``tools`` of type ``function`` and ``custom`` (a custom tool is shown to the model as a
function with one string argument ``input``; built-in tools are left out; ``tool_choice:
"none"`` leaves them all out, ``"required"`` or a named tool forces a call, see
``engine.forced_call_prefix``; ``text.format`` other than text and ``top_logprobs`` are
refused), ``max_output_tokens``, ``temperature``, ``top_p``,
``stream``, ``previous_response_id`` (the earlier request's input and output are kept in
memory, the most recent ``ResponseStore.capacity`` of them). The stream begins with
``response.created`` and ``response.in_progress`` at once; the message item opens and its
``response.output_text.delta`` events go out while the policy samples (see
``serve/streaming.py``; SSE comments keep a silent stream alive); once the output is known,
the rest: per output item
``response.output_item.added`` / text or argument deltas / ``...done``, then
``response.completed`` (``response.incomplete`` when the output limit cut it;
``response.failed`` when the policy failed).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from harnessrl.serve import fields
from harnessrl.serve.context import API_RESPONSES
from harnessrl.serve.engine import CompletionSet, InvalidRequest, ParsedRequest, new_id
from harnessrl.serve.streaming import text_pieces, unsent

TEXT_PARTS = ("input_text", "output_text", "text")
CUSTOM_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's free-form input."}},
    "required": ["input"],
}


class ResponseStore:
    """The normalized messages (input and output) of recent responses, by response id."""

    capacity = 10_000

    def __init__(self) -> None:
        self._messages: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._messages[response_id] = messages
            while len(self._messages) > self.capacity:
                self._messages.popitem(last=False)

    def get(self, response_id: str) -> list[dict[str, Any]]:
        with self._lock:
            if response_id not in self._messages:
                raise InvalidRequest(f"Previous response with id '{response_id}' not found.", "previous_response_id")
            return list(self._messages[response_id])


def _output_text(value: Any, where: str) -> str:
    return fields.text_of_parts(value, where, TEXT_PARTS)


def normalize_input(body: dict[str, Any], store: ResponseStore) -> list[dict[str, Any]]:
    """Returns ``instructions``, the previous response's conversation and ``input`` as
    normalized messages (see ``serve/context.py``)."""
    out: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        out += [m for m in store.get(fields.require_str(previous, "previous_response_id")) if m.get("origin") != "instructions"]
    instructions = body.get("instructions")
    if instructions:
        out.insert(0, {"role": "system", "content": fields.require_str(instructions, "instructions"), "origin": "instructions"})
    value = body.get("input")
    if isinstance(value, str):
        items: list[Any] = [{"role": "user", "content": value}]
    else:
        items = fields.require_list(value, "input")
    names: dict[str, str] = {}
    for index, item in enumerate(items):
        where = f"input[{index}]"
        item = fields.require_dict(item, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            content = _output_text(fields.required_content(item, where), f"{where}.content")
            if role in ("system", "developer"):
                out.append({"role": "system", "content": content})
            elif role == "user":
                out.append({"role": "user", "content": content})
            elif role == "assistant":
                out.append({"role": "assistant", "content": content, "tool_calls": []})
            else:
                raise InvalidRequest(f"'{where}.role' must be one of user, assistant, system, developer", f"{where}.role")
        elif kind in ("function_call", "custom_tool_call"):
            name = fields.require_str(item.get("name"), f"{where}.name")
            call_id = fields.require_str(item.get("call_id"), f"{where}.call_id")
            if kind == "function_call":
                arguments = fields.arguments_object(item.get("arguments"), f"{where}.arguments")
            else:
                arguments = {"input": fields.require_str(item.get("input", ""), f"{where}.input")}
            names[call_id] = name
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": "", "tool_calls": []})
            out[-1]["tool_calls"].append({"id": call_id, "name": name, "arguments": arguments})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = fields.require_str(item.get("call_id"), f"{where}.call_id")
            output = _output_text(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "name": names.get(call_id, ""), "content": output, "is_error": False})
        elif not isinstance(kind, str):
            raise InvalidRequest(f"'{where}.type' must be a string", f"{where}.type")
        # reasoning, item_reference and other item types carry nothing to render
    if not any(m["role"] != "system" for m in out):
        raise InvalidRequest("'input' must hold at least one item", "input")
    return out


def normalize_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], set[str]]:
    """Returns the function and custom tools, normalized, and the names of the custom ones."""
    tools, custom = [], set()
    for index, tool in enumerate(fields.optional_list(body, "tools")):
        where = f"tools[{index}]"
        tool = fields.require_dict(tool, where)
        kind = tool.get("type")
        if kind == "function":
            tools.append(fields.function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), where))
        elif kind == "custom":
            tools.append(fields.function_tool(tool.get("name"), tool.get("description"), CUSTOM_INPUT_SCHEMA, where))
            custom.add(tool["name"])
    if body.get("tool_choice") == "none":
        return [], set()
    return tools, custom


def _plain_text_format(text: Any) -> bool:
    """Whether a ``text`` field asks for plain text (the only output format served)."""
    if not isinstance(text, dict):
        return True  # not an object: nothing asked for (the field is not otherwise read)
    format_ = text.get("format")
    return format_ is None or (isinstance(format_, dict) and format_.get("type") == "text")


def parse_responses_request(body: dict[str, Any], store: ResponseStore) -> ParsedRequest:
    """Returns the parsed request (raises ``InvalidRequest`` naming the bad field)."""
    fields.optional_str(body, "model")
    fields.optional_dict(body, "metadata")
    messages = normalize_input(body, store)
    tools, custom = normalize_tools(body)
    forced = fields.openai_tool_choice(body, tools)
    # What the policy cannot do is refused, never ignored (see ``openai_chat``).
    fields.refuse_unsupported(body, {"top_logprobs": lambda value: value == 0, "text": _plain_text_format})
    temperature, top_p = fields.sampling(body, max_temperature=2.0)
    return ParsedRequest(
        api=API_RESPONSES,
        messages=[{k: v for k, v in m.items() if k != "origin"} for m in messages],
        tools=tools,
        forced_tool=forced,
        max_tokens=fields.optional_int(body, "max_output_tokens", minimum=1, maximum=fields.MAX_OUTPUT_TOKENS_FIELD),
        temperature=temperature,
        top_p=top_p,
        stream=fields.optional_bool(body, "stream"),
        raw=body,
        state={"custom_tools": custom, "history": messages},
    )


def output_items(result: CompletionSet, custom: set[str]) -> list[dict[str, Any]]:
    """Returns the output items of a completion: a message (when it has text or no calls),
    then one ``function_call`` / ``custom_tool_call`` item per call."""
    choice = result.choices[0]
    items: list[dict[str, Any]] = []
    if choice.content or not choice.tool_calls:
        part = {"type": "output_text", "text": choice.content, "annotations": [], "logprobs": []}
        items.append({"id": new_id("msg_"), "type": "message", "status": "completed", "role": "assistant", "content": [part]})
    for call in choice.tool_calls:
        if call["name"] in custom:
            value = call["arguments"].get("input")
            items.append({
                "id": new_id("ctc_"), "type": "custom_tool_call", "status": "completed", "call_id": call["id"],
                "name": call["name"], "input": value if isinstance(value, str) else json.dumps(call["arguments"]),
            })
        else:
            items.append({
                "id": new_id("fc_"), "type": "function_call", "status": "completed", "call_id": call["id"],
                "name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False),
            })
    return items


def response_skeleton(request: ParsedRequest, model: str, response_id: str) -> dict[str, Any]:
    """Returns the ``response`` object before its output is known (status ``in_progress``)."""
    body = request.raw
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "incomplete_details": None,
        "error": None,
        "model": model,
        "output": [],
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "max_output_tokens": body.get("max_output_tokens"),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": None,
    }


def response_object(
    result: CompletionSet, request: ParsedRequest, model: str, store: ResponseStore, skeleton: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Returns the finished ``response`` object (and remembers its conversation for
    ``previous_response_id``); ``skeleton`` is the one a stream began with."""
    choice = result.choices[0]
    response = dict(skeleton) if skeleton is not None else response_skeleton(request, model, new_id("resp_"))
    incomplete = choice.finish_reason == "length"
    reply = {"role": "assistant", "content": choice.content, "tool_calls": choice.tool_calls}
    store.put(response["id"], [*request.state["history"], reply])
    response.update({
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output_items(result, request.state["custom_tools"]),
        "usage": {
            "input_tokens": result.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(choice.token_ids),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + len(choice.token_ids),
        },
    })
    return response


class ResponseEvents:
    """The typed server-sent events of one streamed response, numbered in order: the text of
    its message while the policy samples (``delta``), then the events that build up the
    finished response (``rest``)."""

    def __init__(self) -> None:
        self.sequence = 0
        self.message_id: str | None = None  # the streamed message item, once it has begun

    def event(self, kind: str, **payload: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def start(self, skeleton: dict[str, Any]) -> list[str]:
        """Returns the events sent before the output is known."""
        return [self.event("response.created", response=skeleton), self.event("response.in_progress", response=skeleton)]

    def delta(self, index: int, text: str) -> Iterator[str]:
        """Yields the events of ``text`` sampled while the policy works (``index``: the
        choice, always 0 here); the first opens the message item and its text part."""
        if self.message_id is None:
            self.message_id = new_id("msg_")
            item = {"id": self.message_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            yield self.event("response.output_item.added", output_index=0, item=item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield self.event("response.content_part.added", item_id=self.message_id, output_index=0, content_index=0, part=part)
        yield self.event("response.output_text.delta", item_id=self.message_id, output_index=0, content_index=0, delta=text, logprobs=[])

    def rest(self, response: dict[str, Any], sent: str = "") -> Iterator[str]:
        """Yields the events that build up the finished ``response``; ``sent`` is the text
        of its message already streamed."""
        event = self.event
        for index, item in enumerate(response["output"]):
            started = index == 0 and item["type"] == "message" and self.message_id is not None
            if started:
                item["id"] = self.message_id  # the id its streamed events carried
            at = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                part = item["content"][0]
                if not started:
                    yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
                    yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
                for piece in text_pieces(unsent(part["text"], sent if started else "")):
                    yield event("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
                yield event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
                yield event("response.content_part.done", **at, content_index=0, part=part)
            elif item["type"] == "function_call":
                yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""})
                for piece in text_pieces(item["arguments"]):
                    yield event("response.function_call_arguments.delta", **at, delta=piece)
                yield event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
            else:
                yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "input": ""})
                for piece in text_pieces(item["input"]):
                    yield event("response.custom_tool_call_input.delta", **at, delta=piece)
                yield event("response.custom_tool_call_input.done", **at, input=item["input"])
            yield event("response.output_item.done", output_index=index, item=item)
        final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield event(final, response=response)

    def failed(self, skeleton: dict[str, Any], message: str) -> str:
        """Returns the ``response.failed`` event of a stream whose policy failed."""
        error = {"code": "server_error", "message": message}
        return self.event("response.failed", response={**skeleton, "status": "failed", "error": error})
