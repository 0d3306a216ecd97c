"""The update of one batch of token-level samples: epochs, mini-batches, micro-batching, the loss.

Shared by the GRPO and PPO trainers (advantage per sample or per token) and SFT (advantage 1,
no clipping, a negative log-likelihood). A rollout batch is trained in ``ppo_epochs`` passes
of ``mini_batches`` shuffled mini-batches, one optimizer step each, against old
log-probabilities computed once (PPO, Schulman et al. 2017, sec. 5). Within a mini-batch,
sequences are packed into micro-batches by a padded-token budget and gradients are
accumulated so that the optimizer step's loss equals the loss over the whole mini-batch.
"""

from __future__ import annotations

import contextlib
import inspect
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from harnessrl.rl.losses import policy_loss, value_loss


@dataclass
class UpdateSample:
    """One sequence to train on: ids, loss mask (policy tokens), the sampler's log-probs and
    the advantage of every trainable token (a scalar broadcast, or one per token)."""

    input_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float | list[float] = 1.0
    meta: dict[str, Any] = field(default_factory=dict)
    # PPO critic targets: positions whose hidden state values the state (the token before a
    # turn's first sampled token), the return there, and the value at rollout time.
    value_positions: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    old_values: list[float] = field(default_factory=list)


def trainable_prefix(sample: UpdateSample) -> int:
    """Returns how many leading tokens of ``sample`` no loss reads: every position before the
    one whose logits predict the first trained token (``len - 1`` when nothing is trained)."""
    for index, flag in enumerate(sample.loss_mask):
        if flag and index > 0:
            return index - 1
    return max(0, len(sample.input_ids) - 1)


def shared_prefix(batch: list[UpdateSample]) -> int:
    """Returns the length of the prefix every sample of ``batch`` has in common and no loss of
    any of them reads (``trainable_prefix``); PPO value positions also lie past it."""
    if len(batch) < 2:
        return 0
    limit = min(trainable_prefix(s) for s in batch)
    first = batch[0].input_ids
    for s in batch[1:]:
        other = s.input_ids
        n = min(limit, len(other))
        i = 0
        while i < n and first[i] == other[i]:
            i += 1
        limit = i
        if limit == 0:
            break
    for s in batch:
        if s.value_positions:
            limit = min(limit, min(s.value_positions))
    return limit


#: A shared prefix shorter than this is not worth a separate forward pass.
MIN_SHARED_PREFIX = 64


def batch_cost(batch: list[UpdateSample], share_prefix: bool) -> int:
    """Returns the tokens a micro-batch pushes through the model: rows x longest, or with a
    shared prefix ``P``, ``P + rows x (longest - P)``."""
    longest = max(len(s.input_ids) for s in batch)
    prefix = shared_prefix(batch) if share_prefix else 0
    if prefix < MIN_SHARED_PREFIX:
        return longest * len(batch)
    return prefix + len(batch) * (longest - prefix)


def micro_batches(samples: list[UpdateSample], token_budget: int, share_prefix: bool = False) -> list[list[UpdateSample]]:
    """Returns groups of samples whose cost (``batch_cost``) fits ``token_budget`` (a sample
    longer than the budget goes alone). Without prefix sharing they are sorted by length to
    waste little padding; with it, by their token ids, so that samples with a common prefix
    (the G rollouts of one GRPO group, demonstrations under one harness) sit together."""
    by_length = _pack(sorted(samples, key=lambda s: len(s.input_ids), reverse=True), token_budget, share_prefix)
    if not share_prefix:
        return by_length
    by_ids = _pack(sorted(samples, key=lambda s: s.input_ids), token_budget, share_prefix)
    # Samples without common prefixes pack better by length: keep the cheaper packing.
    if sum(batch_cost(b, True) for b in by_ids) < sum(batch_cost(b, True) for b in by_length):
        return by_ids
    return by_length


