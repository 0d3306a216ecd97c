"""The task frontier: an estimate of each training task's pass rate under the current policy,
and draws of a step's tasks weighted toward the tasks whose groups carry a gradient.

A GRPO group of G rollouts of a task with pass rate p has mixed outcomes with probability
1 - p^G - (1 - p)^G, and its advantage variance is largest at p = 1/2: tasks the policy always
or never solves teach nothing (the zero-advantage groups DAPO filters, Yu et al. 2025,
section 3.2). The frontier keeps, per task, exponentially decayed counts of passes and
rollouts from every group the task appeared in (the policy moves, so old outcomes count less)
and a Beta(prior, prior) prior, so an unseen task starts at 1/2: the optimistic prior that
makes it worth a first look. A task is *on the frontier* while its estimate lies in
[low, high]; a draw takes each task with weight p(1 - p) among frontier tasks, plus a share
``explore`` of the draws uniformly among tasks never seen, and falls back to the least
certain tasks when the frontier holds fewer than asked for.

Everything is a pure function of the observations and the seed passed in, so a resumed run
that reloads ``state_dict`` draws exactly what the uninterrupted one drew.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harnessrl.rl.config import TrainConfig

_FIELDS = TrainConfig.model_fields  # the defaults' one home


@dataclass(frozen=True)
class FrontierSettings:
    """How the frontier estimates and draws (``TrainConfig``'s ``frontier_*`` fields, whose
    defaults these are)."""

    decay: float = _FIELDS["frontier_decay"].default
    prior: float = _FIELDS["frontier_prior"].default
    low: float = _FIELDS["frontier_low"].default
    high: float = _FIELDS["frontier_high"].default
    explore: float = _FIELDS["frontier_explore"].default

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> FrontierSettings:
        return cls(cfg.frontier_decay, cfg.frontier_prior, cfg.frontier_low, cfg.frontier_high, cfg.frontier_explore)


class TaskFrontier:
    """Pass-rate estimates of a fixed set of training tasks; draws a step's tasks from them."""

    def __init__(self, task_ids: Sequence[str], settings: FrontierSettings | None = None) -> None:
        if not task_ids:
            raise ValueError("a task frontier needs at least one task")
        self.settings = settings or FrontierSettings()
        self.task_ids = tuple(task_ids)
        self.passes = {task: 0.0 for task in self.task_ids}
        self.trials = {task: 0.0 for task in self.task_ids}
        self.seen = {task: 0 for task in self.task_ids}  # groups observed, undecayed

    def observe(self, task_id: str, passed: Iterable[bool]) -> None:
        """Adds one group's outcomes for ``task_id``: older counts decay by ``settings.decay``."""
        outcomes = [bool(p) for p in passed]
        if task_id not in self.passes:
            raise KeyError(f"task {task_id!r} is not one of the frontier's training tasks")
        if not outcomes:
            return
        decay = self.settings.decay
        self.passes[task_id] = decay * self.passes[task_id] + sum(outcomes)
        self.trials[task_id] = decay * self.trials[task_id] + len(outcomes)
        self.seen[task_id] += 1

    def estimate(self, task_id: str) -> float:
        """Returns the posterior mean pass rate of ``task_id`` (1/2 for a task never seen)."""
        prior = self.settings.prior
        return (self.passes[task_id] + prior) / (self.trials[task_id] + 2 * prior)

    def on_frontier(self, task_id: str) -> bool:
        return self.settings.low <= self.estimate(task_id) <= self.settings.high

    def members(self) -> list[str]:
        """Returns the tasks on the frontier (unseen ones included), in task order."""
        return [task for task in self.task_ids if self.on_frontier(task)]

    def draw(self, n: int, rng: np.random.Generator, exclude: Iterable[str] = ()) -> list[str]:
        """Returns ``n`` distinct tasks (fewer only when fewer are left): a share ``explore``
        uniformly among unseen tasks, the rest weighted by p(1 - p) among frontier tasks, then
        the least certain of the remaining tasks if the frontier runs out."""
        excluded = set(exclude)
        available = [task for task in self.task_ids if task not in excluded]
        chosen: list[str] = []
        unseen = [task for task in available if self.seen[task] == 0]
        n_explore = min(len(unseen), round(self.settings.explore * n))
        if n_explore:
            chosen += [unseen[i] for i in rng.choice(len(unseen), size=n_explore, replace=False)]
        frontier = [task for task in available if task not in chosen and self.on_frontier(task)]
        wanted = min(n - len(chosen), len(frontier))
        if wanted > 0:
            weights = np.array([self.estimate(t) * (1.0 - self.estimate(t)) for t in frontier])
            picks = rng.choice(len(frontier), size=wanted, replace=False, p=weights / weights.sum())
            chosen += [frontier[i] for i in picks]
        if len(chosen) < n:  # the frontier is too small: the least certain tasks left
            rest = [task for task in available if task not in chosen]
            tie_break = rng.random(len(rest))
            order = sorted(range(len(rest)), key=lambda i: (abs(self.estimate(rest[i]) - 0.5), tie_break[i]))
            chosen += [rest[i] for i in order[: n - len(chosen)]]
        return chosen

    def metrics(self, drawn: Sequence[str] = ()) -> dict[str, Any]:
        """Returns the frontier's size, how many tasks were ever seen, and the drawn tasks'
        estimated pass rates (as they were when drawn, if called before ``observe``)."""
        estimates = [self.estimate(task) for task in drawn]
        return {
            "frontier/size": len(self.members()),
            "frontier/seen": sum(1 for task in self.task_ids if self.seen[task]),
            "frontier/tasks": len(self.task_ids),
            "frontier/drawn_pass_rate": float(np.mean(estimates)) if estimates else None,
            "frontier/drawn_estimates": [round(e, 4) for e in estimates],
        }

    def state_dict(self) -> dict[str, Any]:
        return {"passes": dict(self.passes), "trials": dict(self.trials), "seen": dict(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("passes", "trials", "seen"):
            table = getattr(self, name)
            for task, value in state.get(name, {}).items():
                if task in table:
                    table[task] = type(table[task])(value)
