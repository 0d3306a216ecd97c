"""PPO's update samples: per-turn GAE advantages from the value head, broadcast over each turn's
sampled tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from harnessrl.rl.advantages import gae
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.forward import compute_values
from harnessrl.trajectory import Trajectory


def ppo_samples(
    trajectories: Sequence[Trajectory], model: torch.nn.Module, value_head: torch.nn.Module, pad_id: int, *,
    micro_batch_tokens: int, gamma: float, gae_lambda: float, autocast_dtype: torch.dtype | None = None,
) -> list[UpdateSample]:
    """Returns update samples with per-turn GAE advantages from ``value_head`` on ``model``.

    The critic values the state before each turn (the hidden state of the token before
    the turn's first sampled token); the reward arrives on the last turn; advantages are
    normalised over the batch and broadcast over each turn's sampled tokens.
    """
    per_trajectory: list[list[UpdateSample]] = []
    for trajectory in trajectories:
        samples = []
        for s in trajectory.training_samples():
            samples.append(UpdateSample(
                s.input_ids, s.loss_mask, s.old_logprobs, 0.0,
                meta={"turns": [index for index, _ in s.turn_starts], "starts": [p for _, p in s.turn_starts]},
                value_positions=[p - 1 for _, p in s.turn_starts],
            ))
        per_trajectory.append(samples)
    flat = [s for samples in per_trajectory for s in samples]
    if not flat:
        return []
    values = compute_values(model, value_head, flat, pad_id, micro_batch_tokens, autocast_dtype=autocast_dtype)
    value_of = {id(s): v for s, v in zip(flat, values, strict=True)}
    turn_advantages: list[dict[int, tuple[float, float, float]]] = []
    all_advantages: list[float] = []
    for trajectory, samples in zip(trajectories, per_trajectory, strict=True):
        by_turn = {t: v for s in samples for t, v in zip(s.meta["turns"], value_of[id(s)], strict=True)}
        order = sorted(by_turn)
        turn_rewards = [0.0] * len(order)
        if order:
            turn_rewards[-1] = float(trajectory.reward)
        adv, ret = gae(turn_rewards, [by_turn[t] for t in order], gamma, gae_lambda)
        turn_advantages.append({t: (a, r, by_turn[t]) for t, a, r in zip(order, adv, ret, strict=True)})
        all_advantages += adv
    mean = float(np.mean(all_advantages)) if all_advantages else 0.0
    std = float(np.std(all_advantages)) if len(all_advantages) > 1 else 1.0
    for trajectory, samples, table in zip(trajectories, per_trajectory, turn_advantages, strict=True):
        for s in samples:
            token_adv = [0.0] * len(s.input_ids)
            for turn, start in zip(s.meta["turns"], s.meta["starts"], strict=True):
                a = (table[turn][0] - mean) / max(std, 1e-6)
                for i in range(start, start + len(trajectory.turns[turn].completion_ids)):
                    token_adv[i] = a
            s.advantage = token_adv
            s.returns = [table[t][1] for t in s.meta["turns"]]
            s.old_values = [table[t][2] for t in s.meta["turns"]]
    return flat
