"""One request validation for every policy backend (``policy/base.py``): the same invalid
request gets the same error from each backend that can run here, a zero token budget gets the
empty ``length`` completion without the model, and valid requests still run."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harnessrl.policy.base import (
    GenerationRequest,
    Policy,
    SamplingParams,
    request_problem,
    triage_requests,
)

PROMPT = [72, 105, 33]


def invalid_requests() -> list[tuple[GenerationRequest, str]]:
    """Returns (request, word its error must name) for requests no backend may run."""
    return [
        (GenerationRequest([], SamplingParams(max_new_tokens=3)), "empty prompt"),
        (GenerationRequest(PROMPT, SamplingParams(temperature=-1.0, max_new_tokens=3)), "temperature"),
        (GenerationRequest(PROMPT, SamplingParams(temperature=math.nan, max_new_tokens=3)), "temperature"),
        (GenerationRequest(PROMPT, SamplingParams(temperature=math.inf, max_new_tokens=3)), "temperature"),
        (GenerationRequest(PROMPT, SamplingParams(top_p=0.0, max_new_tokens=3)), "top_p"),
        (GenerationRequest(PROMPT, SamplingParams(top_p=1.5, max_new_tokens=3)), "top_p"),
        (GenerationRequest(PROMPT, SamplingParams(max_new_tokens=-1)), "max_new_tokens"),
    ]


def test_request_problem_names_each_problem_and_passes_valid_requests() -> None:
    for request, word in invalid_requests():
        problem = request_problem(request, context_length=16, vocab_size=300)
        assert problem is not None and word in problem, (request, problem)
    valid = GenerationRequest(PROMPT, SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=0))
    assert request_problem(valid, context_length=16, vocab_size=300) is None
    full = request_problem(GenerationRequest([1] * 16), context_length=16)
    assert full is not None and "16 tokens" in full and "context" in full
    assert request_problem(GenerationRequest([1] * 15), context_length=16) is None
    for ids in ([300], [-1], [1, 2.0]):
        problem = request_problem(GenerationRequest(ids), vocab_size=300)  # type: ignore[arg-type]
        assert problem is not None and "vocabulary [0, 300)" in problem
    assert request_problem(GenerationRequest([10**9])) is None  # vocabulary unknown: not checked


def test_triage_answers_invalid_and_zero_budget_requests_and_keeps_the_rest_in_order() -> None:
    zero = GenerationRequest(PROMPT, SamplingParams(max_new_tokens=0))
    good = GenerationRequest(PROMPT, SamplingParams(max_new_tokens=4))
    bad = GenerationRequest([], SamplingParams())
    results, runnable = triage_requests([good, zero, bad, good])
    assert runnable == [0, 3]
    assert results[0] is None and results[3] is None
    assert results[1] is not None and (results[1].token_ids, results[1].finish_reason) == ([], "length")
    assert results[2] is not None and results[2].finish_reason == "error" and "empty prompt" in str(results[2].error)


def _openai_policy() -> Iterator[Policy]:
    from test_openai_policy import FakeServer, make_policy

    server = FakeServer()
    try:
        yield make_policy(server)
    finally:
        server.close()


def _hf_policy(model: Path) -> Iterator[Policy]:
    pytest.importorskip("torch", reason="torch is installed by `make test`")
    from harnessrl.policy.hf import HFPolicy

    policy = HFPolicy(model, device="cpu", dtype="float32", max_prefix_cache_tokens=0)
    yield policy
    policy.close()


def _vllm_policy(model: Path) -> Iterator[Policy]:
    pytest.importorskip("vllm", reason="vLLM is not a dependency of harnessrl")
    from harnessrl.policy.vllm_cpu import VLLMPolicy

    policy = VLLMPolicy(model, max_model_len=512, enforce_eager=True)
    yield policy
    policy.close()


BACKENDS: dict[str, Callable[[Path], Iterator[Policy]]] = {
    "openai": lambda model: _openai_policy(),
    "hf": _hf_policy,
    "vllm": _vllm_policy,
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Iterator[Policy]:
    model = request.getfixturevalue("tiny_model") if request.param != "openai" else Path()
    yield from BACKENDS[request.param](model)


def test_every_backend_rejects_the_same_requests_with_the_same_errors(backend: Policy) -> None:
    invalid = invalid_requests()
    zero = GenerationRequest(PROMPT, SamplingParams(max_new_tokens=0))
    good = GenerationRequest(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=2))
    results = backend.generate([good, *(request for request, _ in invalid), zero])
    assert results[0].finish_reason in ("stop", "length") and 1 <= len(results[0].token_ids) <= 2
    for (request, word), generation in zip(invalid, results[1:-1], strict=True):
        assert generation.finish_reason == "error" and generation.token_ids == []
        assert generation.error == request_problem(request) and word in generation.error
    assert (results[-1].token_ids, results[-1].logprobs, results[-1].finish_reason) == ([], [], "length")
    assert results[-1].error is None
