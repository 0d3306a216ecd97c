"""Streams begin before the policy answers and stay alive while it works; the official
clients read such streams; a policy failure mid-stream is an error event of the API."""

from __future__ import annotations

import json
import threading
import time

import anthropic
import httpx
import openai
import pytest

from harnessrl.policy.base import Generation
from serve_helpers import Scripted, running

REQUESTS = {
    "chat": ("/v1/chat/completions", {"stream": True, "messages": [{"role": "user", "content": "hi"}]}, ": keep-alive"),
    "messages": ("/v1/messages", {"stream": True, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}, "event: ping"),
    "responses": ("/v1/responses", {"stream": True, "input": "hi"}, ": keep-alive"),
}


class Gated(Scripted):
    """Blocks every generate call until ``release`` is set."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.release, self.fail = threading.Event(), fail

    def generate(self, requests):
        self.release.wait(timeout=30)
        if self.fail:
            return [Generation([], [], "error", error="the model fell over") for _ in requests]
        return super().generate(requests)


@pytest.mark.parametrize("api", sorted(REQUESTS))
def test_stream_starts_and_keeps_alive_while_the_policy_works(api):
    path, body, keepalive = REQUESTS[api]
    policy = Gated()
    with running(policy, stream_keepalive_s=0.02) as (server, _, _), httpx.stream(
        "POST", server.base_url + path, json=body, timeout=30
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        before = []
        while sum(line.startswith(keepalive) for line in before) < 3:
            before.append(next(lines))  # the policy has not answered yet: it is gated
        policy.release.set()
        after = list(lines)
    events = [json.loads(line[6:]) for line in before + after if line.startswith("data: {")]
    if api == "messages":
        assert events[0]["type"] == "message_start"
        assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "echo: hi"
    elif api == "responses":
        assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-1]["type"] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
    else:
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"]) == "echo: hi"


def test_official_clients_read_streams_with_keepalives():
    policy = Scripted()
    inner = policy.generate

    def slow(requests):
        time.sleep(0.3)
        return inner(requests)

    policy.generate = slow
    with running(policy, stream_keepalive_s=0.01) as (server, _, _):
        chat = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        text = "".join(c.choices[0].delta.content or "" for c in chat.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a"}], stream=True) if c.choices)
        responses = [e for e in chat.responses.create(model="m", input="b", stream=True)]
        claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
        with claude.messages.stream(model="m", max_tokens=20, messages=[{"role": "user", "content": "c"}]) as stream:
            message = stream.get_final_text()
    assert text == "echo: a"
    assert responses[-1].response.output_text == "echo: b"
    assert message == "echo: c"


def test_a_policy_failure_mid_stream_is_an_error_event():
    policy = Gated(fail=True)
    policy.release.set()
    with running(policy) as (server, _, _):
        claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError, match="the model fell over"), claude.messages.stream(
            model="m", max_tokens=20, messages=[{"role": "user", "content": "c"}]
        ) as stream:
            stream.get_final_text()
        chat = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError, match="the model fell over"):
            list(chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], stream=True))
        events = list(chat.responses.create(model="m", input="b", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.message == "the model fell over"
