"""Policy-gradient losses as pure tensor functions, with the math written out.

Shapes: every per-token tensor is [batch, seq]; ``mask`` is 1 on policy tokens (the only
trainable ones: token-in/token-out, docs/architecture.md) and 0 elsewhere.

The token-level clipped surrogate (PPO, Schulman et al. 2017, eq. 7; GRPO, Shao et al.
2024, eq. 3; Harness-S eq. 7 with decoupled clip ranges eta- = 0.20, eta+ = 0.28 as in
DAPO, Yu et al. 2025):

    ratio_t   = exp(logp_t - old_logp_t)
    pg1_t     = -A_t * ratio_t
    pg2_t     = -A_t * clip(ratio_t, 1 - clip_low, 1 + clip_high)
    pg_t      = max(pg1_t, pg2_t) * w_t

``w_t`` is the truncated importance weight that corrects the mismatch between the
probabilities of the sampler that produced the rollout and of the trainer
(Harness-S eq. 16; Yao et al. 2025, "truncated importance sampling"):

    w_t = stopgrad( min(exp(old_logp_t - rollout_logp_t), cap) ),   cap = 2  (so w in [0, 2])

GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization") clips one ratio per sequence,
the geometric mean of its token ratios, in the GSPO-token form (its eq. 13), which also takes
per-token advantages:

    s_i     = exp( (1/|y_i|) sum_t (logp_t - old_logp_t) )
    ratio_t = stopgrad(s_i) * exp(logp_t - stopgrad(logp_t))     (value s_i, gradient s_i grad logp_t)
    w_t     = stopgrad( min(exp((1/|y_i|) sum_t (old_logp_t - rollout_logp_t)), cap) )

and the same clipped surrogate. With a sequence-level advantage and ``seq_mean`` aggregation
its gradient is GSPO's. Its clip ranges are those of a sequence ratio, about a thousand times
narrower than a token ratio's (the paper: 3e-4 and 4e-4).

`POLICY_LOSSES` names the policy losses an update can use (``policy_loss`` in the training
config); `register_policy_loss` adds one, with the clip ranges and the aggregation it runs
with when a config leaves them unset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean", "token_sum_norm")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", norm: float | None = None) -> torch.Tensor:
    """Returns the masked aggregate of per-token ``values``.

    ``token_mean``: sum over all policy tokens of the batch / their count (DAPO).
    ``seq_mean``: mean over sequences of each sequence's token mean (the original GRPO).
    ``token_sum_norm``: sum over policy tokens / a constant ``norm`` (Dr. GRPO; default:
    the number of tokens in the batch tensor, i.e. a fixed max length x batch).
    """
    mask = mask.to(values.dtype)
    if mode == "token_mean":
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    if mode == "seq_mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        has_tokens = (mask.sum(-1) > 0).to(values.dtype)
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)
    if mode == "token_sum_norm":
        return (values * mask).sum() / float(norm if norm is not None else values.numel())
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def truncated_importance_weight(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor | None, cap: float = 2.0
) -> torch.Tensor:
    """Returns the detached weight exp(old - rollout) clamped to [0, cap] (ones when no
    rollout log-probabilities are given)."""
    if rollout_logprobs is None:
        return torch.ones_like(old_logprobs)
    return torch.exp(old_logprobs - rollout_logprobs).clamp(0.0, cap).detach()


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Returns a per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020):
    k1 = log pi - log pi_ref;  k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1 (>= 0)."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        log_ratio = ref_logprobs - logprobs
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1 or k3")


@dataclass
class LossOutput:
    """The loss to back-propagate and its diagnostics (plain floats)."""

    loss: torch.Tensor
    metrics: dict[str, float]


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: str = "token_mean",
    norm: float | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    importance_cap: float = 2.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    sequence_ratio: bool = False,
) -> LossOutput:
    """Returns the clipped-surrogate policy loss (+ KL penalty, - entropy bonus) and diagnostics.

    ``advantages`` is [batch, seq] (a sequence-level advantage broadcast over its tokens, or
    per-token advantages from GAE). KL and entropy are off unless their coefficient is > 0
    (both papers train without KL). ``sequence_ratio``: GSPO's ratio and importance weight,
    one per sequence (see the module text), in place of one per token.
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    if sequence_ratio:
        ratio, weight = _sequence_ratio(logprobs, log_ratio, old_logprobs, rollout_logprobs, mask, importance_cap)
    else:
        ratio = torch.exp(log_ratio)
        weight = truncated_importance_weight(old_logprobs, rollout_logprobs, importance_cap)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_losses = torch.max(pg_loss1, pg_loss2) * weight
    loss = aggregate(pg_losses, mask, aggregation, norm)

    metrics: dict[str, float] = {}
    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs from a frozen reference model")
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        kl_term = aggregate(kl, mask, aggregation, norm)
        loss = loss + kl_coef * kl_term
        metrics["kl_ref"] = float(kl_term.detach())
    if entropy_coef > 0.0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs per-token entropy")
        loss = loss - entropy_coef * aggregate(entropy, mask, aggregation, norm)

    with torch.no_grad():
        clipped_low = ((ratio < 1.0 - clip_low) & (advantages < 0)).to(mask.dtype)
        clipped_high = ((ratio > 1.0 + clip_high) & (advantages > 0)).to(mask.dtype)
        metrics.update(
            {
                "pg_loss": float(aggregate(pg_losses, mask, aggregation, norm)),
                "clipfrac_low": float(masked_mean(clipped_low, mask)),
                "clipfrac_high": float(masked_mean(clipped_high, mask)),
                # k3 estimator of KL(old || new) (CleanRL's approx_kl)
                "approx_kl": float(masked_mean(ratio - 1.0 - log_ratio, mask)),
                "ratio_mean": float(masked_mean(ratio, mask)),
                "ratio_min": float(ratio[mask > 0].min()) if mask.any() else 1.0,
                "ratio_max": float(ratio[mask > 0].max()) if mask.any() else 1.0,
                "iw_mean": float(masked_mean(weight, mask)),
                "iw_max": float((weight * mask).max()) if mask.any() else 0.0,
                "iw_capped_frac": float(masked_mean((weight >= importance_cap).to(mask.dtype), mask)),
                "policy_tokens": float(mask.sum()),
            }
        )
        if entropy is not None:
            metrics["entropy"] = float(masked_mean(entropy, mask))
    return LossOutput(loss, metrics)


