"""The update of one batch of token-level samples: epochs, mini-batches, micro-batching, one
optimizer step per mini-batch.

Shared by the GRPO and PPO trainers (advantage per sample or per token) and SFT (advantage 1,
a negative log-likelihood): what is trained is an objective of `rl.objectives.OBJECTIVES`,
chosen by `UpdateSettings`. A rollout batch is trained in ``ppo_epochs`` passes of
``mini_batches`` shuffled mini-batches, one optimizer step each, against old log-probabilities
computed once (PPO, Schulman et al. 2017, sec. 5). Within a mini-batch, sequences are packed
into micro-batches by a padded-token budget (`rl.batching`) and gradients are accumulated so
that the optimizer step's loss equals the loss over the whole mini-batch.
"""

from __future__ import annotations

from typing import Any

import torch

from harnessrl.rl.batching import UpdateSample, collate, micro_batches, mini_batch_order
from harnessrl.rl.forward import (
    as_forward,
    autocast_context,
    masked_token_logprobs,
    old_token_logprobs,
)
from harnessrl.rl.objectives import OBJECTIVES, MicroBatch, MiniBatchTotals, UpdateSettings


class _Diagnostics:
    """The update's diagnostics as they accumulate: token-weighted sums of the micro-batches'
    metrics (``*_max`` / ``*_min``: extremes) and each optimizer step's loss terms."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.loss_terms: dict[str, list[float]] = {}
        self.grad_norms: list[float] = []
        self.micro_batches = 0
        self.prefix_tokens_saved = 0

    def add(self, metrics: dict[str, float], n_tokens: float) -> None:
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value * n_tokens
            self.weights[key] = self.weights.get(key, 0.0) + n_tokens
            if key.endswith("_max"):
                self.extremes[key] = max(self.extremes.get(key, value), value)
            elif key.endswith("_min"):
                self.extremes[key] = min(self.extremes.get(key, value), value)

    def result(self, samples: list[UpdateSample], data_parallel: Any) -> dict[str, float]:
        sums, weights, extremes, saved = self.sums, self.weights, self.extremes, self.prefix_tokens_saved
        if data_parallel is not None:
            sums, weights = data_parallel.reduce_sums(sums), data_parallel.reduce_sums(weights)
            extremes = data_parallel.reduce_extremes(extremes)
            # Every rank counts all micro-batches; each saved prefix tokens only in its own.
            saved = int(data_parallel.reduce_sums({"saved": saved})["saved"])
        result = {k: sums[k] / weights[k] for k in sums}
        result.update(extremes)
        result.update({key: sum(values) / len(values) for key, values in self.loss_terms.items()})
        result.update({
            "grad_norm": sum(self.grad_norms) / len(self.grad_norms), "optimizer_steps": float(len(self.grad_norms)),
            "micro_batches": float(self.micro_batches),
            "trained_tokens": float(sum(sum(s.loss_mask[1:]) for s in samples)),
            "prefix_tokens_saved": float(saved),
        })
        return result


def update_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[UpdateSample],
    pad_id: int,
    settings: UpdateSettings | None = None,
    *,
    ref_model: torch.nn.Module | None = None,
    value_head: torch.nn.Module | None = None,
    scheduler: Any = None,
    seed: int = 0,
    data_parallel: Any = None,
) -> dict[str, float]:
    """Runs the update of one rollout batch under ``settings`` (default `UpdateSettings()`) and
    returns its diagnostics: token-weighted means over every micro-batch of every optimizer
    step (``*_max`` / ``*_min``: the extremes), and for the loss terms (``pg_loss``,
    ``kl_ref``, ``vf_loss``) the mean over optimizer steps of each step's value.

    The update makes ``ppo_epochs`` passes over ``samples``, each a seeded (``seed``) shuffle
    split into ``mini_batches`` mini-batches, one optimizer step per mini-batch
    (``mini_batch_order``; verl's ``ppo_epochs`` and PPO mini-batches, TRL's
    ``num_iterations``). The old log-probabilities of the ratio are computed once, before the
    first step, under the weights that sampled the batch (no gradient); the later steps'
    ratios depart from 1 and the clip acts. The truncated importance weight compares those old
    log-probabilities with the sampler's (``rollout_logprobs``), so it stays fixed across the
    passes. With one pass of one mini-batch (the default) the update is on-policy: the old
    log-probabilities are the current ones, detached, and no extra forward pass runs. A PPO
    ``value_head`` trains in the same passes, its clipped value loss against the samples'
    ``old_values``; ``ref_model`` is the frozen reference of a KL penalty.
    ``scheduler`` steps once per call, after the last optimizer step, as verl's actor does:
    a schedule counts rollout batches whatever ``ppo_epochs`` and ``mini_batches`` are.
    ``autocast_dtype``: forward and backward under ``torch.autocast`` in that dtype while the
    weights, gradients and optimizer state stay in theirs (mixed precision).
    ``share_prefix``: micro-batches group samples with a common untrained prefix (a GRPO
    group's prompt, a harness's system prompt) and run it once (``decoder_hidden``); the
    step's loss and gradients are unchanged.
    ``data_parallel`` (``rl.distributed.DataParallel``; every rank holds all ``samples``): this
    rank runs only its share of each mini-batch's micro-batches (``DataParallel.local``), the
    gradients are summed over the ranks before clipping (FSDP2's reduce-scatter for a sharded
    model, one all-reduce for replicated parameters) and the diagnostics are reduced over them,
    so every rank takes the optimizer step one process would take (up to the order of the sums).
    """
    settings = settings or UpdateSettings()
    if not samples:
        return {"skipped": 1.0}
    model.train()
    old_of = None
    if settings.multi_step:
        old_of = old_token_logprobs(model, samples, pad_id, settings.temperature, settings.micro_batch_tokens,
                                    settings.autocast_dtype, settings.share_prefix, settings.lm_head_chunk_tokens,
                                    settings.causal_mask_only)
    params = [p for p in model.parameters() if p.requires_grad]
    if value_head is not None:
        params += list(value_head.parameters())
    diagnostics = _Diagnostics()
    for indices in mini_batch_order(len(samples), settings.ppo_epochs, settings.mini_batches, seed):
        optimizer.zero_grad(set_to_none=True)
        step_terms = _accumulate_mini_batch(
            model, [samples[i] for i in indices], pad_id, settings, old_of, ref_model, value_head,
            data_parallel, diagnostics,
        )
        if data_parallel is not None:
            data_parallel.reduce_gradients(params)
            step_terms = data_parallel.reduce_sums(step_terms)
        for key, value in step_terms.items():
            diagnostics.loss_terms.setdefault(key, []).append(value)
        diagnostics.grad_norms.append(clip_gradients(params, settings.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return diagnostics.result(samples, data_parallel)


def _accumulate_mini_batch(
    model: torch.nn.Module, mini_batch: list[UpdateSample], pad_id: int, settings: UpdateSettings,
    old_of: dict[int, torch.Tensor] | None, ref_model: torch.nn.Module | None,
    value_head: torch.nn.Module | None, data_parallel: Any, diagnostics: _Diagnostics,
) -> dict[str, float]:
    """Runs the forward and backward of every micro-batch of ``mini_batch`` this rank owns,
    accumulating gradients and ``diagnostics``; returns the step's loss terms."""
    device = next(model.parameters()).device
    objective = OBJECTIVES[settings.objective]
    batches = micro_batches(mini_batch, settings.micro_batch_tokens, settings.share_prefix)
    totals = MiniBatchTotals(
        tokens=float(sum(sum(s.loss_mask[1:]) for s in mini_batch)),
        sequences=float(sum(1 for s in mini_batch if sum(s.loss_mask[1:]) > 0)),
        values=float(sum(len(s.value_positions) for s in mini_batch)),
    )
    diagnostics.micro_batches += len(batches)
    step_terms: dict[str, float] = {}  # the loss terms of this optimizer step
    local = data_parallel.local(batches, settings.share_prefix) if data_parallel is not None else None
    for batch, weight, two_calls in (
        ((b.samples, b.weight, b.two_calls) for b in local) if local is not None
        else ((b, 1.0, False) for b in batches)
    ):
        # weight 0 and two_calls keep a sharded model's collectives in step (rl.distributed)
        data = collate(batch, pad_id, device, settings.share_prefix, old_of, two_calls, settings.causal_mask_only)
        n_tokens = float(data["mask"].sum())
        if n_tokens == 0:
            continue
        if weight:
            diagnostics.prefix_tokens_saved += int(data["prefix_len"]) * (len(batch) - 1)
        with autocast_context(device, settings.autocast_dtype):
            hidden, logprobs, entropy = as_forward(
                model, masked_token_logprobs, model, data,
                settings.temperature if settings.objective == "pg" else 1.0, settings.entropy_coef > 0,
                settings.lm_head_chunk_tokens,
            )
        out = objective(MicroBatch(data, hidden, logprobs, entropy, totals, len(batch), n_tokens),
                        settings, ref_model, value_head)
        for key, value in out.terms.items():
            step_terms[key] = step_terms.get(key, 0.0) + value * weight
        if not weight:
            (out.loss * 0.0).backward()
            continue
        out.loss.backward()
        diagnostics.add(out.metrics, n_tokens)
    return step_terms


