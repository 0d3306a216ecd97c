"""The server over the embedded SmolLM2 model: real token ids and log-probabilities recorded."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (make test installs it)")

import anthropic
import openai

from harnessrl.policy.hf import HFPolicy
from harnessrl.serve.app import create_app
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.runner import ServerThread
from serve_helpers import WEATHER_TOOL


@pytest.fixture(scope="module")
def served():
    policy = HFPolicy(device="cpu", max_batch_size=4)
    recorder = ConversationRecorder()
    with ServerThread(create_app(policy, recorder=recorder)) as server:
        yield server, policy, recorder
    policy.close()


def test_model_completion_records_exact_ids_and_logprobs_that_rescore(served):
    server, policy, recorder = served
    api = openai.OpenAI(base_url=server.base_url + "/s/model-chat/v1", api_key="x", max_retries=0)
    reply = api.chat.completions.create(
        model=policy.name, max_tokens=12, temperature=0.7, seed=5,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        tools=[{"type": "function", "function": WEATHER_TOOL}],
    )
    (record,) = recorder.records("model-chat")
    completion, prompt = record["completion_ids"], record["prompt_ids"]
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == len(completion)
    assert 1 <= len(completion) <= 12
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    shown = policy.tokenizer.decode(prompt)
    assert shown.startswith("<|im_start|>system\n# Tools") and '"name": "get_weather"' in shown
    assert shown.endswith("<|im_start|>assistant\n")
    # The recorded log-probabilities are those of the sampled ids under the model.
    rescored = policy.score(prompt, completion, temperature=0.7)
    assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(record["completion_logprobs"], rescored, strict=True))
    assert any(value < 0 for value in rescored)
    text = reply.choices[0].message.content or ""
    assert policy.tokenizer.decode(completion).startswith(text.strip()[:5])


def test_model_streams_an_anthropic_message(served):
    server, policy, recorder = served
    api = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    with api.messages.stream(model=policy.name, max_tokens=8, messages=[{"role": "user", "content": "Say hi."}],
                             extra_headers={"X-Harnessrl-Session": "model-messages"}) as stream:
        final = stream.get_final_message()
    (record,) = recorder.records("model-messages")
    assert final.usage.output_tokens == len(record["completion_ids"]) <= 8
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.content[0].text == record["text"]  # streamed whole, trailing whitespace included
