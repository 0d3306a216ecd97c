"""A step's group bookkeeping, shared by plain GRPO and rescue: what a group is (`GroupInfo`:
its key, its task as a router may see it, `TaskInfo`, and its harness) and how much signal a
step's groups carry (`signal_metrics`, the Harness-S paper's Fig. 3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


@dataclass(frozen=True)
class TaskInfo:
    """What a router may know of a task before it runs: its id, family and instruction."""

    task_id: str
    family: str = ""
    instruction: str = ""

    @classmethod
    def of(cls, task: Task) -> TaskInfo:
        """Returns what a router may know of ``task`` (never its verifier or gold solution)."""
        return cls(task.id, family=task.family, instruction=task.instruction)


@dataclass(frozen=True)
class GroupInfo:
    """One GRPO group of a step: its key, the task, and the harness its rollouts ran under."""

    group: int
    task: TaskInfo
    harness: str


def signal_metrics(
    trajectories: Sequence[Trajectory], groups: Sequence[int], advantages: Sequence[float]
) -> dict[str, float]:
    """Returns the valid-group ratio (groups with both a success and a failure) and the
    effective-token ratio (policy tokens whose advantage is non-zero), the paper's Fig. 3."""
    outcomes: dict[int, set[bool]] = {}
    for trajectory, group in zip(trajectories, groups, strict=True):
        outcomes.setdefault(group, set()).add(bool(trajectory.passed))
    tokens = [t.n_policy_tokens for t in trajectories]
    effective = sum(n for n, a in zip(tokens, advantages, strict=True) if a != 0.0)
    return {
        "valid_group_ratio": sum(len(o) == 2 for o in outcomes.values()) / len(outcomes) if outcomes else 0.0,
        "effective_token_ratio": effective / sum(tokens) if sum(tokens) else 0.0,
    }
