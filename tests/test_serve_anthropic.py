"""The Anthropic Messages endpoint through the official anthropic client."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from harnessrl.harness.chat import ByteTokenizer
from harnessrl.serve.prompt import PromptRenderer
from serve_helpers import WEATHER_TOOL, Scripted, running

TOOLS = [{"name": WEATHER_TOOL["name"], "description": WEATHER_TOOL["description"], "input_schema": WEATHER_TOOL["parameters"]}]


def client(server, path: str = "", **kwargs) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url + path, api_key=kwargs.pop("api_key", "anything"), max_retries=0, **kwargs)


def test_message_with_system_blocks_returns_text_and_real_usage():
    with running() as (server, policy, _):
        reply = client(server).messages.create(
            model="claude-test", max_tokens=100,
            system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        )
    assert reply.type == "message" and reply.role == "assistant"
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == "echo: hello"
    assert reply.stop_reason == "end_turn"
    expected = PromptRenderer(ByteTokenizer()).render(
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}], []
    )
    assert reply.usage.input_tokens == len(expected)
    assert reply.usage.output_tokens == len("echo: hello") + 1
    assert policy.contexts[0].api == "messages"


def test_tool_use_round_trip_with_tool_result_as_string_and_as_blocks():
    with running() as (server, policy, recorder):
        api = client(server)
        messages = [{"role": "user", "content": "Weather in Rome?"}]
        first = api.messages.create(model="m", max_tokens=200, messages=messages, tools=TOOLS)
        assert first.stop_reason == "tool_use"
        text, tool_use = first.content
        assert text.text == "Let me check."
        assert tool_use.type == "tool_use" and tool_use.name == "get_weather" and tool_use.input == {"city": "Rome"}
        assert tool_use.id.startswith("toolu_")
        assistant = {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]}
        as_string = [*messages, assistant, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_use.id, "content": "windy"}]}]
        second = api.messages.create(model="m", max_tokens=200, messages=as_string, tools=TOOLS)
        assert second.content[0].text == "The weather is windy."
        as_blocks = [*messages, assistant, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_use.id, "is_error": True,
             "content": [{"type": "text", "text": "rain"}, {"type": "text", "text": "later"}]}]}]
        third = api.messages.create(model="m", max_tokens=200, messages=as_blocks, tools=TOOLS)
    assert third.content[0].text == "The weather is rain\nlater."
    result = policy.contexts[2].messages[-1]
    assert result == {"role": "tool", "tool_call_id": tool_use.id, "name": "get_weather", "content": "rain\nlater", "is_error": True}
    # The third request branches off after the first reply: a conversation of its own, whose
    # prompt renders that reply from the ids the policy sampled for it.
    first_session, branch = recorder.sessions()
    first_record, second_record = recorder.records(first_session)
    (branch_record,) = recorder.records(branch)
    for record in (second_record, branch_record):
        turn = recorder.to_trajectory(first_session).turns[0]
        labels = [label for label, count in record["prompt_spans"] for _ in range(count)]
        policy_ids = [i for i, label in zip(record["prompt_ids"], labels, strict=True) if label == "policy"]
        assert policy_ids == turn.completion_ids == first_record["completion_ids"]


def test_streaming_message_with_text_and_tool_use_blocks():
    with running() as (server, _, _), client(server).messages.stream(
        model="m", max_tokens=200, messages=[{"role": "user", "content": "Weather in Lima?"}], tools=TOOLS
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "input_json", "text", "content_block_stop", "message_delta"} <= set(kinds)
    assert [block.type for block in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Let me check."
    assert final.content[1].input == {"city": "Lima"}
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens > 10


def test_raw_stream_events_carry_input_json_deltas():
    with running() as (server, _, _):
        events = list(client(server).messages.create(
            model="m", max_tokens=200, messages=[{"role": "user", "content": "Weather in Kyiv?"}], tools=TOOLS, stream=True
        ))
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    partial = "".join(d.partial_json for d in deltas if d.type == "input_json_delta")
    assert partial == '{"city": "Kyiv"}'
    stop = next(e for e in events if e.type == "message_delta")
    assert stop.delta.stop_reason == "tool_use"


def test_beta_route_mid_conversation_system_and_stop_sequences():
    with running(Scripted(lambda context: "one two THREE four")) as (server, policy, _):
        reply = client(server).beta.messages.create(
            model="m", max_tokens=50, stop_sequences=["THREE"],
            messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "system", "content": "Now be formal."}, {"role": "user", "content": "c"}],
        )
    assert reply.content[0].text == "one two "
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "THREE"
    assert [m["role"] for m in policy.contexts[0].messages] == ["user", "assistant", "system", "user"]


def test_max_tokens_and_prompt_too_long():
    with running(Scripted(lambda context: "x" * 500), context_length=300) as (server, _, _):
        api = client(server)
        short = api.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 5
        with pytest.raises(anthropic.BadRequestError) as caught:
            api.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "y" * 400}])
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    prompt = len(PromptRenderer(ByteTokenizer()).render([{"role": "user", "content": "y" * 400}], []))
    assert body["error"]["message"] == f"prompt is too long: {prompt} tokens > 300 maximum"


def test_count_tokens_and_models_list():
    with running() as (server, _, _):
        api = client(server)
        counted = api.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}], tools=TOOLS)
        models = api.models.list()
    expected = PromptRenderer(ByteTokenizer()).render([{"role": "user", "content": "hello"}], [
        {"name": "get_weather", "description": WEATHER_TOOL["description"], "parameters": WEATHER_TOOL["parameters"]}])
    assert counted.input_tokens == len(expected)
    assert [m.id for m in models.data] == ["test-model"]


def test_malformed_messages_requests_get_anthropic_shaped_errors():
    with running(api_key="k") as (server, _, _):
        url = server.base_url + "/v1/messages"
        headers = {"x-api-key": "k"}
        assert httpx.post(url, json={"messages": []}, headers={"x-api-key": "bad"}).json()["error"]["type"] == "authentication_error"
        for body in ({"max_tokens": 5}, {"messages": "hi"}, {"messages": [{"role": "bot", "content": "x"}]},
                     {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
                     {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
                     {"messages": [{"role": "user", "content": "x"}], "temperature": 3}):
            response = httpx.post(url, json=body, headers=headers)
            assert response.status_code == 400, body
            assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
        broken = httpx.post(url, content=b"{", headers=headers)
        assert broken.status_code == 400 and broken.json()["type"] == "error"


def test_final_assistant_message_is_a_prefill_the_answer_continues():
    with running(Scripted(lambda context: f" 42 (after {context.prefill!r})")) as (server, policy, recorder):
        api = client(server)
        question = [{"role": "user", "content": "What is six times seven?"}]
        reply = api.messages.create(model="m", max_tokens=50, messages=[*question, {"role": "assistant", "content": "The answer is"}])
        assert reply.content[0].text == " 42 (after 'The answer is')"  # only the continuation
        follow_up = [*question, {"role": "assistant", "content": "The answer is 42 (after 'The answer is')"},
                     {"role": "user", "content": "Thanks"}]
        api.messages.create(model="m", max_tokens=50, messages=follow_up)
    assert policy.contexts[0].prefill == "The answer is"
    assert [m["role"] for m in policy.contexts[0].messages] == ["user"]
    (session,) = recorder.sessions()  # the follow-up continues the prefilled exchange
    first, _ = recorder.records(session)
    assert ByteTokenizer().decode(first["prompt_ids"]).endswith("<|im_start|>assistant\nThe answer is")
    assert first["prompt_spans"][-1] == ["reminder", len("The answer is")]
