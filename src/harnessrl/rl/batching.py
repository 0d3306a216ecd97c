"""Samples and how an update packs them: `UpdateSample` (one sequence to train on), micro-batches
by a padded-token budget (with the shared-prefix packing that runs a GRPO group's prompt once),
their collated tensors, and the order of an update's mini-batches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch


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


def collate(
    batch: list[UpdateSample], pad_id: int, device: torch.device, share_prefix: bool = False,
    old_logprobs: dict[int, torch.Tensor] | None = None, two_calls: bool = False, causal_only: bool = False,
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
        "causal_only": torch.tensor(causal_only),
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
