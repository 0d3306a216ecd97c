"""The LM head in chunks (`lm_head_chunk_tokens`, rl/forward.py): the log-probabilities and
entropies of the one-shot projection (float rounding: a product over fewer rows), an update that trains the same weights up to float
rounding (on the policy-gradient, KL, entropy, multi-step and SFT paths), and a forward that
keeps no vocabulary-sized tensor for the backward pass."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.rl.batching import collate, micro_batches  # noqa: E402
from harnessrl.rl.config import TrainConfig  # noqa: E402
from harnessrl.rl.forward import masked_token_logprobs  # noqa: E402
from harnessrl.rl.objectives import UpdateSettings  # noqa: E402
from harnessrl.rl.update import update_step  # noqa: E402
from test_clipped_update import TEMPERATURE, grpo_batch, tiny  # noqa: E402


def batch_data(model):
    batch = next(iter(micro_batches(grpo_batch(model), 4096, True)))
    return collate(batch, 0, torch.device("cpu"), True)


def test_chunks_give_the_one_shot_logprobs_and_entropies(tiny_model):
    model = tiny(tiny_model)
    data = batch_data(model)
    trained = int(data["mask"].sum())
    with torch.no_grad():
        _, plain_logprobs, plain_entropy = masked_token_logprobs(model, data, TEMPERATURE)
        for chunk in (1, 7, trained - 1, trained, 10 * trained):
            _, logprobs, entropy = masked_token_logprobs(model, data, TEMPERATURE, head_chunk_tokens=chunk)
            torch.testing.assert_close(logprobs, plain_logprobs, rtol=2e-6, atol=1e-6)
            torch.testing.assert_close(entropy, plain_entropy, rtol=2e-6, atol=1e-6)
    assert (plain_logprobs < 0).sum() == trained  # every trained position was projected


@pytest.mark.parametrize("settings", [
    {}, {"entropy_coef": 0.01, "autocast_dtype": torch.bfloat16}, {"ppo_epochs": 2, "mini_batches": 2},
    {"objective": "nll"},
], ids=["grpo", "entropy-bf16", "two-epochs-two-mini-batches", "sft"])
def test_a_chunked_update_trains_the_same_weights(tiny_model, settings):
    results = []
    for chunk in (0, 5):
        model = tiny(tiny_model)
        params = [p for p in model.parameters() if p.requires_grad]
        metrics = update_step(model, torch.optim.SGD(params, lr=0.1), grpo_batch(model), 0, UpdateSettings(
            temperature=TEMPERATURE, max_grad_norm=1e9, lm_head_chunk_tokens=chunk, **settings))
        results.append(({n: p.detach().clone() for n, p in model.named_parameters()}, metrics))
    (plain, plain_metrics), (chunked, metrics) = results
    assert plain_metrics.keys() == metrics.keys()
    for key, value in plain_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    start = tiny(tiny_model).state_dict()
    moved = [name for name in plain if not torch.equal(plain[name], start[name])]
    assert "lm_head.weight" in moved or "model.embed_tokens.weight" in moved  # the head trained
    for name in plain:
        atol = 2e-3 if settings.get("autocast_dtype") else 1e-5
        torch.testing.assert_close(chunked[name], plain[name], rtol=1e-4, atol=atol, msg=name)


def test_a_chunked_head_keeps_no_vocabulary_sized_tensor_for_the_backward(tiny_model):
    """What autograd keeps outside the chunks' checkpoints: one-shot, the float32 logits'
    log-softmax ([trained positions, vocabulary]); chunked, nothing of the vocabulary's size."""
    model = tiny(tiny_model).train()
    data = batch_data(model)
    trained, vocabulary = int(data["mask"].sum()), model.config.vocab_size
    kept = []
    for chunk in (0, 8):
        largest: list[int] = []

        def pack(tensor, largest=largest):
            if not isinstance(tensor, torch.nn.Parameter):
                largest.append(tensor.numel())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            masked_token_logprobs(model, data, TEMPERATURE, head_chunk_tokens=chunk)
        kept.append(max(largest))
    plain, chunked = kept
    assert plain >= trained * vocabulary
    assert chunked < 8 * vocabulary <= plain // 4, kept


def test_the_setting_reaches_the_update():
    cfg = TrainConfig(lm_head_chunk_tokens=512)
    assert UpdateSettings.from_config(cfg).lm_head_chunk_tokens == 512
    assert UpdateSettings.from_config(TrainConfig()).lm_head_chunk_tokens == 0
    with pytest.raises(ValueError):
        TrainConfig(lm_head_chunk_tokens=-1)
