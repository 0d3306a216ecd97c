"""Run a policy through a set of harnesses on test tasks and score Pass@1 / pass@k / Avg@k."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harnessrl.eval.metrics import avg_at_k, bootstrap_ci, mean_pass_at_k
from harnessrl.harness.external.run import (
    EXTERNAL_PREFIX,
    ExternalConfig,
    evaluate_external_targets,
)
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.policy.base import Policy, SamplingParams
from harnessrl.rollout import RolloutEngine, RolloutJob, RolloutStats
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


@dataclass
class EvalResult:
    """Scores overall and per harness, the trajectories behind them, and timing."""

    k: int
    overall: dict[str, Any]
    per_config: dict[str, dict[str, Any]]
    trajectories: list[Trajectory] = field(default_factory=list)
    stats: RolloutStats | None = None

    def to_dict(self, with_trajectories: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "k": self.k,
            **self.overall,
            "per_config": self.per_config,
            "timing": self.stats.to_dict() if self.stats else {},
        }
        if with_trajectories:
            out["trajectories"] = [t.to_dict() for t in self.trajectories]
        return out


def _scores(trajectories: Sequence[Trajectory], k: int) -> dict[str, Any]:
    # One entry per (task, harness): its k runs.
    by_task: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for t in trajectories:
        by_task[(t.task_id, t.config)].append(bool(t.passed))
    runs = list(by_task.values())
    first = [float(r[0]) for r in runs]
    low, high = bootstrap_ci(first)
    return {
        "episodes": len(trajectories),
        "tasks": len(runs),
        "pass_at_1": mean_pass_at_k(runs, 1),
        "pass_at_1_ci": [low, high],
        "pass_at_k": mean_pass_at_k(runs, k) if all(len(r) >= k for r in runs) else None,
        "avg_at_k": avg_at_k(runs),
        "format_error_rate": (
            sum(t.metrics.get("format_errors", 0) for t in trajectories)
            / max(1, sum(t.metrics.get("turns", 0) for t in trajectories))
        ),
        "statuses": dict(_count(t.status for t in trajectories)),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for item in items:
        out[item] += 1
    return out


def evaluate(
    policy: Policy,
    harness_names: Sequence[str],
    tasks: Sequence[Task],
    k: int = 1,
    limits: HarnessLimits | None = None,
    temperature: float = 0.0,
    max_new_tokens: int = 384,
    seed: int = 0,
    max_concurrent: int = 16,
    env_workers: int = 4,
    backend: str = "auto",
    progress: bool = False,
    external: ExternalConfig | None = None,
) -> EvalResult:
    """Runs every task k times under every harness and returns the scores.

    Run r of a task uses seed ``seed + r``, so repeated evaluations are reproducible.
    ``ext:<name>`` entries of ``harness_names`` are external agents (mini-swe-agent, Claude
    Code, ...) run against the policy served by `harnessrl serve` (see
    `harnessrl.harness.external`), with ``external`` (default: this sandbox ``backend``).
    """
    external_names = [name for name in harness_names if name.startswith(EXTERNAL_PREFIX)]
    harnesses = [Harness.named(name, limits) for name in harness_names if name not in external_names]
    jobs = [
        RolloutJob(task, harness, seed=seed + run, tags={"run": run})
        for harness in harnesses for task in tasks for run in range(k)
    ]
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    engine = RolloutEngine(
        policy, max_concurrent=max_concurrent, env_workers=env_workers, sampling=sampling,
        backend=backend, progress=progress,
    )
    trajectories, stats = engine.run(jobs) if jobs else ([], None)
    if external_names:
        trajectories += evaluate_external_targets(
            external_names, policy, tasks, k=k, config=external or ExternalConfig(backend=backend))
    per_config: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        per_config[t.config].append(t)
    return EvalResult(
        k=k,
        overall=_scores(trajectories, k),
        per_config={code: _scores(items, k) for code, items in per_config.items()},
        trajectories=trajectories,
        stats=stats,
    )
