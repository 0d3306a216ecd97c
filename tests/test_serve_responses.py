"""The OpenAI Responses endpoint through the official openai client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from serve_helpers import WEATHER_TOOL, Scripted, running

TOOLS = [{"type": "function", **WEATHER_TOOL}]


def client(server, path: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + path, api_key="anything", max_retries=0)


def test_response_from_string_input_with_instructions():
    with running() as (server, policy, _):
        response = client(server).responses.create(model="m", input="good morning", instructions="Be kind.")
    assert response.status == "completed"
    assert response.output_text == "echo: good morning"
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage.output_tokens == len("echo: good morning") + 1
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert policy.contexts[0].api == "responses"
    assert policy.contexts[0].messages == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "good morning"}]


def test_function_call_items_round_trip():
    with running() as (server, policy, recorder):
        api = client(server)
        items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Cairo?"}]}]
        first = api.responses.create(model="m", input=items, tools=TOOLS)
        message, call = first.output
        assert message.content[0].text == "Let me check."
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Cairo"}
        items += [item.model_dump(exclude_none=True) for item in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "hot"})
        second = api.responses.create(model="m", input=items, tools=TOOLS)
    assert second.output_text == "The weather is hot."
    assert policy.contexts[1].messages[-1]["content"] == "hot"
    assert policy.contexts[1].messages[-2]["tool_calls"][0]["name"] == "get_weather"
    (session,) = recorder.sessions()  # the second request continued the first
    assert len(recorder.to_trajectory(session).training_samples()) == 1


def test_previous_response_id_chains_the_conversation():
    with running() as (server, policy, _):
        api = client(server)
        first = api.responses.create(model="m", input="Weather in Baku?", tools=TOOLS, instructions="Old.")
        call = first.output[-1]
        second = api.responses.create(
            model="m", previous_response_id=first.id, tools=TOOLS, instructions="New.",
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "mild"}],
        )
        assert second.output_text == "The weather is mild."
        roles = [m["role"] for m in policy.contexts[1].messages]
        assert roles == ["system", "user", "assistant", "tool"]
        assert policy.contexts[1].messages[0]["content"] == "New."
        with pytest.raises(openai.BadRequestError) as caught:
            api.responses.create(model="m", previous_response_id="resp_missing", input="x")
    assert caught.value.body["param"] == "previous_response_id"


def test_streaming_events_build_the_response():
    with running() as (server, _, _):
        events = list(client(server).responses.create(model="m", input="Weather in Doha?", tools=TOOLS, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert text == "Let me check." and json.loads(arguments) == {"city": "Doha"}
    final = events[-1].response
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.usage.output_tokens > 10


def test_custom_tools_come_back_as_custom_tool_calls():
    def patch(context):
        if context.messages[-1]["role"] == "tool":
            return "patched"
        return '<tool_call>{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}</tool_call>'

    custom = {"type": "custom", "name": "apply_patch", "description": "Applies a patch."}
    with running(Scripted(patch)) as (server, policy, _):
        api = client(server)
        first = api.responses.create(model="m", input="fix it", tools=[custom])
        (call,) = first.output
        assert call.type == "custom_tool_call" and call.input == "*** Begin Patch"
        second = api.responses.create(model="m", tools=[custom], input=[
            {"role": "user", "content": "fix it"}, call.model_dump(exclude_none=True),
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"},
        ])
    assert second.output_text == "patched"
    assert policy.contexts[0].tools[0]["parameters"]["required"] == ["input"]


def test_output_limit_and_context_overflow():
    with running(Scripted(lambda context: "z" * 300), context_length=250) as (server, _, _):
        api = client(server)
        cut = api.responses.create(model="m", input="a", max_output_tokens=16)
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
        assert cut.usage.output_tokens == 16
        with pytest.raises(openai.BadRequestError) as caught:
            api.responses.create(model="m", input="q" * 300)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "input"


def test_malformed_responses_requests_get_openai_shaped_400s():
    with running() as (server, _, _):
        url = server.base_url + "/v1/responses"
        for body in ({}, {"input": 5}, {"input": []}, {"input": [{"type": "function_call", "name": "f"}]},
                     {"input": "x", "max_output_tokens": "many"}, {"input": [{"role": "robot", "content": "x"}]}):
            response = httpx.post(url, json=body)
            assert response.status_code == 400, body
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_sdk_stream_helper_accumulates_the_same_response():
    with running() as (server, _, _), client(server).responses.stream(
        model="m", input="Weather in Nuuk?", tools=TOOLS
    ) as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output_text == "Let me check."
    assert json.loads(final.output[1].arguments) == {"city": "Nuuk"}
