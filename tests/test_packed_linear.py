"""HFPolicy's oneDNN-packed linear layers: the same tokens as the eager path, packed weights that follow weight changes, training untouched."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

import torch

from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.hf import HFPolicy
from harnessrl.policy.packed_linear import PackedLinears, onednn_linear_available

pytestmark = pytest.mark.skipif(
    not onednn_linear_available(torch.device("cpu"), torch.float32), reason="this torch has no oneDNN"
)

PROMPTS = ([1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [100, 200, 300, 400, 500])


def requests(**params: object) -> list[GenerationRequest]:
    """One request per prompt, seeds 10, 11, ..."""
    return [
        GenerationRequest(list(prompt), SamplingParams(seed=10 + i, stop_token_ids=(), **params))  # type: ignore[arg-type]
        for i, prompt in enumerate(PROMPTS)
    ]


@pytest.fixture(scope="module")
def eager_and_packed(tiny_model):
    """The tiny model twice, float32 on CPU: linear layers eager, and packed."""
    eager = HFPolicy(tiny_model, device="cpu", dtype="float32", packed_linear=False)
    packed = HFPolicy(tiny_model, device="cpu", dtype="float32", packed_linear=True)
    assert eager.packed_linears is None and packed.packed_linears is not None
    yield eager, packed
    eager.close()
    packed.close()


def test_packed_linears_generate_the_eager_tokens_greedy_and_sampled(eager_and_packed) -> None:
    eager, packed = eager_and_packed
    for params in ({"temperature": 0.0, "max_new_tokens": 20}, {"temperature": 1.0, "max_new_tokens": 20}):
        expected = eager.generate(requests(**params))
        got = packed.generate(requests(**params))
        for want, have in zip(expected, got, strict=True):
            assert have.finish_reason == want.finish_reason == "length"
            assert have.token_ids == want.token_ids
            assert have.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    assert packed.packed_linears.packings > 0


def test_packed_weights_follow_in_place_weight_changes(eager_and_packed) -> None:
    eager, packed = eager_and_packed
    sampled = {"temperature": 1.0, "max_new_tokens": 12}
    before = packed.generate(requests(**sampled))
    packings = packed.packed_linears.packings
    with torch.no_grad():  # what an optimizer step does: the same in-place write to both models
        for model in (eager.model, packed.model):
            model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
            model.lm_head.weight.add_(0.5 * torch.sign(model.lm_head.weight))
    after = packed.generate(requests(**sampled))
    assert packed.packed_linears.packings > packings  # the changed weights were packed again
    for want, have, old in zip(eager.generate(requests(**sampled)), after, before, strict=True):
        assert have.token_ids == want.token_ids
        assert have.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert have.token_ids != old.token_ids or have.logprobs != pytest.approx(old.logprobs, abs=1e-2)


def test_linears_keep_their_own_forward_for_training_inside_and_outside_the_context(eager_and_packed) -> None:
    _, packed = eager_and_packed
    model = packed.model
    linear = model.model.layers[0].self_attn.q_proj
    packs = PackedLinears()
    packs.clear(model)  # packed weights belong to the layers: the policy's packs go too
    ids = torch.tensor([list(PROMPTS[0])])
    with packs.installed(model):
        assert "forward" in vars(linear)
        with torch.no_grad():
            no_grad_logits = model(input_ids=ids).logits
        loss = model(input_ids=ids).logits.logsumexp(-1).sum()  # autograd on: the own forward
        loss.backward()
    assert "forward" not in vars(linear)
    assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        assert model(input_ids=ids).logits == pytest.approx(no_grad_logits, abs=1e-4)
    assert packs.packings > 0


def test_packed_linear_on_an_unsupported_dtype_names_the_fix(tiny_model) -> None:
    with pytest.raises(ValueError, match="packed_linear=None"):
        HFPolicy(tiny_model, device="cpu", dtype="float16", packed_linear=True)
    assert HFPolicy(tiny_model, device="cpu", dtype="float16").packed_linears is None
