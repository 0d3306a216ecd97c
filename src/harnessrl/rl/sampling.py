"""What a training step rolls out: the round's tasks (the schedule's, or drawn from the task
frontier), their K-step pairing, and dynamic sampling of groups with signal.

    round r = steps rK .. rK+K-1:  tasks = frontier.draw(tasks_per_step)  (or the schedule's)
    step  t = rK + j:              pair i = (tasks[i], round_configs(r, i)[j])     (K-pairing)
    first pass:                    G rollouts per pair
    dynamic sampling (DAPO):       while fewer than tasks_per_step groups have mixed rewards and
                                   rounds remain: draw a new task per missing group, roll it out
                                   under the configuration of the group it replaces

**The pairing stays what it is.** The frontier replaces only the schedule's epoch order: the
K configurations of a round's i-th task are the schedule's ``round_configs(r, i)``, and the
task is rolled out on K successive steps under them. A replacement drawn by dynamic sampling
takes over its item's place for the rest of the round (under the item's remaining K
configurations), so every task still meets its configurations on successive steps.

**Why new tasks, not the same task again.** A group is dead because its task's pass rate is
near 0 or 1 under the current policy; G more rollouts of the same task are dead again with
the same probability, while a task from the frontier (estimate near 1/2) is mixed with the
highest probability there is. This is DAPO's choice (it draws further prompts) and verl's
``algorithm.filter_groups``.

**Dynamic sampling and rescue compose as: resample first, rescue what stays dead.** When the
rounds run out, the step is filled with the first pass's dead groups (in order), which then go
to Harness-S rescue (``rescue != none``) or are left out of the update like any dead group.
Rescue thus spends its sibling rollouts only on the groups the frontier could not replace.

Every random choice takes a seed from (run seed, step, round); the frontier's counts and the
round's tasks are state that a checkpoint carries, so a resumed run continues both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harnessrl.pairing import Pair, PairingSchedule
from harnessrl.rl.frontier import FrontierSettings, TaskFrontier
from harnessrl.trajectory import Trajectory

# Stream tags of the sampler's random draws (kept apart from the schedule's).
_ROUND_DRAW, _REPLACEMENT_DRAW = 11, 12

RunPairs = Callable[[Sequence[Pair], int], tuple[list[list[Trajectory]], Any]]
"""Rolls out G episodes of each pair in sampling round ``round``; returns them per pair and the
engine's stats."""


def has_signal(trajectories: Sequence[Trajectory]) -> bool:
    """A group carries a GRPO gradient when its rewards are not all equal."""
    return len({float(t.reward) for t in trajectories}) > 1


@dataclass
class StepRollouts:
    """A step's groups after dynamic sampling: the pairs, each pair's trajectories, and what
    sampling did (per step: rounds, groups drawn and kept, rollouts beyond the first pass)."""

    pairs: list[Pair]
    groups: list[list[Trajectory]]
    first_pass: list[list[Trajectory]]
    stats: list[Any] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def flat(self) -> tuple[list[Trajectory], list[int]]:
        """Returns the trajectories in group order and each one's group index."""
        trajectories = [t for group in self.groups for t in group]
        keys = [g for g, group in enumerate(self.groups) for _ in group]
        return trajectories, keys


