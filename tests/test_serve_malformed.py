"""Requests each API defines as malformed get a 400 in that API's error shape, never a 200 or
a 500: lone UTF-16 surrogates, a mistyped ``model``, messages without content, Anthropic
Messages without ``max_tokens``; their well-formed neighbours still get a 200."""

from __future__ import annotations

import json

import httpx
import pytest

from harnessrl.policy.scripted import RandomPolicy
from harnessrl.serve.app import create_app
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.runner import ServerThread

CHAT, RESPONSES, MESSAGES, COUNT = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"


@pytest.fixture(scope="module")
def server():
    app = create_app(RandomPolicy(seed=5), recorder=ConversationRecorder(), context_length=4000)
    with ServerThread(app) as running:
        yield running


def post(server, path: str, body: str | dict) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(server.base_url + path, content=content.encode(), headers={"content-type": "application/json"}, timeout=60)


def assert_refused(response: httpx.Response, path: str, mentions: str) -> None:
    assert response.status_code == 400, (path, response.status_code, response.text[:300])
    body = response.json()
    if "/messages" in path:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    assert mentions in message, message


# Raw JSON text: the escape must reach the server as written.
SURROGATES = {
    CHAT: [
        '{"max_tokens": 5, "messages": [{"role": "user", "content": "bad \\ud800 text"}]}',
        '{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
        '{"max_tokens": 5, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null, '
        '"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\\"a\\": \\"\\\\ud800\\"}"}}]},'
        ' {"role": "tool", "tool_call_id": "c", "content": "r"}]}',
        '{"max_tokens": 5, "\\ud800": 1, "messages": [{"role": "user", "content": "key"}]}',
    ],
    RESPONSES: ['{"max_output_tokens": 5, "input": "\\ud800"}',
                '{"max_output_tokens": 5, "instructions": "\\udc00", "input": "x"}'],
    MESSAGES: ['{"max_tokens": 5, "messages": [{"role": "user", "content": "\\ud800"}]}',
               '{"max_tokens": 5, "system": "\\udbff", "messages": [{"role": "user", "content": "x"}]}'],
    COUNT: ['{"messages": [{"role": "user", "content": "\\ud800"}]}'],
}


@pytest.mark.parametrize(("path", "body"), [(p, b) for p, bodies in SURROGATES.items() for b in bodies])
def test_lone_surrogates_get_a_400(server, path, body):
    assert_refused(post(server, path, body), path, "surrogate")


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
def test_a_surrogate_pair_is_ordinary_text(server, path):
    body = '{"max_tokens": 5, "messages": [{"role": "user", "content": "smile \\ud83d\\ude00"}]}'
    assert post(server, path, body).status_code == 200


def test_model_must_be_a_string(server):
    assert_refused(post(server, CHAT, {"model": 123, "messages": [{"role": "user", "content": "x"}]}), CHAT, "model")
    assert_refused(post(server, RESPONSES, {"model": [], "input": "x"}), RESPONSES, "model")
    assert_refused(post(server, MESSAGES, {"model": 1, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
                   MESSAGES, "model")
    assert post(server, CHAT, {"model": "any", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).status_code == 200


def test_messages_without_content_are_refused_where_the_api_requires_content(server):
    for role in ("user", "system", "tool"):
        message = {"role": role, "tool_call_id": "c"} if role == "tool" else {"role": role}
        response = post(server, CHAT, {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, message]})
        assert_refused(response, CHAT, "content")
    assert_refused(post(server, CHAT, {"messages": [{"role": "user", "content": None}]}), CHAT, "content")
    bare_assistant = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}, {"role": "user", "content": "y"}]}
    assert_refused(post(server, CHAT, bare_assistant), CHAT, "content")
    # An assistant message with tool calls needs no content.
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    with_calls = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": calls},
                                                {"role": "tool", "tool_call_id": "c", "content": "r"}]}
    assert post(server, CHAT, with_calls).status_code == 200

    assert_refused(post(server, MESSAGES, {"max_tokens": 5, "messages": [{"role": "user"}]}), MESSAGES, "content")
    assert_refused(post(server, COUNT, {"messages": [{"role": "user", "content": None}]}), COUNT, "content")
    assert_refused(post(server, RESPONSES, {"input": [{"type": "message", "role": "user"}]}), RESPONSES, "content")


def test_messages_without_max_tokens_is_refused(server):
    response = post(server, MESSAGES, {"messages": [{"role": "user", "content": "x"}]})
    assert_refused(response, MESSAGES, "max_tokens")
    # count_tokens takes no max_tokens; the OpenAI APIs default it.
    assert post(server, COUNT, {"messages": [{"role": "user", "content": "x"}]}).status_code == 200
    assert post(server, CHAT, {"messages": [{"role": "user", "content": "x"}]}).status_code == 200


@pytest.mark.parametrize(("path", "body", "field"), [
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "tool_choice": 3}, "tool_choice"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "user": 5}, "user"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    (CHAT, {"messages": [{"role": "tool", "content": "r", "tool_call_id": 4}]}, "tool_call_id"),
    (RESPONSES, {"input": "x", "tools": ""}, "tools"),
    (RESPONSES, {"input": "x", "metadata": "m"}, "metadata"),
    (RESPONSES, {"input": "x", "instructions": 5}, "instructions"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": "many"}, "top_k"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "metadata": []}, "metadata"),
    (MESSAGES, {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, "tool_choice"),
])
def test_mistyped_fields_get_a_400(server, path, body, field):
    assert_refused(post(server, path, body), path, field)


# Raw JSON text: Python's json reads NaN, Infinity and 1e400 (infinite) as floats.
ABSURD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", str(2**63), str(2**64), "1e30"]
TOKEN_LIMITS = [(CHAT, "max_tokens", '"messages": [{"role": "user", "content": "x"}]'),
                (CHAT, "max_completion_tokens", '"messages": [{"role": "user", "content": "x"}]'),
                (RESPONSES, "max_output_tokens", '"input": "x"'),
                (MESSAGES, "max_tokens", '"messages": [{"role": "user", "content": "x"}]')]


@pytest.mark.parametrize(("path", "field", "rest"), TOKEN_LIMITS)
@pytest.mark.parametrize("number", ABSURD_NUMBERS)
def test_non_finite_or_absurd_output_limits_get_a_400_naming_the_field(server, path, field, rest, number):
    assert_refused(post(server, path, f'{{"{field}": {number}, {rest}}}'), path, field)
    assert post(server, path, f'{{"{field}": 3, {rest}}}').status_code == 200


@pytest.mark.parametrize(("path", "body", "field"), [
    (CHAT, '{"seed": NaN, "messages": [{"role": "user", "content": "x"}]}', "seed"),
    (CHAT, f'{{"seed": {2**70}, "messages": [{{"role": "user", "content": "x"}}]}}', "seed"),
    (CHAT, '{"n": Infinity, "messages": [{"role": "user", "content": "x"}]}', "n"),
    (CHAT, '{"temperature": NaN, "messages": [{"role": "user", "content": "x"}]}', "temperature"),
    (CHAT, '{"top_p": Infinity, "messages": [{"role": "user", "content": "x"}]}', "top_p"),
    (MESSAGES, '{"max_tokens": 5, "top_k": 1e400, "messages": [{"role": "user", "content": "x"}]}', "top_k"),
])
def test_other_non_finite_or_absurd_numbers_get_a_400_naming_the_field(server, path, body, field):
    assert_refused(post(server, path, body), path, field)
