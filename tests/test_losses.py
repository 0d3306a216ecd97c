"""Losses and advantages against slow, obviously-correct references."""

import math

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")

from harnessrl.rl.advantages import gae, grpo_advantages, no_signal_fraction, rloo_advantages  # noqa: E402
from harnessrl.rl.losses import policy_loss, token_logprobs_and_entropy, value_loss  # noqa: E402


def reference_policy_loss(logp, old, adv, mask, low, high, rollout, cap, mode):
    """Loop over every token in plain Python floats."""
    per_seq, total, count = [], 0.0, 0
    for b in range(len(logp)):
        seq_total, seq_count = 0.0, 0
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - low), 1 + high)
            weight = 1.0 if rollout is None else min(max(math.exp(old[b][t] - rollout[b][t]), 0.0), cap)
            value = max(-adv[b][t] * ratio, -adv[b][t] * clipped) * weight
            total, count = total + value, count + 1
            seq_total, seq_count = seq_total + value, seq_count + 1
        if seq_count:
            per_seq.append(seq_total / seq_count)
    if mode == "token_mean":
        return total / count
    if mode == "seq_mean":
        return sum(per_seq) / len(per_seq)
    return total / (len(logp) * len(logp[0]))


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean", "token_sum_norm"])
@pytest.mark.parametrize("with_rollout", [False, True])
def test_policy_loss_matches_reference_with_both_clip_sides_active(mode, with_rollout):
    gen = torch.Generator().manual_seed(0)
    shape = (6, 12)
    old = -torch.rand(shape, generator=gen) * 3
    logp = old + torch.randn(shape, generator=gen) * 0.5  # ratios well outside [0.8, 1.28]
    adv = torch.randn(shape[0], 1, generator=gen).expand(shape).contiguous()
    mask = (torch.rand(shape, generator=gen) > 0.3).float()
    rollout = old + torch.randn(shape, generator=gen) * 0.8 if with_rollout else None
    out = policy_loss(logp, old, adv, mask, 0.2, 0.28, mode, rollout_logprobs=rollout)
    ref = reference_policy_loss(
        logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28,
        rollout.tolist() if rollout is not None else None, 2.0, mode,
    )
    assert float(out.loss) == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert out.metrics["clipfrac_low"] > 0 and out.metrics["clipfrac_high"] > 0
    ratios = [math.exp(lp - o) for row in zip(logp.tolist(), old.tolist(), mask.tolist(), strict=True)
              for lp, o, m in zip(*row, strict=True) if m]
    assert out.metrics["ratio_min"] == pytest.approx(min(ratios), rel=1e-5)
    assert out.metrics["ratio_max"] == pytest.approx(max(ratios), rel=1e-5)
    if with_rollout:
        assert out.metrics["iw_max"] <= 2.0 and out.metrics["iw_capped_frac"] > 0


def test_masked_tokens_get_exactly_zero_gradient():
    gen = torch.Generator().manual_seed(1)
    logp = (-torch.rand(4, 10, generator=gen)).requires_grad_()
    old = logp.detach() + torch.randn(4, 10, generator=gen) * 0.1
    adv = torch.randn(4, 10, generator=gen)
    mask = torch.ones(4, 10)
    mask[:, :3] = 0
    mask[2] = 0
    policy_loss(logp, old, adv, mask).loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    assert torch.any(logp.grad[mask == 1] != 0)


def test_importance_weight_is_clamped_and_detached():
    logp = torch.zeros(1, 3, requires_grad=True)
    old = torch.zeros(1, 3)
    rollout = torch.tensor([[-5.0, 0.0, 5.0]])  # weights e^5 -> 2, 1, e^-5
    adv = torch.ones(1, 3)
    out = policy_loss(logp, old, adv, torch.ones(1, 3), rollout_logprobs=rollout, aggregation="token_sum_norm", norm=1.0)
    # ratio = 1, so loss = -(sum of weights) = -(2 + 1 + e^-5)
    assert float(out.loss.detach()) == pytest.approx(-(2.0 + 1.0 + math.exp(-5)), rel=1e-6)
    out.loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-2.0, -1.0, -math.exp(-5)], rel=1e-6)


def test_kl_penalty_needs_a_reference_and_adds_k3():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, logp, torch.zeros(1, 2), torch.ones(1, 2), kl_coef=0.1)
    out = policy_loss(logp, logp, torch.zeros(1, 2), torch.ones(1, 2), ref_logprobs=ref, kl_coef=1.0)
    k3 = (0.5 - math.log(0.5) - 1 + 0.0) / 2
    assert float(out.loss) == pytest.approx(k3, rel=1e-5)


def test_value_loss_clips_like_cleanrl():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0]])
    out = value_loss(values, old, returns, torch.ones(1, 2), clip_range=0.2)
    # token 0: max(1, (0.2 - 0)^2) = 1 -> 0.5; token 1: max(1, (0 - 1)^2) = 1 -> 0.5
    assert float(out.loss) == pytest.approx(0.5)


def test_token_logprobs_match_log_softmax():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    logp, ent = token_logprobs_and_entropy(logits, targets, temperature=0.7)
    ref = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(logp, ref, atol=1e-6) and torch.all(ent >= 0)


def test_equal_rewards_in_a_group_give_zero_advantages():
    adv = grpo_advantages([1, 1, 1, 0, 0, 0, 1, 0], ["a", "a", "a", "b", "b", "b", "c", "c"])
    assert adv[:6] == [0.0] * 6
    assert adv[6] == pytest.approx(1.0, rel=1e-6) and adv[7] == pytest.approx(-1.0, rel=1e-6)
    assert no_signal_fraction([1, 1, 1, 0, 0, 0, 1, 0], ["a", "a", "a", "b", "b", "b", "c", "c"]) == pytest.approx(2 / 3)


def test_grpo_advantages_match_formula():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0]
    adv = grpo_advantages(rewards, ["g"] * 5)
    mean = sum(rewards) / 5
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 5)
    assert adv == pytest.approx([(r - mean) / std for r in rewards])
    assert grpo_advantages(rewards, ["g"] * 5, scale_std=False) == pytest.approx([r - mean for r in rewards])


def test_rloo_and_gae():
    assert rloo_advantages([1, 0, 0], ["g"] * 3) == pytest.approx([1.0, -0.5, -0.5])
    adv, ret = gae([0.0, 0.0, 1.0], [0.5, 0.5, 0.5], gamma=1.0, lam=1.0)
    assert adv == pytest.approx([0.5, 0.5, 0.5]) and ret == pytest.approx([1.0, 1.0, 1.0])
    adv, _ = gae([0.0, 1.0], [0.2, 0.4], gamma=0.9, lam=0.5)
    d1 = 1.0 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.2
    assert adv == pytest.approx([d0 + 0.9 * 0.5 * d1, d1])


def test_rloo_is_exactly_zero_for_groups_without_signal():
    rewards, groups = [0.7, 0.7, 0.7, 1.0, 0.0, 0.5], ["a"] * 3 + ["b"] * 3
    adv = rloo_advantages(rewards, groups)
    assert adv[:3] == [0.0, 0.0, 0.0]  # float rounding alone would leave ~1e-16
    mean_b = (1.0 + 0.0 + 0.5) / 3
    assert adv[3:] == pytest.approx([3 / 2 * (r - mean_b) for r in rewards[3:]])  # G / (G - 1) x (r - mean)
    assert rloo_advantages([1.0, 0.0], ["x", "y"]) == [0.0, 0.0]  # groups of one