class StepSampler:
    """Chooses and rolls out each step's groups (see the module docstring)."""

    def __init__(self, schedule: PairingSchedule, *, seed: int, frontier: FrontierSettings | None = None,
                 max_rounds: int = 0) -> None:
        self.schedule = schedule
        self.seed = seed
        self.max_rounds = max_rounds
        self.frontier = TaskFrontier(schedule.task_ids, frontier) if frontier is not None else None
        self.round_index: int | None = None
        self.round_tasks: list[str] = []

    def _rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([self.seed, *stream]))

    def pairs(self, step: int) -> list[Pair]:
        """Returns the first-pass pairs of ``step``: the schedule's, or the frontier round's."""
        if self.frontier is None:
            return self.schedule.step(step)
        round_index, slot = divmod(step, self.schedule.k)
        if self.round_index != round_index:
            self.round_index = round_index
            self.round_tasks = self.frontier.draw(self.schedule.tasks_per_step, self._rng(_ROUND_DRAW, round_index))
        return [self._pair(round_index, item, slot, task) for item, task in enumerate(self.round_tasks)]

    def _pair(self, round_index: int, item: int, slot: int, task: str) -> Pair:
        configs = self.schedule.round_configs(round_index, item)
        return Pair(task, configs[slot], configs[0], slot, round_index)

    def _replacements(self, step: int, round_: int, dead: list[int], pairs: list[Pair], exclude: set[str]) -> list[str]:
        rng = self._rng(_REPLACEMENT_DRAW, step, round_)
        if self.frontier is not None:
            return self.frontier.draw(len(dead), rng, exclude=exclude)
        rest = [t for t in self.schedule.task_ids if t not in exclude]
        picks = rng.choice(len(rest), size=min(len(dead), len(rest)), replace=False) if rest else []
        return [rest[i] for i in picks]

    def run(self, step: int, run_pairs: RunPairs) -> StepRollouts:
        """Rolls out ``step``'s pairs, then redraws dead groups for up to ``max_rounds`` rounds."""
        target = self.schedule.tasks_per_step
        pairs = self.pairs(step)
        drawn_estimates = [self.frontier.estimate(p.task) for p in pairs] if self.frontier else []
        first, stats = run_pairs(pairs, 0)
        all_stats = [stats]
        self._observe(pairs, first)
        kept = [(i, p, g) for i, (p, g) in enumerate(zip(pairs, first, strict=True)) if has_signal(g)]
        dead = [i for i, g in enumerate(first) if not has_signal(g)]
        used = {p.task for p in pairs}
        rounds = drawn = extra_rollouts = 0
        missing = dead[: max(0, target - len(kept))] if self.max_rounds else []
        while missing and rounds < self.max_rounds:
            rounds += 1
            tasks = self._replacements(step, rounds, missing, pairs, used)
            if not tasks:
                break
            replacements = [Pair(task, pairs[i].config, pairs[i].anchor, pairs[i].slot, pairs[i].round)
                            for task, i in zip(tasks, missing, strict=False)]
            used.update(tasks)
            groups, stats = run_pairs(replacements, rounds)
            all_stats.append(stats)
            self._observe(replacements, groups)
            drawn += len(replacements)
            extra_rollouts += sum(len(g) for g in groups)
            still = []
            for item, pair, group in zip(missing, replacements, groups, strict=False):
                if has_signal(group):
                    kept.append((item, pair, group))
                    self._take_over(item, pair.task, step)
                else:
                    still.append(item)
            missing = still + missing[len(replacements):]
        # The step: mixed groups first-pass order first, then first-pass dead groups to fill it.
        kept.sort(key=lambda entry: entry[0])
        chosen = kept[:target]
        filled = {entry[0] for entry in chosen}
        for i in dead:
            if len(chosen) >= target:
                break
            if i not in filled:
                chosen.append((i, pairs[i], first[i]))
        chosen.sort(key=lambda entry: entry[0])
        out = StepRollouts([p for _, p, _ in chosen], [g for _, _, g in chosen], first, all_stats)
        out.metrics = {
            "sampling/rounds": rounds,
            "sampling/groups_drawn": len(pairs) + drawn,
            "sampling/groups_kept": sum(has_signal(g) for g in out.groups),
            "sampling/extra_rollouts": extra_rollouts,
            "sampling/first_pass_reward": float(np.mean([t.reward for g in first for t in g])) if first else 0.0,
            "sampling/first_pass_valid_group_ratio": sum(has_signal(g) for g in first) / len(first) if first else 0.0,
            # per first-pass group: its task and mean reward (learning curves bootstrap over tasks)
            "sampling/first_pass_groups": [[p.task, round(float(np.mean([t.reward for t in g])), 6)]
                                           for p, g in zip(pairs, first, strict=True) if g],
        }
        if self.frontier is not None:
            out.metrics.update(self.frontier.metrics())
            out.metrics["frontier/drawn_pass_rate"] = float(np.mean(drawn_estimates)) if drawn_estimates else None
            out.metrics["frontier/drawn_estimates"] = [round(e, 4) for e in drawn_estimates]
        return out

    def _observe(self, pairs: Sequence[Pair], groups: Sequence[Sequence[Trajectory]]) -> None:
        if self.frontier is None:
            return
        for pair, group in zip(pairs, groups, strict=True):
            self.frontier.observe(pair.task, [t.passed for t in group])

    def _take_over(self, item: int, task: str, step: int) -> None:
        """A replacement with signal takes its item's place for the rest of the round."""
        if self.frontier is not None and self.round_index == step // self.schedule.k:
            self.round_tasks[item] = task

    def state_dict(self) -> dict[str, Any]:
        return {
            "frontier": self.frontier.state_dict() if self.frontier is not None else None,
            "round_index": self.round_index,
            "round_tasks": list(self.round_tasks),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.frontier is not None and state.get("frontier"):
            self.frontier.load_state_dict(state["frontier"])
        self.round_index = state.get("round_index")
        self.round_tasks = list(state.get("round_tasks", []))


def combine_stats(stats: Sequence[Any]) -> Any:
    """Returns one step's rollout stats from its sampling rounds' (counts and times summed,
    the mean batch size weighted by generation calls); one round's stats are returned as is."""
    if len(stats) == 1:
        return stats[0]
    total = type(stats[0])()
    for part in stats:
        for name, value in vars(part).items():
            if name != "mean_batch_size":
                setattr(total, name, getattr(total, name) + value)
    calls = sum(part.generation_calls for part in stats)
    total.mean_batch_size = sum(part.mean_batch_size * part.generation_calls for part in stats) / calls if calls else 0.0
    return total