def gspo_loss(*args: Any, **kwargs: Any) -> LossOutput:
    """GSPO: `policy_loss` with one ratio and one importance weight per sequence (its clip
    ranges and aggregation are the caller's; the registry's entry brings GSPO's own)."""
    return policy_loss(*args, sequence_ratio=True, **kwargs)


def _sequence_ratio(
    logprobs: torch.Tensor, log_ratio: torch.Tensor, old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None, mask: torch.Tensor, cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns GSPO-token's per-token ratio (the sequence ratio's value, the token's gradient)
    and the sequence's truncated importance weight, both [batch, seq]."""
    lengths = mask.sum(-1, keepdim=True).clamp_min(1.0)
    sequence = torch.exp((log_ratio * mask).sum(-1, keepdim=True) / lengths)
    ratio = sequence.detach() * torch.exp(logprobs - logprobs.detach())
    if rollout_logprobs is None:
        return ratio, torch.ones_like(ratio)
    mismatch = ((old_logprobs - rollout_logprobs) * mask).sum(-1, keepdim=True) / lengths
    return ratio, torch.exp(mismatch).clamp(0.0, cap).detach().expand_as(ratio)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None = 0.2,
    aggregation: str = "token_mean",
) -> LossOutput:
    """Returns PPO's clipped value loss (CleanRL ppo.py):
    0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)."""
    unclipped = (values - returns) ** 2
    if clip_range is None:
        losses = 0.5 * unclipped
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        losses = 0.5 * torch.max(unclipped, (clipped_values - returns) ** 2)
    loss = aggregate(losses, mask, aggregation)
    with torch.no_grad():
        m = mask.to(values.dtype)
        var_returns = masked_mean((returns - masked_mean(returns, m)) ** 2, m)
        var_residual = masked_mean((returns - values - masked_mean(returns - values, m)) ** 2, m)
        explained = 1.0 - float(var_residual / var_returns) if float(var_returns) > 0 else float("nan")
        clipfrac = (
            float(masked_mean(((values - old_values).abs() > clip_range).to(m.dtype), m)) if clip_range else 0.0
        )
    return LossOutput(loss, {"vf_loss": float(loss.detach()), "vf_clipfrac": clipfrac, "explained_variance": explained})


def token_logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns log pi(target) and the entropy per position from logits [B, T, V] scaled by
    1/temperature (the same scaling the sampler used, so ratios compare like with like)."""
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy


PolicyLoss = Callable[..., LossOutput]


@dataclass(frozen=True)
class PolicyLossEntry:
    """A registered policy loss (the signature of `policy_loss`) and what it runs with when a
    training config leaves them unset: its clip ranges and its aggregation (`aggregate`)."""

    function: PolicyLoss
    clip_low: float
    clip_high: float
    aggregation: str


POLICY_LOSSES: dict[str, PolicyLossEntry] = {}


def register_policy_loss(
    name: str, function: PolicyLoss, *, clip_low: float, clip_high: float, aggregation: str = "token_mean"
) -> PolicyLoss:
    """Registers ``function`` as policy loss ``name`` (``policy_loss: name`` in a config)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {', '.join(AGGREGATIONS)}")
    POLICY_LOSSES[name] = PolicyLossEntry(function, clip_low, clip_high, aggregation)
    return function


register_policy_loss("clipped", policy_loss, clip_low=0.2, clip_high=0.28)
register_policy_loss("gspo", gspo_loss, clip_low=3e-4, clip_high=4e-4, aggregation="seq_mean")
