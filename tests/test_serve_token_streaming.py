"""Token-by-token streaming: ``HFPolicy.generate_stream`` hands over every token as it is
sampled without changing what ``generate`` samples, and the three served APIs send text
while a real model still samples it, through the official clients, ending with the same text
the non-streamed request returns."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import replace

import anthropic
import openai
import pytest

from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.serve.streaming import StreamedText, unsent
from serve_helpers import running

pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.policy.hf import HFPolicy

PAUSE_AFTER_TOKENS = 12
MAX_TOKENS = 40
QUESTION = "Tell me a story about a cat."


def _seeded(requests):
    """The requests with seed 11 where they name none (two of the APIs have no seed field):
    the streamed and the plain request then sample the same completion."""
    return [replace(r, params=replace(r.params, seed=11 if r.params.seed is None else r.params.seed)) for r in requests]


class PausingPolicy(HFPolicy):
    """An ``HFPolicy`` (seeded, see ``_seeded``) that, once ``PAUSE_AFTER_TOKENS`` tokens are
    sampled, waits until the client says it saw streamed text (or 30 s): if text reaches the
    client only at the end, ``sampled_when_client_saw_text`` equals the completion's length."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sampled = 0
        self.client_saw_text = threading.Event()
        self.sampled_when_client_saw_text: int | None = None

    def saw_text(self) -> None:
        if self.sampled_when_client_saw_text is None:
            self.sampled_when_client_saw_text = self.sampled
            self.client_saw_text.set()

    def generate_stream(self, requests, on_tokens):
        waited = False

        def paced(index, ids):
            self.sampled += len(ids)
            on_tokens(index, ids)
            nonlocal waited
            if self.sampled >= PAUSE_AFTER_TOKENS and not waited:
                waited = True
                self.client_saw_text.wait(timeout=30)

        return super().generate_stream(_seeded(requests), paced)

    def generate(self, requests):
        return super().generate(_seeded(requests))

    @contextlib.contextmanager
    def continuous(self):
        """The server's continuous batching (its default over HFPolicy), seeded and paced alike."""
        with super().continuous() as decoder:
            add = decoder.add
            waited = False

            def paced_add(key, request, on_tokens=None):
                def paced(ids):
                    nonlocal waited
                    self.sampled += len(ids)
                    answer = on_tokens(ids) if on_tokens is not None else None
                    if self.sampled >= PAUSE_AFTER_TOKENS and not waited:
                        waited = True
                        self.client_saw_text.wait(timeout=30)
                    return answer

                add(key, _seeded([request])[0], paced)

            decoder.add = paced_add
            yield decoder


def test_generate_stream_hands_over_every_token_of_generate_in_order(tiny_model):
    policy = HFPolicy(tiny_model, device="cpu", max_prefix_cache_tokens=0)
    stop = tuple(policy.tokenizer.stop_token_ids)
    requests = [
        GenerationRequest([1, 2, 3, 4, 5], SamplingParams(1.0, 1.0, 20, stop, seed=7)),
        GenerationRequest([9, 8, 7], SamplingParams(0.7, 0.9, 13, stop, seed=3)),
        GenerationRequest([], SamplingParams(1.0, 1.0, 5, stop, seed=1)),  # an error: no tokens
    ]
    heard: list[tuple[int, list[int]]] = []
    streamed = policy.generate_stream(requests, lambda index, ids: heard.append((index, list(ids))))
    plain = policy.generate(requests)
    assert [(g.token_ids, g.logprobs, g.finish_reason) for g in streamed] == [
        (g.token_ids, g.logprobs, g.finish_reason) for g in plain
    ]
    assert all(len(ids) == 1 for _, ids in heard)  # one call per sampled token
    for index, generation in enumerate(streamed):
        assert [ids[0] for row, ids in heard if row == index] == generation.token_ids
    assert streamed[2].finish_reason == "error" and not [ids for row, ids in heard if row == 2]


def test_streamed_text_holds_back_what_may_still_change():
    pieces = {1: "Hello", 2: " wor", 3: "ld", 4: " <tool", 5: "_call>{}", 6: "STOP"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    tools = StreamedText(decode, stop_token_ids=[0], stops=[], tools=True)
    assert [tools.add([i]) for i in (1, 2, 3, 4, 5)] == ["Hello", " wor", "ld", "", ""]
    assert unsent("Hello world", tools.sent) == ""
    stops = StreamedText(decode, stop_token_ids=[0], stops=["STOP"], tools=False)
    assert [stops.add([i]) for i in (1, 2, 6, 3)] == ["Hello", " wor", "", ""]
    assert stops.sent == "Hello wor"
    assert unsent("Hello wor", stops.sent) == ""


def _chat(server, policy, stream: bool) -> str:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    arguments = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_TOKENS}
    if not stream:
        return client.chat.completions.create(**arguments).choices[0].message.content
    text = ""
    for chunk in client.chat.completions.create(stream=True, **arguments):
        if chunk.choices and chunk.choices[0].delta.content:
            policy.saw_text()
            text += chunk.choices[0].delta.content
    return text


def _messages(server, policy, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    arguments = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_TOKENS}
    if not stream:
        return client.messages.create(**arguments).content[0].text
    text = ""
    with client.messages.stream(**arguments) as events:
        for event in events:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                policy.saw_text()
                text += event.delta.text
        assert events.get_final_message().content[0].text == text
    return text


def _responses(server, policy, stream: bool) -> str:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    arguments = {"model": "m", "input": QUESTION, "max_output_tokens": MAX_TOKENS}
    if not stream:
        return client.responses.create(**arguments).output_text
    text, done = "", None
    for event in client.responses.create(stream=True, **arguments):
        if event.type == "response.output_text.delta":
            policy.saw_text()
            text += event.delta
        elif event.type == "response.output_text.done":
            done = event.text
    assert done == text
    return text


@pytest.mark.parametrize("ask", [_chat, _messages, _responses], ids=["chat", "messages", "responses"])
def test_text_streams_while_the_model_samples_and_equals_the_plain_answer(tiny_model, ask):
    # No prefix cache: the plain request then computes exactly what the streamed one did.
    policy = PausingPolicy(tiny_model, device="cpu", max_prefix_cache_tokens=0)
    with running(policy) as (server, _, _):
        streamed = ask(server, policy, stream=True)
        sampled = policy.sampled
        plain = ask(server, policy, stream=False)
    assert sampled == MAX_TOKENS  # the tiny model never samples its stop token this early
    # The client saw text while the policy was paused mid-completion.
    assert policy.sampled_when_client_saw_text is not None
    assert policy.sampled_when_client_saw_text < sampled
    assert streamed and streamed == plain