def _pack(order: list[UpdateSample], token_budget: int, share_prefix: bool) -> list[list[UpdateSample]]:
    batches: list[list[UpdateSample]] = []
    current: list[UpdateSample] = []
    for sample in order:
        full = bool(current) and batch_cost([*current, sample], share_prefix) > token_budget
        # A sample that would end the current batch's common prefix starts a new batch.
        breaks = share_prefix and len(current) > 1 and shared_prefix(current) >= MIN_SHARED_PREFIX > shared_prefix(
            [*current, sample]
        )
        if full or breaks:
            batches.append(current)
            current = []
        current.append(sample)
    if current:
        batches.append(current)
    return batches


def _collate(
    batch: list[UpdateSample], pad_id: int, device: torch.device, share_prefix: bool = False,
    old_logprobs: dict[int, torch.Tensor] | None = None, two_calls: bool = False,
) -> dict[str, torch.Tensor]:
    length = max(len(s.input_ids) for s in batch)
    ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), length), dtype=torch.long)
    mask = torch.zeros((len(batch), length), dtype=torch.float32)
    rollout = torch.zeros((len(batch), length), dtype=torch.float32)
    advantages = torch.zeros((len(batch), length), dtype=torch.float32)
    for row, s in enumerate(batch):
        n = len(s.input_ids)
        ids[row, :n] = torch.tensor(s.input_ids)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        rollout[row, :n] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        adv = s.advantage if isinstance(s.advantage, list) else [float(s.advantage)] * n
        advantages[row, :n] = torch.tensor(adv, dtype=torch.float32)
    value_mask = torch.zeros((len(batch), length), dtype=torch.float32)
    returns = torch.zeros((len(batch), length), dtype=torch.float32)
    old_values = torch.zeros((len(batch), length), dtype=torch.float32)
    for row, s in enumerate(batch):
        for i, pos in enumerate(s.value_positions):
            value_mask[row, pos] = 1.0
            if i < len(s.returns):  # targets exist once advantages are computed
                returns[row, pos], old_values[row, pos] = s.returns[i], s.old_values[i]
    # Position t's logits predict token t+1: shift everything that belongs to targets.
    prefix = shared_prefix(batch) if share_prefix else 0
    extra: dict[str, torch.Tensor] = {}
    if old_logprobs is not None:  # already aligned with the targets (see old_token_logprobs)
        old = torch.zeros((len(batch), length - 1), dtype=torch.float32)
        for row, s in enumerate(batch):
            old[row, : len(s.input_ids) - 1] = old_logprobs[id(s)]
        extra["old_logprobs"] = old.to(device)
    prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
    return {
        **extra,
        "prefix_len": torch.tensor(prefix),
        "split": torch.tensor(two_calls and prefix == 0),
        "value_mask": value_mask.to(device),
        "returns": returns.to(device),
        "old_values": old_values.to(device),
        "input_ids": ids.to(device),
        "attention_mask": attention.to(device),
        "targets": ids[:, 1:].to(device),
        "mask": mask[:, 1:].to(device),
        "rollout_logprobs": rollout[:, 1:].to(device),
        "advantages": advantages[:, 1:].to(device),
    }


def mini_batch_order(n_samples: int, ppo_epochs: int = 1, mini_batches: int = 1, seed: int = 0) -> list[list[int]]:
    """Returns the sample indices of every optimizer step of one update, in order: for each of
    ``ppo_epochs`` passes, a seeded shuffle of all samples split into ``mini_batches`` parts
    whose sizes differ by at most one (fewer parts when there are fewer samples). One part
    per pass keeps the samples' order: a whole-batch step does not depend on it."""
    parts = max(1, min(mini_batches, n_samples))
    rng = random.Random(seed)
    steps: list[list[int]] = []
    for _ in range(ppo_epochs):
        order = list(range(n_samples))
        if parts > 1:
            rng.shuffle(order)
        size, extra = divmod(n_samples, parts)
        start = 0
        for part in range(parts):
            stop = start + size + (1 if part < extra else 0)
            steps.append(order[start:stop])
            start = stop
    return steps


