"""What an update trains: `UpdateSettings` (one object for every setting of `update_step`) and
the registry of objectives, each the loss of one micro-batch.

``pg`` is a policy-gradient loss of `losses.POLICY_LOSSES` (the clipped surrogate, GSPO),
aggregated over the whole mini-batch although it is computed micro-batch by micro-batch, with
the KL penalty, the entropy bonus and, when the actor has a critic, PPO's value loss. ``nll``
is SFT's negative log-likelihood. `register_objective` adds one: a function of the micro-batch
(`MicroBatch`: its tensors, its forward, the totals of its mini-batch) that returns the loss to
back-propagate, its token-weighted diagnostics and its share of the step's loss terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from harnessrl.rl.forward import masked_token_logprobs
from harnessrl.rl.losses import POLICY_LOSSES, value_loss


@dataclass(frozen=True)
class UpdateSettings:
    """The settings of one update (`update_step`); `from_config` reads them from a training
    config. The fields and their defaults are those of `rl.config.TrainConfig` (its field
    descriptions say what each does); ``objective`` is an entry of `OBJECTIVES`,
    ``policy_loss`` one of `losses.POLICY_LOSSES` (``clip_low``, ``clip_high`` and
    ``aggregation`` left at None are that loss's own), ``autocast_dtype`` the actor's (None:
    bfloat16 on CUDA, off elsewhere)."""

    objective: str = "pg"
    policy_loss: str = "clipped"
    temperature: float = 1.0
    clip_low: float | None = None
    clip_high: float | None = None
    aggregation: str | None = None
    loss_norm_tokens: int | None = None
    importance_cap: float = 2.0
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 4096
    lm_head_chunk_tokens: int = 0
    causal_mask_only: bool = False
    vf_coef: float = 0.1
    vf_clip: float | None = 0.2
    autocast_dtype: torch.dtype | None = None
    share_prefix: bool = True
    ppo_epochs: int = 1
    mini_batches: int = 1

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"unknown policy loss {self.policy_loss!r}; choose one of {', '.join(POLICY_LOSSES)}")
        if self.ppo_epochs < 1 or self.mini_batches < 1:
            raise ValueError(
                f"ppo_epochs and mini_batches must be at least 1, got {self.ppo_epochs} and {self.mini_batches}")

    @classmethod
    def from_config(cls, cfg: Any, autocast_dtype: torch.dtype | None = None, **changes: Any) -> UpdateSettings:
        """Returns the update settings of training config ``cfg`` (``objective: sft`` trains
        ``nll``; a sampling temperature of 0 trains at 1), with ``changes`` applied."""
        settings = cls(
            objective="nll" if cfg.objective == "sft" else "pg", policy_loss=cfg.policy_loss,
            temperature=cfg.temperature if cfg.temperature > 0 else 1.0,
            clip_low=cfg.clip_low, clip_high=cfg.clip_high, aggregation=cfg.aggregation,
            loss_norm_tokens=cfg.loss_norm_tokens or cfg.max_turns * cfg.max_new_tokens,
            importance_cap=cfg.importance_cap, entropy_coef=cfg.entropy_coef, kl_coef=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator, max_grad_norm=cfg.max_grad_norm,
            micro_batch_tokens=cfg.micro_batch_tokens, lm_head_chunk_tokens=cfg.lm_head_chunk_tokens,
            causal_mask_only=cfg.causal_mask_only, vf_coef=cfg.vf_coef, vf_clip=cfg.vf_clip,
            autocast_dtype=autocast_dtype, ppo_epochs=cfg.ppo_epochs, mini_batches=cfg.mini_batches,
        )
        return replace(settings, **changes)

    def loss_settings(self) -> tuple[float, float, str]:
        """Returns (clip_low, clip_high, aggregation), the policy loss's own where unset."""
        entry = POLICY_LOSSES[self.policy_loss]
        return (entry.clip_low if self.clip_low is None else self.clip_low,
                entry.clip_high if self.clip_high is None else self.clip_high,
                entry.aggregation if self.aggregation is None else self.aggregation)

    @property
    def multi_step(self) -> bool:
        """Whether the update takes more than one optimizer step (old log-probabilities are
        then computed once, before the first)."""
        return self.objective == "pg" and (self.ppo_epochs > 1 or self.mini_batches > 1)


@dataclass(frozen=True)
class MiniBatchTotals:
    """What a micro-batch's loss needs of its whole mini-batch: the policy tokens, the samples
    with at least one, and the PPO value positions."""

    tokens: float
    sequences: float
    values: float


@dataclass
class MicroBatch:
    """One micro-batch after its forward pass: the collated tensors (`batching.collate`), the
    last hidden states, the log-probabilities and entropies of its trained positions, and
    its mini-batch's totals."""

    data: dict[str, torch.Tensor]
    hidden: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor
    totals: MiniBatchTotals
    rows: int
    n_tokens: float


@dataclass
class ObjectiveOutput:
    """A micro-batch's loss, its token-weighted diagnostics, and its share of the loss terms
    the update reports once per optimizer step (``pg_loss``, ``kl_ref``, ``vf_loss``)."""

    loss: torch.Tensor
    metrics: dict[str, float]
    terms: dict[str, float] = field(default_factory=dict)


Objective = Callable[[MicroBatch, UpdateSettings, "torch.nn.Module | None", "torch.nn.Module | None"], ObjectiveOutput]
OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str) -> Callable[[Objective], Objective]:
    """Registers an objective ``fn(batch, settings, ref_model, value_head) -> ObjectiveOutput``."""

    def decorate(function: Objective) -> Objective:
        OBJECTIVES[name] = function
        return function

    return decorate


