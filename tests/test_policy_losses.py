"""The policy-loss registry (`rl.losses.POLICY_LOSSES`) and GSPO against its own definition.

GSPO (Zheng et al. 2025) clips one importance ratio per sequence, s_i = exp(mean_t log
pi/pi_old), and maximises mean_i min(s_i A_i, clip(s_i) A_i). We implement its GSPO-token form
(a token ratio whose value is s_i and whose gradient is s_i grad log pi_t), which takes per-token
advantages too; for sequence-level advantages its gradient must be that of the sequence
objective, written out below by the paper's formula with the gradient through s_i itself.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")

from harnessrl.rl.config import TrainConfig, load_config  # noqa: E402
from harnessrl.rl.losses import POLICY_LOSSES, gspo_loss, policy_loss, register_policy_loss  # noqa: E402


def batch(seed=0, rows=4, length=9):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, length)
    for row in range(rows):
        mask[row, : 1 + row] = 0.0  # prompts of different lengths
    logprobs = (-torch.rand(rows, length, generator=g) * 2).requires_grad_(True)
    old = (logprobs.detach() + torch.randn(rows, length, generator=g) * 3e-4)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(-1).expand(rows, length)
    return logprobs, old, advantages, mask


def gspo_by_the_paper(logprobs, old, advantages, mask, low, high):
    """-mean_i min(s_i A_i, clip(s_i, 1-low, 1+high) A_i), s_i = exp(mean_t (logp - old))."""
    s = torch.exp(((logprobs - old) * mask).sum(-1) / mask.sum(-1))
    a = advantages[:, 0]
    return -torch.min(s * a, torch.clamp(s, 1 - low, 1 + high) * a).mean()


@pytest.mark.parametrize("low,high", [(3e-4, 4e-4), (1e-5, 1e-5)])  # the paper's ranges; ranges that clip
def test_gspo_has_the_gradient_of_the_sequence_objective(low, high):
    logprobs, old, advantages, mask = batch()
    ours = gspo_loss(logprobs, old, advantages, mask, low, high, "seq_mean")
    (grad,) = torch.autograd.grad(ours.loss, logprobs)
    reference = gspo_by_the_paper(logprobs, old, advantages, mask, low, high)
    (expected,) = torch.autograd.grad(reference, logprobs)
    # float32: the loss is a small difference of terms near 1, its rounding ~1e-8
    assert float(ours.loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-7)
    assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-8)
    if low == 1e-5:  # some sequences clipped: their rows get no gradient, the others do
        s = torch.exp(((logprobs - old) * mask).sum(-1) / mask.sum(-1)).detach()
        a = advantages[:, 0]
        clipped = ((s > 1 + high) & (a > 0)) | ((s < 1 - low) & (a < 0))
        assert clipped.any() and not clipped.all()
        assert torch.all(grad[clipped] == 0) and torch.all(grad[~clipped].abs().sum(-1) > 0)
        assert ours.metrics["clipfrac_low"] + ours.metrics["clipfrac_high"] > 0


def test_gspo_on_policy_is_the_sequence_mean_policy_gradient():
    """At ratio 1 (the on-policy step) GSPO and the token-clipped loss with seq_mean agree:
    both are -mean_i A_i mean_t grad log pi_t."""
    logprobs, _, advantages, mask = batch(seed=1)
    old = logprobs.detach()
    (gspo,) = torch.autograd.grad(gspo_loss(logprobs, old, advantages, mask, aggregation="seq_mean").loss, logprobs)
    (token,) = torch.autograd.grad(policy_loss(logprobs, old, advantages, mask, aggregation="seq_mean").loss, logprobs)
    assert torch.allclose(gspo, token, rtol=1e-6, atol=1e-8)


def test_gspo_importance_weight_is_one_per_sequence_and_capped():
    logprobs, old, advantages, mask = batch(seed=2)
    rollout = old.clone()
    rollout[0] -= 5.0  # the sampler was far less likely on sequence 0: its weight hits the cap
    out = gspo_loss(logprobs, old, advantages, mask, rollout_logprobs=rollout, importance_cap=2.0)
    assert out.metrics["iw_max"] == pytest.approx(2.0)
    # one weight per sequence: a quarter of the rows (by tokens, row 0 has the most) is capped
    tokens = mask.sum(-1)
    assert out.metrics["iw_capped_frac"] == pytest.approx(float(tokens[0] / tokens.sum()))


def test_the_registry_names_both_losses_and_brings_their_defaults():
    assert {"clipped", "gspo"} <= set(POLICY_LOSSES)
    clipped = POLICY_LOSSES["clipped"]
    fields = TrainConfig.model_fields
    # The default loss's entry says what the config's own defaults say.
    assert (clipped.clip_low, clipped.clip_high, clipped.aggregation) == (
        fields["clip_low"].default, fields["clip_high"].default, fields["aggregation"].default)
    cfg = load_config(overrides={"policy_loss": "gspo"})
    assert (cfg.clip_low, cfg.clip_high, cfg.aggregation) == (3e-4, 4e-4, "seq_mean")
    cfg = load_config(overrides={"policy_loss": "gspo", "clip_high": 1e-3})  # what is set stays set
    assert (cfg.clip_low, cfg.clip_high) == (3e-4, 1e-3)
    with pytest.raises(ValueError, match=r"unknown policy loss .gpsoo.; choose one of clipped, gspo"):
        load_config(overrides={"policy_loss": "gpsoo"})


def test_a_registered_loss_is_what_the_update_runs(tiny_model):
    """A loss added with `register_policy_loss` is chosen by name, by the config and the update."""
    import transformers

    from harnessrl.rl.batching import UpdateSample
    from harnessrl.rl.objectives import UpdateSettings
    from harnessrl.rl.update import update_step

    calls = []

    def halved(*args, **kwargs):
        calls.append(kwargs["importance_cap"])
        out = policy_loss(*args, **kwargs)
        out.loss = out.loss * 0.5
        return out

    register_policy_loss("halved-for-test", halved, clip_low=0.1, clip_high=0.1)
    try:
        assert load_config(overrides={"policy_loss": "halved-for-test"}).clip_low == 0.1
        grads = {}
        for name in ("clipped", "halved-for-test", "gspo"):
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
            ids = list(range(10, 40))
            samples = [UpdateSample(ids, [0] * 12 + [1] * 18, [-2.0] * 30, 1.0),
                       UpdateSample(ids[::-1], [0] * 12 + [1] * 18, [-2.0] * 30, -1.0)]
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
            metrics = update_step(model, optimizer, samples, 0, UpdateSettings(policy_loss=name, max_grad_norm=1e9))
            grads[name] = metrics["grad_norm"]
            assert metrics["ratio_mean"] == pytest.approx(1.0)  # on-policy
        assert calls == [2.0]
        assert grads["halved-for-test"] == pytest.approx(grads["clipped"] / 2, rel=1e-5)
        assert grads["gspo"] > 0
    finally:
        POLICY_LOSSES.pop("halved-for-test")
    with pytest.raises(ValueError, match="unknown policy loss"):
        UpdateSettings(policy_loss="halved-for-test")
    assert UpdateSettings(policy_loss="gspo").loss_settings() == (3e-4, 4e-4, "seq_mean")
    assert UpdateSettings(policy_loss="gspo", clip_low=0.1).loss_settings() == (0.1, 4e-4, "seq_mean")
