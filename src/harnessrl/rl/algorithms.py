"""The RL algorithms as a registry: each entry turns a step's rollouts into update samples
(`UpdateSample`); the loss they train with is `update_step`'s objective and policy loss
(`rl/objectives.py`, `rl/losses.py`). Entries: ``grpo`` (group-relative advantages, the
estimator chosen by ``advantage``: ``ADVANTAGES``), ``ppo`` (per-turn GAE from the actor's value
head) and ``sft`` (behaviour cloning on the step's successful runs, ``objective: sft``).

Adding an algorithm: register a function ``(trajectories, rewards, groups, cfg, actor) ->
samples`` with `register_algorithm`, add its name to `TrainConfig.algorithm`, and give it a
reference test (see `docs/architecture.md`, "Add an RL algorithm").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from harnessrl.rl.advantages import grpo_advantages, rloo_advantages
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.config import TrainConfig
from harnessrl.rl.sft import sft_samples
from harnessrl.trajectory import Trajectory

if TYPE_CHECKING:
    from harnessrl.rl.actor import Actor

SampleBuilder = Callable[[list[Trajectory], list[float], list[int], TrainConfig, "Actor"], list[UpdateSample]]
ALGORITHMS: dict[str, SampleBuilder] = {}

Advantage = Callable[[Sequence[float], Sequence[Hashable], TrainConfig], list[float]]
ADVANTAGES: dict[str, Advantage] = {
    # (r - group mean) / group std (Shao et al. 2024), or without the std (Dr. GRPO: scale_std false)
    "grpo": lambda rewards, groups, cfg: grpo_advantages(rewards, groups, scale_std=cfg.scale_std),
    # r - mean of the group's other rollouts (Ahmadian et al. 2024)
    "rloo": lambda rewards, groups, cfg: rloo_advantages(rewards, groups),
}


def register_algorithm(name: str) -> Callable[[SampleBuilder], SampleBuilder]:
    """Registers a sample builder under ``name``."""

    def decorate(function: SampleBuilder) -> SampleBuilder:
        ALGORITHMS[name] = function
        return function

    return decorate


def algorithm_of(cfg: TrainConfig) -> SampleBuilder:
    """Returns the sample builder of a training config (``objective: sft`` overrides the
    algorithm: it clones runs rather than weighting them)."""
    return ALGORITHMS["sft" if cfg.objective == "sft" else cfg.algorithm]


def group_advantages(rewards: Sequence[float], groups: Sequence[Hashable], cfg: TrainConfig) -> list[float]:
    """Returns each rollout's group-relative advantage under ``cfg.advantage``."""
    return ADVANTAGES[cfg.advantage](rewards, groups, cfg)


@register_algorithm("grpo")
def grpo_samples(
    trajectories: list[Trajectory], rewards: list[float], groups: list[int], cfg: TrainConfig, actor: Actor | None = None,
) -> list[UpdateSample]:
    """Update samples with each rollout's group-relative advantage; rollouts of groups without
    signal are left out when ``skip_no_signal_groups``."""
    samples: list[UpdateSample] = []
    for trajectory, advantage in zip(trajectories, group_advantages(rewards, groups, cfg), strict=True):
        if cfg.skip_no_signal_groups and advantage == 0.0:
            continue
        for s in trajectory.training_samples():
            samples.append(UpdateSample(s.input_ids, s.loss_mask, s.old_logprobs, advantage))
    return samples


@register_algorithm("ppo")
def ppo_samples(
    trajectories: list[Trajectory], rewards: list[float], groups: list[int], cfg: TrainConfig, actor: Actor,
) -> list[UpdateSample]:
    """Update samples with per-turn GAE advantages from the actor's value head (``rl.ppo``)."""
    return actor.ppo_samples(trajectories)


@register_algorithm("sft")
def sft_step_samples(
    trajectories: list[Trajectory], rewards: list[float], groups: list[int], cfg: TrainConfig, actor: Actor,
) -> list[UpdateSample]:
    """Behaviour cloning on the step's successful runs."""
    return sft_samples([t for t in trajectories if t.passed])
