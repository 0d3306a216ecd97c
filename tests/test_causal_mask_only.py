"""Micro-batches under the causal mask alone (`causal_mask_only`, rl/forward.py): the padding mask
is dropped only where a micro-batch runs in one call, the real tokens' hidden states and
log-probabilities are those of the masked pass, and an update trains the same weights up to the
attention backward's float rounding (float32 and bfloat16 autocast)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.rl.batching import UpdateSample, collate, micro_batches  # noqa: E402
from harnessrl.rl.config import PRESETS, TrainConfig  # noqa: E402
from harnessrl.rl.forward import decoder_hidden, masked_token_logprobs  # noqa: E402
from harnessrl.rl.objectives import UpdateSettings  # noqa: E402
from harnessrl.rl.update import update_step  # noqa: E402
from test_clipped_update import TEMPERATURE, grpo_batch, tiny  # noqa: E402


def ragged_batch(lengths=(61, 23, 47, 9)):
    """Rows with no common prefix and different lengths (so ``collate`` pads all but the
    longest on the right), the second half of each trained, advantages of both signs."""
    samples = []
    for row, length in enumerate(lengths):
        ids = [(13 * i + 29 * row) % 300 + 3 for i in range(length)]
        trained = length // 2
        mask = [0] * (length - trained) + [1] * trained
        samples.append(UpdateSample(ids, mask, [0.0] + [-1.5] * (length - 1), (-1.0) ** row * (0.4 + 0.2 * row)))
    return samples


def one_batch(samples, causal_only):
    batches = micro_batches(samples, 4096, False)
    assert len(batches) == 1
    return collate(batches[0], 0, torch.device("cpu"), False, causal_only=causal_only)


def test_the_real_tokens_are_computed_as_under_the_padding_mask(tiny_model):
    model = tiny(tiny_model).eval()
    samples = ragged_batch()
    masked, causal = one_batch(samples, False), one_batch(samples, True)
    assert int(masked["attention_mask"].sum()) < masked["attention_mask"].numel()  # there is padding
    real = masked["attention_mask"].bool()
    with torch.no_grad():
        hidden, logprobs, entropy = masked_token_logprobs(model, masked, TEMPERATURE)
        hidden_c, logprobs_c, entropy_c = masked_token_logprobs(model, causal, TEMPERATURE)
    torch.testing.assert_close(hidden_c[real], hidden[real], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logprobs_c, logprobs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy_c, entropy, rtol=1e-6, atol=1e-6)
    # the pads themselves are computed otherwise: the setting did drop the padding mask
    assert not torch.allclose(hidden_c[~real], hidden[~real])


def test_the_padding_mask_is_dropped_only_in_a_one_call_pass(tiny_model):
    model = tiny(tiny_model).eval()
    shared = next(iter(micro_batches(grpo_batch(model), 4096, True)))
    prefixed = collate(shared, 0, torch.device("cpu"), True, causal_only=True)
    assert int(prefixed["prefix_len"]) > 0
    seen: list[object] = []
    decoder = model.get_decoder()
    handle = decoder.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True)
    try:
        with torch.no_grad():
            decoder_hidden(decoder, one_batch(ragged_batch(), True))
            decoder_hidden(decoder, one_batch(ragged_batch(), False))
            decoder_hidden(decoder, prefixed)
    finally:
        handle.remove()
    assert seen[0] is None  # causal only
    assert isinstance(seen[1], torch.Tensor)  # the plain setting keeps the padding mask
    # a shared prefix runs in two calls, the rows' call with its mask (its keys are offset)
    assert len(seen) == 4 and isinstance(seen[3], torch.Tensor)


@pytest.mark.parametrize("settings", [
    {}, {"objective": "nll"}, {"entropy_coef": 0.01, "autocast_dtype": torch.bfloat16},
    {"ppo_epochs": 2, "mini_batches": 2},
], ids=["grpo", "sft", "entropy-bf16", "two-epochs-two-mini-batches"])
def test_an_update_trains_the_same_weights_up_to_rounding(tiny_model, settings):
    results = []
    for causal_only in (False, True):
        model = tiny(tiny_model)
        params = [p for p in model.parameters() if p.requires_grad]
        metrics = update_step(model, torch.optim.SGD(params, lr=0.1), ragged_batch(), 0, UpdateSettings(
            temperature=TEMPERATURE, max_grad_norm=1e9, share_prefix=False, causal_mask_only=causal_only,
            **settings))
        results.append(({n: p.detach().clone() for n, p in model.named_parameters()}, metrics))
    (plain, plain_metrics), (causal, metrics) = results
    assert plain_metrics.keys() == metrics.keys()
    for key, value in plain_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    start = tiny(tiny_model).state_dict()
    assert any(not torch.equal(plain[name], start[name]) for name in plain)
    for name in plain:
        atol = 2e-3 if settings.get("autocast_dtype") else 1e-5
        torch.testing.assert_close(causal[name], plain[name], rtol=1e-4, atol=atol, msg=name)


def test_the_setting_reaches_the_update_and_the_quick_preset_has_it():
    assert UpdateSettings.from_config(TrainConfig(causal_mask_only=True)).causal_mask_only
    assert not UpdateSettings.from_config(TrainConfig()).causal_mask_only
    assert PRESETS["quick"]["causal_mask_only"] is True
