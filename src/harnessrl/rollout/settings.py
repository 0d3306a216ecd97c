"""`RolloutSettings`: how a set of rollouts runs (limits, sampling, job seeds, sandbox backend,
concurrency, determinism), the one type that evaluation, Harness-S's own runs and the trainer's
rollouts hand to the engine; its concurrency defaults are `EngineOptions`'."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harnessrl.harness.limits import HarnessLimits
from harnessrl.policy.base import Policy, SamplingParams
from harnessrl.rollout.engine import EngineOptions, RolloutEngine


@dataclass(frozen=True)
class RolloutSettings:
    """How rollouts run. ``max_new_tokens`` None is the limits' per-turn limit; ``seed`` is the
    first job seed (run r of a task uses ``seed + r``); ``progress`` shows the episodes'
    progress on stderr; ``deterministic`` runs the engine in lockstep and ``continuous_batching``
    runs one decode batch that requests join step by step (both: ``EngineOptions``)."""

    limits: HarnessLimits = field(default_factory=HarnessLimits)
    temperature: float = 0.0
    seed: int = 0
    backend: str = EngineOptions.backend
    max_concurrent: int = EngineOptions.max_concurrent
    env_workers: int = EngineOptions.env_workers
    progress: bool = False
    max_new_tokens: int | None = None
    top_p: float = 1.0
    deterministic: bool = False
    continuous_batching: bool = EngineOptions.continuous_batching

    def sampling(self) -> SamplingParams:
        """The sampling of every episode (the harness's per-turn limit still caps it)."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              max_new_tokens=self.max_new_tokens or self.limits.max_new_tokens)

    def engine(self, policy: Policy, **kwargs: Any) -> RolloutEngine:
        """Returns a rollout engine over ``policy`` with these settings (``kwargs``: the engine's
        other options, e.g. ``on_trajectory``)."""
        return RolloutEngine(policy, max_concurrent=self.max_concurrent, env_workers=self.env_workers,
                             sampling=self.sampling(), backend=self.backend, progress=self.progress,
                             deterministic=self.deterministic, continuous_batching=self.continuous_batching,
                             **kwargs)
