"""Sampling is numerically safe for every accepted value (policy/sampling.py): a temperature or
top_p inside the accepted range but tiny (1e-300 is 0 in float32) acts as greedy, and such a
row never fails its batch-mates, in the policy and through the server's batcher."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.harness.base import Message  # noqa: E402
from harnessrl.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from harnessrl.policy.hf import HFPolicy  # noqa: E402
from harnessrl.policy.sampling import sample_index, top_p_filter  # noqa: E402
from harnessrl.serve.app import create_app  # noqa: E402
from harnessrl.serve.runner import ServerThread  # noqa: E402

TINY = 1e-300


@pytest.fixture(scope="module")
def policy(tiny_model) -> HFPolicy:
    loaded = HFPolicy(str(tiny_model), device="cpu", dtype="float32", max_batch_size=8)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def prompt(policy: HFPolicy) -> list[int]:
    return policy.tokenizer.render([Message("user", "Count the files in the folder.", "task")]).ids


def test_a_batch_with_tiny_temperature_and_top_p_rows_serves_every_row(policy: HFPolicy, prompt) -> None:
    greedy = policy.generate([GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=12))])[0]
    sampled = GenerationRequest(prompt, SamplingParams(0.8, max_new_tokens=12, seed=7))
    alone = policy.generate([sampled])[0]
    rows = [
        sampled,
        GenerationRequest(prompt, SamplingParams(TINY, max_new_tokens=12, seed=1)),
        GenerationRequest(prompt, SamplingParams(1.0, top_p=TINY, max_new_tokens=12, seed=2)),
        GenerationRequest(prompt, SamplingParams(1e-38, max_new_tokens=12, seed=3)),  # denormal
        GenerationRequest(prompt, SamplingParams(TINY, top_p=TINY, max_new_tokens=12, seed=4)),
    ]
    batch = policy.generate(rows)
    assert [g.error for g in batch] == [None] * 5, [g.error for g in batch]
    assert [g.finish_reason for g in batch] == ["length"] * 5
    # the batch-mate samples exactly what it samples alone
    assert batch[0].token_ids == alone.token_ids and batch[0].logprobs == pytest.approx(alone.logprobs)
    for generation in batch[1:]:  # tiny temperature / nucleus: the greedy tokens
        assert generation.token_ids == greedy.token_ids
        assert all(0 <= token < policy.vocab_size for token in generation.token_ids)
    for generation in (batch[1], batch[3], batch[4]):  # greedy, so greedy log-probabilities
        assert generation.logprobs == pytest.approx(greedy.logprobs, abs=1e-5)
    assert policy.score(prompt, greedy.token_ids, temperature=TINY) == pytest.approx(
        policy.score(prompt, greedy.token_ids, temperature=0.0), abs=1e-6)


def test_the_nucleus_of_a_vanishing_top_p_is_the_top_token_and_no_draw_leaves_the_row() -> None:
    probs = torch.tensor([0.1, 0.5, 0.0, 0.3, 0.1])
    assert top_p_filter(probs, TINY).tolist() == pytest.approx([0.0, 0.5, 0.0, 0.0, 0.0])
    assert top_p_filter(probs * 1e-30, TINY).tolist() == pytest.approx([0.0, 0.5e-30, 0.0, 0.0, 0.0])
    generator = torch.Generator().manual_seed(0)
    for row in (torch.zeros(5), torch.full((5,), float("nan")), torch.tensor([0.0, float("inf"), 1.0, 0.0, 0.0]),
                torch.tensor([0.0, 0.0, 2.0, float("nan"), 0.0])):
        index = sample_index(row, generator)
        assert index.shape == (1,) and 0 <= int(index) < 5, (row, index)
    assert int(sample_index(torch.tensor([0.0, 0.0, 2.0, float("nan"), 0.0]), generator)) == 2


def test_through_the_server_a_tiny_temperature_request_fails_no_batch_mate(policy: HFPolicy) -> None:
    bodies = [{"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 6,
               "temperature": temperature, "top_p": top_p, "seed": i}
              for i, (temperature, top_p) in enumerate([(0.7, 1.0), (TINY, 1.0), (1.0, TINY), (0.9, 0.95)])]
    greedy = dict(bodies[1], temperature=0.0)
    with ServerThread(create_app(policy, context_length=2048)) as server:
        url = server.base_url + "/v1/chat/completions"
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            responses = list(pool.map(lambda body: httpx.post(url, json=body, timeout=120), bodies))
        reference = httpx.post(url, json=greedy, timeout=120)
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text[:200] for r in responses]
    text = [r.json()["choices"][0]["message"]["content"] for r in responses]
    assert text[1] == reference.json()["choices"][0]["message"]["content"]