def update_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[UpdateSample],
    pad_id: int,
    *,
    objective: str = "pg",
    temperature: float = 1.0,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: str = "token_mean",
    importance_cap: float = 2.0,
    entropy_coef: float = 0.0,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    ref_model: torch.nn.Module | None = None,
    max_grad_norm: float = 1.0,
    micro_batch_tokens: int = 4096,
    scheduler: Any = None,
    value_head: torch.nn.Module | None = None,
    vf_coef: float = 0.1,
    vf_clip: float | None = 0.2,
    autocast_dtype: torch.dtype | None = None,
    share_prefix: bool = True,
    ppo_epochs: int = 1,
    mini_batches: int = 1,
    seed: int = 0,
    data_parallel: Any = None,
) -> dict[str, float]:
    """Runs the update of one rollout batch and returns its diagnostics: token-weighted means
    over every micro-batch of every optimizer step (``*_max`` / ``*_min``: the extremes), and
    for the loss terms (``pg_loss``, ``kl_ref``, ``vf_loss``) the mean over optimizer steps of
    each step's value.

    ``objective="pg"``: the clipped surrogate of ``losses.policy_loss``. The update makes
    ``ppo_epochs`` passes over ``samples``, each a seeded (``seed``) shuffle split into
    ``mini_batches`` mini-batches, one optimizer step per mini-batch (``mini_batch_order``;
    verl's ``ppo_epochs`` and PPO mini-batches, TRL's ``num_iterations``). The old
    log-probabilities of the ratio are computed once, before the first step, under the
    weights that sampled the batch (no gradient); the later steps' ratios depart from 1 and
    the clip acts. The truncated importance weight compares those old log-probabilities with
    the sampler's (``rollout_logprobs``), so it stays fixed across the passes. With one pass
    of one mini-batch (the default) the update is on-policy: the old log-probabilities are
    the current ones, detached, and no extra forward pass runs. A PPO ``value_head`` trains
    in the same passes, its clipped value loss against the samples' ``old_values``.
    ``objective="nll"``: masked negative log-likelihood (SFT).
    ``scheduler`` steps once per call, after the last optimizer step, as verl's actor does:
    a schedule counts rollout batches whatever ``ppo_epochs`` and ``mini_batches`` are.
    ``autocast_dtype``: forward and backward under ``torch.autocast`` in that dtype while the
    weights, gradients and optimizer state stay in theirs (mixed precision); ``None`` is
    bfloat16 on CUDA and off elsewhere, ``torch.float32`` is off.
    ``share_prefix``: micro-batches group samples with a common untrained prefix (a GRPO
    group's prompt, a harness's system prompt) and run it once (``decoder_hidden``); the
    step's loss and gradients are unchanged.
    ``data_parallel`` (``rl.distributed.DataParallel``; every rank holds all ``samples``): this
    rank runs only its share of each mini-batch's micro-batches (``DataParallel.local``), the
    gradients are summed over the ranks before clipping (FSDP2's reduce-scatter for a sharded
    model, one all-reduce for replicated parameters) and the diagnostics are reduced over them,
    so every rank takes the optimizer step one process would take (up to the order of the sums).
    """
    if ppo_epochs < 1 or mini_batches < 1:
        raise ValueError(f"ppo_epochs and mini_batches must be at least 1, got {ppo_epochs} and {mini_batches}")
    if not samples:
        return {"skipped": 1.0}
    device = next(model.parameters()).device
    model.train()
    old_of: dict[int, torch.Tensor] | None = None
    if objective == "pg" and (ppo_epochs > 1 or mini_batches > 1):
        old_of = old_token_logprobs(model, samples, pad_id, temperature, micro_batch_tokens, autocast_dtype, share_prefix)
    params = [p for p in model.parameters() if p.requires_grad]
    if value_head is not None:
        params += list(value_head.parameters())
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    extremes: dict[str, float] = {}
    grad_norms: list[float] = []
    loss_terms: dict[str, list[float]] = {}
    counts = {"micro_batches": 0, "prefix_tokens_saved": 0}
    for indices in mini_batch_order(len(samples), ppo_epochs, mini_batches, seed):
        mini_batch = [samples[i] for i in indices]
        optimizer.zero_grad(set_to_none=True)
        total_tokens = float(sum(sum(s.loss_mask[1:]) for s in mini_batch))
        total_seqs = float(sum(1 for s in mini_batch if sum(s.loss_mask[1:]) > 0))
        total_values = float(sum(len(s.value_positions) for s in mini_batch))
        batches = micro_batches(mini_batch, micro_batch_tokens, share_prefix)
        counts["micro_batches"] += len(batches)
        step_terms: dict[str, float] = {}  # the loss terms of this optimizer step
        local = data_parallel.local(batches, share_prefix) if data_parallel is not None else None
        for batch, weight, two_calls in (
            ((b.samples, b.weight, b.two_calls) for b in local) if local is not None
            else ((b, 1.0, False) for b in batches)
        ):
            # weight 0 and two_calls keep a sharded model's collectives in step (rl.distributed)
            data = _collate(batch, pad_id, device, share_prefix, old_of, two_calls)
            n_tokens = float(data["mask"].sum())
            if n_tokens == 0:
                continue
            if weight:
                counts["prefix_tokens_saved"] += int(data["prefix_len"]) * (len(batch) - 1)
            with autocast_context(device, autocast_dtype):
                hidden, logprobs, entropy = as_forward(
                    model, masked_token_logprobs, model, data, temperature if objective == "pg" else 1.0,
                    entropy_coef > 0,
                )
            if objective == "nll":
                loss = -(logprobs * data["mask"]).sum() / max(total_tokens, 1.0)
                with torch.no_grad():
                    metrics = {
                        "nll": float(-(logprobs * data["mask"]).sum() / n_tokens),
                        "entropy": float((entropy * data["mask"]).sum() / n_tokens),
                    }
            else:
                ref_logprobs = None
                if kl_coef > 0:
                    if ref_model is None:
                        raise ValueError("kl_coef > 0 needs a reference model")
                    with torch.no_grad():
                        _, ref_logprobs, _ = masked_token_logprobs(ref_model, data, temperature)
                # Aggregate over the whole mini-batch, not the micro-batch: token_mean becomes a
                # sum over tokens / all policy tokens of the mini-batch; seq_mean weights by sequences.
                if aggregation == "token_mean":
                    agg, norm, scale = "token_sum_norm", total_tokens, 1.0
                elif aggregation == "seq_mean":
                    agg, norm, scale = "seq_mean", None, len(batch) / max(total_seqs, 1.0)
                else:
                    agg, norm, scale = "token_sum_norm", float(micro_batch_tokens), 1.0 / len(batches)
                old_logprobs = data["old_logprobs"] if old_of is not None else logprobs.detach()
                out = policy_loss(
                    logprobs, old_logprobs, data["advantages"], data["mask"], clip_low, clip_high, agg, norm,
                    rollout_logprobs=data["rollout_logprobs"], importance_cap=importance_cap,
                    ref_logprobs=ref_logprobs, kl_coef=kl_coef, kl_estimator=kl_estimator,
                    entropy=entropy, entropy_coef=entropy_coef,
                )
                loss = out.loss * scale
                metrics = dict(out.metrics)
                for key in ("pg_loss", "kl_ref"):  # this micro-batch's share of the mini-batch's loss
                    if key in metrics:
                        step_terms[key] = step_terms.get(key, 0.0) + metrics.pop(key) * scale * weight
                if value_head is not None and float(data["value_mask"].sum()) > 0:
                    values = value_head(hidden.float()).squeeze(-1)
                    # The mean over the mini-batch's value positions, whatever the padding.
                    vf = value_loss(values, data["old_values"], data["returns"], data["value_mask"], vf_clip, "token_mean")
                    value_share = float(data["value_mask"].sum()) / max(total_values, 1.0)
                    loss = loss + vf_coef * vf.loss * value_share
                    metrics.update(vf.metrics)
                    step_terms["vf_loss"] = step_terms.get("vf_loss", 0.0) + metrics.pop("vf_loss") * value_share * weight
                with torch.no_grad():
                    # The sampler's mismatch with the trainer under the weights that sampled.
                    mismatch = (data["rollout_logprobs"] - old_logprobs).abs() * data["mask"]
                    metrics["rollout_logprob_diff"] = float(mismatch.sum() / n_tokens)
            if not weight:
                (loss * 0.0).backward()
                continue
            loss.backward()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * n_tokens
                weights[key] = weights.get(key, 0.0) + n_tokens
                if key.endswith("_max"):
                    extremes[key] = max(extremes.get(key, value), value)
                elif key.endswith("_min"):
                    extremes[key] = min(extremes.get(key, value), value)
        if data_parallel is not None:
            data_parallel.reduce_gradients(params)
            step_terms = data_parallel.reduce_sums(step_terms)
        for key, value in step_terms.items():
            loss_terms.setdefault(key, []).append(value)
        grad_norms.append(clip_gradients(params, max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    if data_parallel is not None:
        sums, weights = data_parallel.reduce_sums(sums), data_parallel.reduce_sums(weights)
        extremes = data_parallel.reduce_extremes(extremes)
        # Every rank counts all micro-batches; each saved prefix tokens only in its own.
        counts["prefix_tokens_saved"] = int(data_parallel.reduce_sums({"saved": counts["prefix_tokens_saved"]})["saved"])
    result = {k: sums[k] / weights[k] for k in sums}
    result.update(extremes)
    result.update({key: sum(values) / len(values) for key, values in loss_terms.items()})
    result.update({
        "grad_norm": sum(grad_norms) / len(grad_norms), "optimizer_steps": float(len(grad_norms)),
        "micro_batches": float(counts["micro_batches"]),
        "trained_tokens": float(sum(sum(s.loss_mask[1:]) for s in samples)),
        "prefix_tokens_saved": float(counts["prefix_tokens_saved"]),
    })
    return result


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


@torch.no_grad()
def old_token_logprobs(
    model: torch.nn.Module, samples: list[UpdateSample], pad_id: int, temperature: float,
    micro_batch_tokens: int = 4096, autocast_dtype: torch.dtype | None = None, share_prefix: bool = True,
) -> dict[int, torch.Tensor]:
    """Returns, per sample (keyed by ``id``), the log-probabilities [len - 1] that the current
    weights give its tokens 1.. (0 where nothing is trained): the old policy of a multi-step
    update, under the same temperature and mixed precision as ``update_step``."""
    device = next(model.parameters()).device
    out: dict[int, torch.Tensor] = {}
    for batch in micro_batches(samples, micro_batch_tokens, share_prefix):
        data = _collate(batch, pad_id, device, share_prefix)
        if float(data["mask"].sum()) == 0:
            logprobs = torch.zeros(data["mask"].shape)
        else:
            with autocast_context(device, autocast_dtype):
                _, logprobs, _ = as_forward(model, masked_token_logprobs, model, data, temperature)
        for row, sample in enumerate(batch):
            out[id(sample)] = logprobs[row, : len(sample.input_ids) - 1].float().cpu()
    return out


def as_forward(model: torch.nn.Module, function: Any, *args: Any) -> Any:
    """Returns ``function(*args)`` run as a forward of ``model``: for a model sharded by
    ``rl.distributed.DataParallel.shard_model`` between its root group's FSDP2 hooks (they
    gather the embeddings, the final norm and the LM head that the decoder and the head
    calls below read), for any other model a plain call."""
    run = getattr(model, "run_as_forward", None)
    return run(function, *args) if run is not None else function(*args)


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> Any:
    """Returns the mixed-precision context of ``update_step`` (see its ``autocast_dtype``)."""
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def masked_token_logprobs(
    model: torch.nn.Module, data: dict[str, torch.Tensor], temperature: float, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (last hidden states [B, L, H], log-probs [B, L-1], entropy [B, L-1]) where only
    trained positions (``data["mask"]``) are projected through the LM head.

    Most of a sequence is prompt; projecting every position to the vocabulary (49k for the
    embedded model) and taking its log-softmax would dominate the step. Untrained positions
    get 0. Entropy keeps its graph only when an entropy bonus needs it.
    """
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    hidden = decoder_hidden(decoder, data)
    rows, cols = torch.nonzero(data["mask"] > 0, as_tuple=True)
    logits = head(hidden[:, :-1][rows, cols]).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, data["targets"][rows, cols].unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        picked_entropy = -(logp_all.exp() * logp_all).sum(-1)
    logprobs = torch.zeros(data["mask"].shape, dtype=picked.dtype, device=picked.device)
    entropy = torch.zeros_like(logprobs)
    logprobs = logprobs.index_put((rows, cols), picked)
    entropy = entropy.index_put((rows, cols), picked_entropy)
    return hidden, logprobs, entropy


def decoder_hidden(decoder: torch.nn.Module, data: dict[str, torch.Tensor]) -> torch.Tensor:
    """Returns the decoder's last hidden states [B, L, H] for ``data``.

    With ``data["prefix_len"] = P > 0`` (every row starts with the same P tokens, see
    ``shared_prefix``), the prefix runs once as a batch of one and its keys and values are
    broadcast to every row for the rest; gradients from all rows flow back into the single
    prefix pass, so the result and its gradients are those of the plain batched pass (up to
    float rounding) at ``P x (B - 1)`` fewer tokens of compute.

    With ``data["split"]`` (and no shared prefix) the decoder runs in the same two calls, the
    first over every row's first token, the rest against its keys and values: the result of
    one pass, called the way a shared-prefix micro-batch calls it (the ranks of a sharded
    model must call each layer equally often: ``rl.distributed.DataParallel.local``).
    """
    ids, attention = data["input_ids"], data["attention_mask"]
    prefix = int(data.get("prefix_len", 0))
    split = bool(data.get("split", False))
    if prefix <= 0 and not split:
        return decoder(input_ids=ids, attention_mask=attention).last_hidden_state
    rows, length = ids.shape
    cache_argument = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    if prefix <= 0:
        prefix = 1
        head = decoder(input_ids=ids[:, :1], attention_mask=attention[:, :1], use_cache=True)
    else:
        head = decoder(input_ids=ids[:1, :prefix], use_cache=True)
    cache = head.cache if cache_argument == "cache" else head.past_key_values
    from transformers.cache_utils import DynamicLayer

    if not all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
        # Sliding-window or other special layers keep less than every token: no broadcast.
        return decoder(input_ids=ids, attention_mask=attention).last_hidden_state
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    positions = torch.arange(prefix, length, device=ids.device).unsqueeze(0).expand(rows, -1)
    tail = decoder(
        input_ids=ids[:, prefix:], attention_mask=attention, position_ids=positions, use_cache=True,
        **{cache_argument: cache},
    )
    return torch.cat([head.last_hidden_state.expand(rows, -1, -1), tail.last_hidden_state], dim=1)


@torch.no_grad()
def compute_values(
    model: torch.nn.Module, value_head: torch.nn.Module, samples: list[UpdateSample], pad_id: int,
    micro_batch_tokens: int = 4096,
    autocast_dtype: torch.dtype | None = None,
    share_prefix: bool = True,
) -> list[list[float]]:
    """Returns, per sample, the critic's values at its ``value_positions`` (no gradient),
    under the same mixed precision as ``update_step``."""
    device = next(model.parameters()).device
    model.eval()
    out: dict[int, list[float]] = {}
    for batch in micro_batches(samples, micro_batch_tokens, share_prefix):
        data = _collate(batch, pad_id, device, share_prefix)
        with autocast_context(device, autocast_dtype):
            hidden = as_forward(model, decoder_hidden, model.get_decoder(), data)
        values = value_head(hidden.float()).squeeze(-1)
        for row, sample in enumerate(batch):
            out[id(sample)] = [float(values[row, p]) for p in sample.value_positions]
    return [out[id(s)] for s in samples]
