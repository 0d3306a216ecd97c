"""Run a policy through a set of harnesses on test tasks and score Pass@1 / pass@k / Avg@k,
per harness, per group (train / in-space / out-of-space / external), with behaviour metrics
and the per-factor analysis."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harnessrl.design import Design
from harnessrl.eval.analysis import factor_analysis
from harnessrl.eval.behaviour import behaviour_metrics
from harnessrl.eval.metrics import score_runs
from harnessrl.eval.sets import EXTERNAL_PREFIX, EvalTarget
from harnessrl.harness.harness import Harness
from harnessrl.harness.limits import is_bytewise
from harnessrl.policy.base import Policy
from harnessrl.rollout.engine import RolloutJob, RolloutStats
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


@dataclass
class EvalResult:
    """Scores overall, per group and per harness, behaviour metrics, the per-factor analysis,
    the trajectories behind them, and timing."""

    k: int
    overall: dict[str, Any]
    per_config: dict[str, dict[str, Any]]
    trajectories: list[Trajectory] = field(default_factory=list)
    stats: RolloutStats | None = None
    per_group: dict[str, dict[str, Any]] = field(default_factory=dict)
    behaviour: dict[str, Any] = field(default_factory=dict)
    analysis: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, with_trajectories: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "k": self.k,
            **self.overall,
            "per_group": self.per_group,
            "per_config": self.per_config,
            "behaviour": self.behaviour,
            "analysis": self.analysis,
            "timing": self.stats.to_dict() if self.stats else {},
        }
        if with_trajectories:
            out["trajectories"] = [t.to_dict() for t in self.trajectories]
        return out


def _scores(trajectories: Sequence[Trajectory], k: int) -> dict[str, Any]:
    """Returns the headline numbers of a set of episodes; a unit is one (task, harness)."""
    by_task: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for t in trajectories:
        by_task[(t.task_id, t.config)].append(bool(t.passed))
    turns = max(1, sum(t.metrics.get("turns", 0) for t in trajectories))
    return {
        "episodes": len(trajectories),
        **score_runs(list(by_task.values()), k),
        # per turn: outputs the tool interface could not act on (format_errors, unknown tools and bad
        # arguments included) and tool errors (those two plus calls the tool refused)
        "format_error_rate": sum(t.metrics.get("format_errors", 0) for t in trajectories) / turns,
        "tool_error_rate": sum(t.metrics.get("tool_errors", 0) for t in trajectories) / turns,
        "statuses": dict(Counter(t.status for t in trajectories)),
    }


def score_trajectories(
    trajectories: Sequence[Trajectory], k: int, groups: dict[str, str] | None = None, design: Design | None = None
) -> EvalResult:
    """Returns the scores of finished episodes (also used to rebuild reports from JSONL).

    ``groups`` maps a harness name to its group (``EvalTarget.group``); a harness without
    one is grouped as out-of-space when its trajectory says so, else as in-space. With a
    ``design`` the per-factor analysis measures distance to its configurations.
    """
    groups = dict(groups or {})
    by_config: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_config[t.config].append(t)
        groups.setdefault(t.config, "out_of_space" if t.out_of_space else "in_space")
    by_group: dict[str, list[Trajectory]] = defaultdict(list)
    for code, items in by_config.items():
        by_group[groups[code]].extend(items)
    analysis: dict[str, Any] = {}
    if design is not None:
        analysis = factor_analysis(trajectories, design.space, design.configs)
    return EvalResult(
        k=k,
        overall=_scores(trajectories, k),
        per_config={code: {**_scores(items, k), "group": groups[code]} for code, items in by_config.items()},
        trajectories=list(trajectories),
        per_group={name: _scores(items, k) for name, items in by_group.items()},
        behaviour={
            "overall": behaviour_metrics(trajectories),
            "per_group": {name: behaviour_metrics(items) for name, items in by_group.items()},
        },
        analysis=analysis,
    )


def evaluate(
    policy: Policy,
    harness_names: Sequence[str | EvalTarget],
    tasks: Sequence[Task],
    k: int = 1,
    settings: RolloutSettings | None = None,
    design: Design | None = None,
    external: Any | None = None,
    agent_time_limit_s: float | None = None,
    on_external: Callable[[Trajectory], None] | None = None,
    external_tasks: Sequence[Task] | None = None,
) -> EvalResult:
    """Runs every task k times under every harness and returns the scores.

    Harnesses are names or ``EvalTarget``s (from ``resolve_eval_set``), which carry the group
    each is reported under. ``settings`` say how the episodes run (limits, sampling, sandbox,
    concurrency, lockstep; default ``RolloutSettings()``: greedy under the default limits); run
    r of a task uses seed ``settings.seed + r``, so repeated evaluations are reproducible.
    ``ext:<name>`` targets are external agent programs run against the policy
    (``harnessrl.external``), with ``external`` as their run config (default: the settings'
    sandbox backend, turn limit, output limit and temperature, and ``agent_time_limit_s``
    seconds per run, else ``ExternalConfig.time_limit_s``); ``on_external`` hears of each of
    their runs as it ends. ``external_tasks`` are the tasks they run (default ``tasks``): an
    agent run costs tens of seconds on a CPU, so a suite may give them a small fixed subset.
    """
    settings = settings or RolloutSettings()
    targets = [t if isinstance(t, EvalTarget) else EvalTarget(t, "") for t in harness_names]
    external_names = [t.name for t in targets if t.name.startswith(EXTERNAL_PREFIX)]
    harnesses = [Harness.named(t.name, settings.limits) for t in targets if t.name not in external_names]
    jobs = [
        RolloutJob(task, harness, seed=settings.seed + run, tags={"run": run})
        for harness in harnesses for task in tasks for run in range(k)
    ]
    trajectories, stats = settings.engine(policy).run(jobs) if jobs else ([], None)
    if external_names:
        # External agent programs run against the served policy (harnessrl.external).
        from harnessrl.external.run import ExternalConfig, evaluate_external_targets

        # The evaluation's own limits hold for the agents too: its output limit per request
        # (sized for model tokens: scripted policies, which write whole commands byte by byte,
        # keep the server's default), its turn limit as the agent's step limit, and its
        # temperature for every request the agent makes.
        given = {"max_steps": settings.limits.max_turns, "time_limit_s": agent_time_limit_s}
        max_tokens = None if is_bytewise(policy) else settings.sampling().max_new_tokens
        config = external or ExternalConfig(backend=settings.backend, max_tokens=max_tokens,
                                            **{name: value for name, value in given.items() if value})
        if config.temperature is None:
            config = replace(config, temperature=settings.temperature)
        trajectories += evaluate_external_targets(external_names, policy, tasks if external_tasks is None else external_tasks,
                                                  k=k, config=config, on_trajectory=on_external)
    result = score_trajectories(trajectories, k, target_groups(targets), design)
    result.stats = stats
    return result


def target_groups(targets: Sequence[EvalTarget]) -> dict[str, str]:
    """Returns the group each target is reported under (its own; an agent program without one:
    ``external``; others: left to ``score_trajectories``)."""
    groups = {t.name: t.group or ("external" if t.name.startswith(EXTERNAL_PREFIX) else "") for t in targets}
    return {name: group for name, group in groups.items() if group}