@register_objective("nll")
def nll_objective(batch: MicroBatch, settings: UpdateSettings, ref_model: Any, value_head: Any) -> ObjectiveOutput:
    """SFT: the summed negative log-likelihood of the trained tokens over the mini-batch's."""
    mask = batch.data["mask"]
    loss = -(batch.logprobs * mask).sum() / max(batch.totals.tokens, 1.0)
    with torch.no_grad():
        metrics = {
            "nll": float(-(batch.logprobs * mask).sum() / batch.n_tokens),
            "entropy": float((batch.entropy * mask).sum() / batch.n_tokens),
        }
    return ObjectiveOutput(loss, metrics)


def _mini_batch_aggregation(aggregation: str, settings: UpdateSettings, batch: MicroBatch) -> tuple[str, float | None, float]:
    """Returns (aggregation, norm, scale) that make a micro-batch's loss its share of the
    mini-batch's: ``token_mean`` becomes a sum over tokens / all policy tokens of the
    mini-batch; ``seq_mean`` weights by sequences; ``token_sum_norm`` divides the sum by the
    mini-batch's sequences x ``loss_norm_tokens`` (Dr. GRPO's constant: the same for any
    packing and any lengths)."""
    totals = batch.totals
    if aggregation == "token_mean":
        return "token_sum_norm", totals.tokens, 1.0
    if aggregation == "seq_mean":
        return "seq_mean", None, batch.rows / max(totals.sequences, 1.0)
    if settings.loss_norm_tokens is None:
        raise ValueError("aggregation token_sum_norm needs loss_norm_tokens, the constant a sequence's summed "
                         "token loss is divided by (Dr. GRPO: the generation budget)")
    return "token_sum_norm", max(totals.sequences, 1.0) * settings.loss_norm_tokens, 1.0


@register_objective("pg")
def pg_objective(
    batch: MicroBatch, settings: UpdateSettings, ref_model: torch.nn.Module | None, value_head: torch.nn.Module | None,
) -> ObjectiveOutput:
    """A policy-gradient loss (``settings.policy_loss``) with its KL penalty against
    ``ref_model`` and, with a ``value_head``, PPO's value loss over the value positions."""
    data = batch.data
    ref_logprobs = None
    if settings.kl_coef > 0:
        if ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        with torch.no_grad():
            _, ref_logprobs, _ = masked_token_logprobs(ref_model, data, settings.temperature,
                                                    head_chunk_tokens=settings.lm_head_chunk_tokens)
    clip_low, clip_high, aggregation = settings.loss_settings()
    agg, norm, scale = _mini_batch_aggregation(aggregation, settings, batch)
    old_logprobs = data["old_logprobs"] if "old_logprobs" in data else batch.logprobs.detach()
    out = POLICY_LOSSES[settings.policy_loss].function(
        batch.logprobs, old_logprobs, data["advantages"], data["mask"], clip_low, clip_high, agg, norm, rollout_logprobs=data["rollout_logprobs"], importance_cap=settings.importance_cap,
        ref_logprobs=ref_logprobs, kl_coef=settings.kl_coef, kl_estimator=settings.kl_estimator,
        entropy=batch.entropy, entropy_coef=settings.entropy_coef,
    )
    loss = out.loss * scale
    metrics = dict(out.metrics)
    terms = {key: metrics.pop(key) * scale for key in ("pg_loss", "kl_ref") if key in metrics}
    if value_head is not None and float(data["value_mask"].sum()) > 0:
        values = value_head(batch.hidden.float()).squeeze(-1)
        # The mean over the mini-batch's value positions, whatever the padding.
        vf = value_loss(values, data["old_values"], data["returns"], data["value_mask"], settings.vf_clip, "token_mean")
        value_share = float(data["value_mask"].sum()) / max(batch.totals.values, 1.0)
        loss = loss + settings.vf_coef * vf.loss * value_share
        metrics.update(vf.metrics)
        terms["vf_loss"] = metrics.pop("vf_loss") * value_share
    with torch.no_grad():
        # The sampler's mismatch with the trainer under the weights that sampled.
        mismatch = (data["rollout_logprobs"] - old_logprobs).abs() * data["mask"]
        metrics["rollout_logprob_diff"] = float(mismatch.sum() / batch.n_tokens)
    return ObjectiveOutput(loss, metrics, terms)
