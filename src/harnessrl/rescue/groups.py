"""Rescue groups (Harness-S eq. 5): a GRPO group in which every rollout failed is replaced.

A step rolls out G episodes per (task, harness H0) pair. A group with any success is kept.
A group that failed entirely (a *dead* group: zero advantages, no learning signal) is replaced
by a rescue group, by mode:

- ``siblings`` (Harness-S): the router picks K siblings of H0; the same policy rolls out once
  under each from the task's initial state; the K trajectories are the new group, with
  advantages relative to each other (eq. 6), each trained in its own generating context.
- ``h0`` (GRPO with H0 rescue, a DAPO-style resample): K more rollouts under H0.
- ``none``: plain GRPO, dead groups stay dead.

A rescue group that fails entirely too contributes nothing and is counted as such. The fixed
mixture baseline (every group mixes H0 and siblings in fixed proportions, dead or not) is
planned before the first pass: ``mixture_harnesses``.

Everything here is a pure function of its inputs (the rollouts themselves are passed in as a
callable), so the trainer, the experiment runner and the tests share one implementation.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harnessrl.rescue.router import Router
from harnessrl.rollout.groups import GroupInfo, TaskInfo, signal_metrics
from harnessrl.trajectory import Trajectory

RESCUE_MODES: tuple[str, ...] = ("none", "h0", "siblings", "mixture")
# The group bookkeeping lives below rescue (plain GRPO uses it too): rollout/groups.py.
__all__ = ["RESCUE_MODES", "GroupInfo", "RescueRun", "RescueStats", "TaskInfo", "apply_rescue", "dead_groups",
           "mixture_harnesses", "plan_rescue", "signal_metrics"]


@dataclass(frozen=True)
class RescueRun:
    """One rescue rollout to run: the group it belongs to, the harness, and a seed index."""

    group: int
    harness: str
    member: int


@dataclass
class RescueStats:
    """What rescue did in one step (all counts; ratios are derived in ``metrics``)."""

    groups: int = 0
    dead: int = 0
    rescued: int = 0  # rescue groups with at least one success
    rescue_dead: int = 0  # rescue groups that failed entirely too
    base_rollouts: int = 0  # the first pass: G per group
    rescue_rollouts: int = 0
    selections: Counter[str] = field(default_factory=Counter)

    def metrics(self) -> dict[str, Any]:
        """Returns the per-step rescue metrics (paper Fig. 3): trigger rate = dead / groups,
        success rate = rescued / dead, executor rollouts relative to plain GRPO."""
        return {
            "rescue_trigger_rate": self.dead / self.groups if self.groups else 0.0,
            "rescue_success_rate": self.rescued / self.dead if self.dead else 0.0,
            "rescue_dead_groups": self.rescue_dead,
            "base_rollouts": self.base_rollouts,
            "rescue_rollouts": self.rescue_rollouts,
            "executor_rollouts_vs_grpo": (
                (self.base_rollouts + self.rescue_rollouts) / self.base_rollouts if self.base_rollouts else 0.0
            ),
            "sibling_selections": dict(sorted(self.selections.items())),
        }


def dead_groups(trajectories: Sequence[Trajectory], groups: Sequence[int]) -> list[int]:
    """Returns the keys of groups none of whose rollouts passed, in first-seen order."""
    if len(trajectories) != len(groups):
        raise ValueError(f"{len(trajectories)} trajectories but {len(groups)} group keys")
    passed: dict[int, bool] = {}
    for trajectory, group in zip(trajectories, groups, strict=True):
        passed[group] = passed.get(group, False) or bool(trajectory.passed)
    return [group for group, any_passed in passed.items() if not any_passed]


def plan_rescue(
    mode: str,
    dead: Sequence[GroupInfo],
    k: int,
    router: Router | None,
    siblings_of: Callable[[str], Sequence[str]],
    seed: int,
) -> list[RescueRun]:
    """Returns the rescue rollouts for the dead groups: K siblings each chosen by ``router``
    (mode ``siblings``) or K more under H0 (mode ``h0``); none for ``none`` and ``mixture``."""
    if mode not in RESCUE_MODES:
        raise ValueError(f"unknown rescue mode {mode!r}; use one of {', '.join(RESCUE_MODES)}")
    if k < 1:
        raise ValueError(f"rescue k must be >= 1, got {k}")
    runs: list[RescueRun] = []
    for info in dead:
        if mode == "h0":
            runs += [RescueRun(info.group, info.harness, member) for member in range(k)]
        elif mode == "siblings":
            if router is None:
                raise ValueError("rescue mode 'siblings' needs a router")
            candidates = [name for name in siblings_of(info.harness) if name != info.harness]
            if not candidates:
                continue
            chosen = router.route(info.task, info.harness, candidates, k, seed=seed + info.group)
            runs += [RescueRun(info.group, name, member) for member, name in enumerate(chosen)]
    return runs


def apply_rescue(
    trajectories: Sequence[Trajectory],
    groups: Sequence[int],
    runs: Sequence[RescueRun],
    rescue_trajectories: Sequence[Trajectory],
    stats: RescueStats,
) -> tuple[list[Trajectory], list[int]]:
    """Returns (trajectories, group keys) with each rescued group's rollouts replaced by its
    rescue rollouts (same key, so advantages are relative within the rescue group); updates
    ``stats``. Groups that were not rescued are returned as they were, in order."""
    if len(runs) != len(rescue_trajectories):
        raise ValueError(f"{len(runs)} rescue runs but {len(rescue_trajectories)} trajectories")
    replaced = {run.group for run in runs}
    out_t: list[Trajectory] = []
    out_g: list[int] = []
    for trajectory, group in zip(trajectories, groups, strict=True):
        if group not in replaced:
            out_t.append(trajectory)
            out_g.append(group)
    by_group: dict[int, list[Trajectory]] = {}
    for run, trajectory in zip(runs, rescue_trajectories, strict=True):
        by_group.setdefault(run.group, []).append(trajectory)
        if run.harness != trajectory.harness and trajectory.status != "error":
            raise ValueError(f"rescue trajectory ran under {trajectory.harness!r}, planned {run.harness!r}")
        stats.selections[run.harness] += 1
    for group, members in by_group.items():
        out_t += members
        out_g += [group] * len(members)
        if any(t.passed for t in members):
            stats.rescued += 1
        else:
            stats.rescue_dead += 1
    stats.rescue_rollouts += len(runs)
    return out_t, out_g


def mixture_harnesses(
    h0: str, siblings: Sequence[str], group_size: int, sibling_fraction: float, seed: int
) -> list[str]:
    """Returns the harness of each of a group's ``group_size`` rollouts for the fixed-mixture
    baseline: ``round(group_size * sibling_fraction)`` of them under siblings drawn without
    replacement with ``seed`` (with replacement past the pool's size), the rest under H0."""
    if not 0.0 <= sibling_fraction <= 1.0:
        raise ValueError(f"sibling_fraction must be in [0, 1], got {sibling_fraction}")
    n_siblings = round(group_size * sibling_fraction) if siblings else 0
    rng = random.Random(seed)
    pool = list(siblings)
    rng.shuffle(pool)
    chosen = [pool[i % len(pool)] for i in range(n_siblings)] if pool else []
    return [h0] * (group_size - n_siblings) + chosen
