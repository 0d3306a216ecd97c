"""``tool_choice`` through the official clients: a forced tool call starts the answer with the
``<tool_call>`` opening (and the tool's name when one is named), ``none`` hides the tools,
what cannot be honoured is a 400 naming it; a call to an undeclared tool comes back as text;
sampling options the policy cannot honour are refused, not ignored."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from harnessrl.harness.chat import ByteTokenizer
from harnessrl.policy.base import Generation, Policy
from serve_helpers import WEATHER_TOOL, running

TIME_TOOL = {"name": "get_time", "description": "Returns the time.", "parameters": {"type": "object", "properties": {}}}
CHAT_TOOLS = [{"type": "function", "function": tool} for tool in (WEATHER_TOOL, TIME_TOOL)]
ANTHROPIC_TOOLS = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in (WEATHER_TOOL, TIME_TOOL)]
RESPONSES_TOOLS = [{"type": "function", **tool} for tool in (WEATHER_TOOL, TIME_TOOL)]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


class ContinuingPolicy(Policy):
    """Continues the prompt it is given, as a model would: after a forced tool's name it
    writes the arguments, after a forced opening it picks ``get_time``, otherwise it answers
    with ``free_answer`` (plain text unless told otherwise)."""

    name = "continuing"

    def __init__(self, free_answer: str = "It is sunny, I think.") -> None:
        self.tokenizer = ByteTokenizer()
        self.free_answer = free_answer
        self.prompts: list[str] = []

    def generate(self, requests):
        out = []
        for request in requests:
            prompt = self.tokenizer.decode(request.prompt_ids)
            self.prompts.append(prompt)
            if prompt.endswith('"name": "get_weather", "arguments": '):
                text = '{"city": "Paris"}}\n</tool_call>'
            elif prompt.endswith('<tool_call>\n{"name": "'):
                text = 'get_time", "arguments": {}}\n</tool_call>'
            else:
                text = self.free_answer
            ids = [*self.tokenizer.encode(text), self.tokenizer.stop_token_ids[0]]
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


def test_chat_named_tool_choice_forces_that_tool():
    with running(ContinuingPolicy()) as (server, policy, _):
        reply = openai_client(server).chat.completions.create(
            model="m", messages=QUESTION, tools=CHAT_TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert policy.prompts[0].endswith('<tool_call>\n{"name": "get_weather", "arguments": ')


def test_chat_required_tool_choice_forces_a_call_and_streams_it():
    with running(ContinuingPolicy()) as (server, _, _):
        client = openai_client(server)
        reply = client.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS, tool_choice="required")
        chunks = list(client.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS, tool_choice="required", stream=True))
        free = client.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS, tool_choice="auto")
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_time"]
    streamed = [call.function.name for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or [] if call.function.name]
    assert streamed == ["get_time"]
    assert not "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert free.choices[0].message.tool_calls is None and free.choices[0].message.content == "It is sunny, I think."


def test_chat_tool_choice_none_hides_the_tools():
    with running(ContinuingPolicy()) as (server, policy, _):
        openai_client(server).chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS, tool_choice="none")
    assert "get_weather" not in policy.prompts[0] and "<tools>" not in policy.prompts[0]


@pytest.mark.parametrize(("arguments", "named"), [
    ({"tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm_rf"}}}, "rm_rf"),
    ({"tool_choice": "required"}, "declares no tools"),
    ({"tools": CHAT_TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}}, "allowed_tools"),
    ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
])
def test_chat_refuses_what_it_cannot_honour_with_a_400_naming_it(arguments, named):
    with running(ContinuingPolicy()) as (server, _, _), pytest.raises(openai.BadRequestError) as caught:
        openai_client(server).chat.completions.create(model="m", messages=QUESTION, **arguments)
    assert named in caught.value.message


def test_chat_accepts_the_neutral_values_of_unsupported_options():
    with running(ContinuingPolicy()) as (server, _, _):
        reply = openai_client(server).chat.completions.create(
            model="m", messages=QUESTION, top_logprobs=0, logprobs=True, response_format={"type": "text"},
            presence_penalty=0, frequency_penalty=0, logit_bias={},
        )
    assert reply.choices[0].message.content == "It is sunny, I think."


def test_a_call_to_an_undeclared_tool_comes_back_as_text_and_is_counted():
    answer = 'Moving it.\n<tool_call>\n{"name": "mv", "arguments": {"from": "a", "to": "b"}}\n</tool_call>'
    with running(ContinuingPolicy(free_answer=answer)) as (server, _, _):
        client = openai_client(server)
        reply = client.chat.completions.create(model="m", messages=QUESTION, tools=CHAT_TOOLS)
        message = anthropic_client(server).messages.create(model="m", max_tokens=100, messages=QUESTION, tools=ANTHROPIC_TOOLS)
        health = httpx.get(server.base_url + "/health").json()
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == answer
    assert message.stop_reason == "end_turn" and [b.type for b in message.content] == ["text"]
    assert message.content[0].text == answer
    assert health["undeclared_tool_calls"] == 2


def test_anthropic_tool_choice_tool_and_any_force_a_call():
    with running(ContinuingPolicy()) as (server, _, _):
        client = anthropic_client(server)
        named = client.messages.create(model="m", max_tokens=100, messages=QUESTION, tools=ANTHROPIC_TOOLS,
                                       tool_choice={"type": "tool", "name": "get_weather"})
        any_tool = client.messages.create(model="m", max_tokens=100, messages=QUESTION, tools=ANTHROPIC_TOOLS,
                                          tool_choice={"type": "any"})
        with pytest.raises(anthropic.BadRequestError) as unknown:
            client.messages.create(model="m", max_tokens=100, messages=QUESTION, tools=ANTHROPIC_TOOLS,
                                   tool_choice={"type": "tool", "name": "rm_rf"})
        with pytest.raises(anthropic.BadRequestError) as top_k:
            client.messages.create(model="m", max_tokens=100, messages=QUESTION, extra_body={"top_k": 5})
    assert named.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in named.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
    assert [b.name for b in any_tool.content if b.type == "tool_use"] == ["get_time"]
    assert "rm_rf" in unknown.value.message and "top_k" in top_k.value.message


def test_responses_tool_choice_forces_a_call_and_refuses_structured_output():
    with running(ContinuingPolicy()) as (server, _, _):
        client = openai_client(server)
        named = client.responses.create(model="m", input="Weather in Paris?", tools=RESPONSES_TOOLS,
                                        tool_choice={"type": "function", "name": "get_weather"})
        required = client.responses.create(model="m", input="Weather in Paris?", tools=RESPONSES_TOOLS, tool_choice="required")
        with pytest.raises(openai.BadRequestError) as structured:
            client.responses.create(model="m", input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})
    assert [(i.name, json.loads(i.arguments)) for i in named.output if i.type == "function_call"] == [("get_weather", {"city": "Paris"})]
    assert [i.name for i in required.output if i.type == "function_call"] == ["get_time"]
    assert "text" in structured.value.message
