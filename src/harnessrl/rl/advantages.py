"""Advantage estimators: GRPO group-relative, RLOO leave-one-out, PPO's GAE over turns.

A GRPO group is the G rollouts of one task under one harness configuration.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch


def grpo_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-6, scale_std: bool = True
) -> list[float]:
    """Returns (r - mean_group) / max(std_group, eps) per rollout (Shao et al. 2024;
    Harness-S eq. 6, eps = 1e-6). ``std`` is the population standard deviation of the
    group; with ``scale_std=False`` only the mean is subtracted (Dr. GRPO). A group whose
    rewards are all equal gets exactly zero advantages."""
    if len(rewards) != len(groups):
        raise ValueError("one group key per reward is required")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(groups):
        members[key].append(i)
    out = [0.0] * len(rewards)
    for indices in members.values():
        values = torch.tensor([float(rewards[i]) for i in indices], dtype=torch.float64)
        centred = values - values.mean()
        if scale_std:
            std = values.std(unbiased=False) if len(indices) > 1 else torch.tensor(0.0, dtype=torch.float64)
            centred = centred / max(float(std), eps)
        for i, a in zip(indices, centred.tolist(), strict=True):
            out[i] = 0.0 if abs(a) < 1e-12 else float(a)
    return out


def rloo_advantages(rewards: Sequence[float], groups: Sequence[Hashable]) -> list[float]:
    """Returns r_i - mean of the other rollouts of its group (Ahmadian et al. 2024), i.e.
    G / (G - 1) x (r_i - group mean); a group of one, and a group whose rewards are all equal,
    gets exactly zero (float rounding would leave ~1e-16, which the loop's no-signal filter
    would not see)."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(groups):
        members[key].append(i)
    out = [0.0] * len(rewards)
    for indices in members.values():
        n = len(indices)
        if n < 2:
            continue
        total = sum(float(rewards[i]) for i in indices)
        for i in indices:
            advantage = float(rewards[i]) - (total - float(rewards[i])) / (n - 1)
            out[i] = 0.0 if abs(advantage) < 1e-12 else advantage
    return out


def gae(
    rewards: Sequence[float], values: Sequence[float], gamma: float = 1.0, lam: float = 0.95, last_value: float = 0.0
) -> tuple[list[float], list[float]]:
    """Returns (advantages, returns) by generalized advantage estimation over an episode's
    turns (Schulman et al. 2016): delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = delta_t + gamma lam A_{t+1}; returns = A + V. The terminal reward sits on the last turn."""
    if len(rewards) != len(values):
        raise ValueError("one value per turn is required")
    advantages = [0.0] * len(rewards)
    next_value, running = last_value, 0.0
    for t in reversed(range(len(rewards))):
        delta = float(rewards[t]) + gamma * next_value - float(values[t])
        running = delta + gamma * lam * running
        advantages[t] = running
        next_value = float(values[t])
    returns = [a + float(v) for a, v in zip(advantages, values, strict=True)]
    return advantages, returns


def no_signal_fraction(rewards: Sequence[float], groups: Sequence[Hashable]) -> float:
    """Returns the fraction of groups whose rollouts all got the same reward (all pass or all
    fail): they carry no GRPO signal."""
    members: dict[Hashable, set[float]] = defaultdict(set)
    for r, key in zip(rewards, groups, strict=True):
        members[key].add(float(r))
    if not members:
        return 0.0
    return sum(len(v) == 1 for v in members.values()) / len(members)
