"""Malformed and mutated request bodies on every endpoint: never a 5xx, always the API's
error shape, and the server keeps serving."""

from __future__ import annotations

import copy
import json
import threading

import anthropic
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.policy.scripted import RandomPolicy
from harnessrl.serve.app import create_app
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.runner import ServerThread
from serve_helpers import Scripted

KEYS = [
    "model", "messages", "role", "content", "type", "text", "tools", "function", "name", "parameters",
    "arguments", "tool_calls", "id", "tool_call_id", "max_tokens", "max_completion_tokens", "stream",
    "stop", "n", "temperature", "top_p", "seed", "system", "input", "call_id", "output", "instructions",
    "tool_use_id", "input_schema", "tool_choice", "stop_sequences", "previous_response_id",
    "max_output_tokens", "stream_options", "include_usage", "logprobs", "top_logprobs", "is_error",
]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["user", "assistant", "system", "tool", "developer", "function", "text", "tool_use",
                     "tool_result", "function_call", "function_call_output", "message", "none", "auto"]),
    st.text(max_size=12),
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.sampled_from(KEYS), children, max_size=5)),
    max_leaves=20,
)

VALID = {
    "/v1/chat/completions": {
        "model": "m", "max_tokens": 20,
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c", "content": "r"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    },
    "/v1/responses": {
        "model": "m", "max_output_tokens": 20, "instructions": "i",
        "input": [{"role": "user", "content": "u"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c", "output": "r"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    },
    "/v1/messages": {
        "model": "m", "max_tokens": 20, "system": [{"type": "text", "text": "s"}],
        "messages": [{"role": "user", "content": "u"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
}
VALID["/v1/messages/count_tokens"] = VALID["/v1/messages"]


@pytest.fixture(scope="module")
def server():
    app = create_app(RandomPolicy(seed=3), recorder=ConversationRecorder(), context_length=2000)
    with ServerThread(app) as running:
        yield running


def paths(value, prefix=()):
    """Yields the path of every node of a JSON value."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


def replaced(body, path, value):
    body = copy.deepcopy(body)
    if not path:
        return value
    node = body
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return body


def check(client: httpx.Client, path: str, content: bytes) -> None:
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code < 500, (path, content[:300], response.text[:300])
    if response.status_code >= 400:
        error = response.json()
        if "/messages" in path:
            assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
        else:
            assert set(error["error"]) == {"message", "type", "param", "code"}
    elif "stream" not in response.headers.get("content-type", ""):
        assert isinstance(response.json(), dict)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(sorted(VALID)), body=JSON)
def test_random_bodies_never_get_a_5xx(server, route, body):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        check(client, route, json.dumps(body).encode())


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(sorted(VALID)), data=st.data(), value=JSON)
def test_mutated_valid_bodies_never_get_a_5xx(server, route, data, value):
    body = VALID[route]
    path = data.draw(st.sampled_from(list(paths(body))))
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        check(client, f"/s/fuzz/{route.lstrip('/')}", json.dumps(replaced(body, path, value)).encode())


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"null", b'"text"', b"[]", b"1e999", b'{"messages": [' * 50])
def test_undecodable_bodies_get_400s_and_the_server_keeps_serving(server, content):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        for route in VALID:
            response = client.post(route, content=content)
            assert response.status_code == 400, (route, content)
        assert client.post("/v1/chat/completions", json=VALID["/v1/chat/completions"]).status_code == 200


def test_concurrent_mixed_traffic_gets_every_answer_right():
    """Streaming and plain requests of all three APIs and malformed bodies, all at once."""
    app = create_app(Scripted(), recorder=ConversationRecorder())
    results: dict[int, object] = {}

    def ask(index: int, base_url: str) -> None:
        word = f"word{index}"
        kind = index % 5
        try:
            if kind == 0:
                api = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
                results[index] = api.chat.completions.create(model="m", messages=[{"role": "user", "content": word}]).choices[0].message.content
            elif kind == 1:
                api = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
                stream = api.chat.completions.create(model="m", messages=[{"role": "user", "content": word}], stream=True)
                results[index] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            elif kind == 2:
                api = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
                with api.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": word}]) as stream:
                    results[index] = stream.get_final_text()
            elif kind == 3:
                api = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
                events = api.responses.create(model="m", input=word, stream=True)
                results[index] = next(e.response.output_text for e in events if e.type == "response.completed")
            else:
                response = httpx.post(base_url + "/v1/messages", content=b'{"messages": [{"role": 7}]}')
                results[index] = response.status_code
        except Exception as exc:  # recorded, so the assertion below shows it
            results[index] = exc

    with ServerThread(app) as server:
        threads = [threading.Thread(target=ask, args=(i, server.base_url)) for i in range(30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        health = httpx.get(server.base_url + "/health").json()
    expected = {i: 400 if i % 5 == 4 else f"echo: word{i}" for i in range(30)}
    assert results == expected
    assert health["requests"] == 24 and health["batches"] <= 24
