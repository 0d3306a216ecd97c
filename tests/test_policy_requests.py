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


BACKENDS: dict[str, Callable[[Path], Iterator[Policy]]] = {
    "openai": lambda model: _openai_policy(),
    "hf": _hf_policy,
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


# Runs in the vLLM environment (vLLM pins its own transformers, so it is not a harnessrl
# dependency): VLLMPolicy puts ``vllm.LLM`` in the calling process, harnessrl comes from src/.
VLLM_POLICY_SCRIPT = """
import json, sys
from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.vllm_cpu import VLLMPolicy

def main():
    requests = [GenerationRequest(r["prompt_ids"], SamplingParams(**r["params"])) for r in json.loads(sys.argv[2])]
    policy = VLLMPolicy(sys.argv[1], max_model_len=512, enforce_eager=True)
    try:
        results = policy.generate(requests)
    finally:
        policy.close()
    print(json.dumps([[g.token_ids, g.logprobs, g.finish_reason, g.error] for g in results]))

if __name__ == "__main__":  # vLLM's engine starts in spawned processes that import this file
    main()
"""


def test_the_in_process_vllm_policy_rejects_the_same_requests_with_the_same_errors(tmp_path_factory) -> None:
    """``VLLMPolicy`` (the ``vllm:`` policy spec) through the same requests as the other backends,
    run by the vLLM environment's interpreter on a tiny model (vLLM's CPU attention needs a head
    size that is a multiple of 32)."""
    import dataclasses
    import json
    import os
    import subprocess

    from conftest import save_tiny_model
    from vllm_server import REPO, vllm_python_or_skip

    python = vllm_python_or_skip()
    model = save_tiny_model(tmp_path_factory, "tiny-vllm", hidden_size=64, head_dim=32)
    invalid = invalid_requests()
    good = GenerationRequest(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=2))
    zero = GenerationRequest(PROMPT, SamplingParams(max_new_tokens=0))
    requests = [good, *(request for request, _ in invalid), zero]
    script = model.parent / "vllm_policy.py"
    script.write_text(VLLM_POLICY_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(
        [str(python), str(script), str(model),
         json.dumps([{"prompt_ids": r.prompt_ids, "params": dataclasses.asdict(r.params)} for r in requests])],
        capture_output=True, text=True, env=env, cwd=model.parent, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    tokens, _, reason, error = results[0]
    assert reason in ("stop", "length") and 1 <= len(tokens) <= 2 and error is None
    for (request, word), (tokens, logprobs, reason, error) in zip(invalid, results[1:-1], strict=True):
        assert (tokens, logprobs, reason) == ([], [], "error")
        assert error == request_problem(request) and word in error
    assert results[-1] == [[], [], "length", None]