@torch.no_grad()
def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scales the gradients of ``params`` to a total 2-norm of at most ``max_norm`` (the
    coefficient of ``torch.nn.utils.clip_grad_norm_``) and returns the norm before, summed in
    float64: a float32 norm of a large embedding's gradient is off by ~3e-4 on CPU, and the
    squares of a sharded model's shards (FSDP2 ``DTensor`` gradients, one all-reduce) must add
    up to the norm one process computes."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    sharded_type: Any = ()
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor as sharded_type
    sharded = replicated = torch.zeros((), dtype=torch.float64, device=grads[0].device)
    mesh = None
    for grad in grads:
        if isinstance(grad, sharded_type):
            mesh = grad.device_mesh  # every shard of rl.distributed's FSDP2 lies on one 1-D mesh
            sharded = sharded + torch.linalg.vector_norm(grad.to_local(), dtype=torch.float64) ** 2
        else:
            replicated = replicated + torch.linalg.vector_norm(grad, dtype=torch.float64) ** 2
    if mesh is not None:
        torch.distributed.all_reduce(sharded, group=mesh.get_group())
    total = float((sharded + replicated).sqrt())
    coefficient = max_norm / (total + 1e-6)
    if coefficient < 1.0:
        for grad in grads:
            grad.mul_(coefficient)
    return total
