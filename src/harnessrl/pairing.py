"""Task–harness pairing: which (task, configuration) pairs each training step rolls out.

Harness Scaling pairs each task with K configurations of the training design: an anchor
drawn uniformly, then its K-1 nearest other configurations by Hamming distance, rolled out
on K successive steps (the Harness Scaling paper's "Cross-harness training"; K=2 by default).
The batch for step t depends only on the seed and t, so a resumed run continues the
same schedule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harnessrl.space import HarnessConfig

STRATEGIES: tuple[str, ...] = ("neighbour", "repeat", "random")

# Stream tags keep the independent random choices of a schedule apart.
_TASK_ORDER, _ANCHOR, _NEIGHBOURS = 1, 2, 3


@dataclass(frozen=True)
class Pair:
    """One rollout assignment: a task under a configuration.

    ``slot`` is this configuration's position among the task's K (0 is the anchor) and
    ``round`` the index of the K-step round the task belongs to.
    """

    task: str
    config: HarnessConfig
    anchor: HarnessConfig
    slot: int
    round: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "config": self.config.code,
            "anchor": self.anchor.code,
            "slot": self.slot,
            "round": self.round,
        }


class PairingSchedule:
    """A seeded, resumable schedule of (task, configuration) batches.

    Steps come in rounds of K: round r = steps rK .. rK+K-1 holds ``tasks_per_step`` tasks,
    each with its K configurations; step rK+j rolls out every task of the round under its
    j-th configuration. Tasks are visited in epochs, each epoch a fresh seeded permutation
    of the task ids, so every task is seen once per epoch.
    """

    def __init__(
        self,
        task_ids: Sequence[str],
        configs: Sequence[HarnessConfig],
        tasks_per_step: int,
        k: int = 2,
        strategy: str = "neighbour",
        seed: int = 0,
    ) -> None:
        if not task_ids:
            raise ValueError("a pairing schedule needs at least one task")
        if len(set(task_ids)) != len(task_ids):
            raise ValueError("task ids must be unique")
        if not configs:
            raise ValueError("a pairing schedule needs at least one configuration")
        if len(set(configs)) != len(configs):
            raise ValueError("design configurations must be unique")
        if tasks_per_step < 1:
            raise ValueError(f"tasks_per_step must be >= 1, got {tasks_per_step}")
        if k < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if strategy != "repeat" and k > len(configs):
            raise ValueError(
                f"K={k} needs at least {k} distinct configurations, the design has {len(configs)}"
            )
        self.task_ids = tuple(task_ids)
        self.configs = tuple(configs)
        self.tasks_per_step = tasks_per_step
        self.k = k
        self.strategy = strategy
        self.seed = seed
        levels = np.array([c.levels for c in self.configs], dtype=np.int64)
        self._distance = (levels[:, None, :] != levels[None, :, :]).sum(axis=2)
        self._orders: dict[int, np.ndarray] = {}  # epoch -> task permutation (a pure cache)

    def _rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([self.seed, *stream]))

    def _epoch_order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            if len(self._orders) > 4:
                self._orders.clear()
            order = self._orders[epoch] = self._rng(_TASK_ORDER, epoch).permutation(len(self.task_ids))
        return order

    def _task_at(self, position: int) -> str:
        epoch, index = divmod(position, len(self.task_ids))
        return self.task_ids[int(self._epoch_order(epoch)[index])]

    def round_configs(self, round_index: int, item: int) -> list[HarnessConfig]:
        """Returns the K configurations of the ``item``-th task of a round, anchor first."""
        anchor = int(self._rng(_ANCHOR, round_index, item).integers(len(self.configs)))
        if self.k == 1:
            return [self.configs[anchor]]
        if self.strategy == "repeat":
            return [self.configs[anchor]] * self.k
        rng = self._rng(_NEIGHBOURS, round_index, item)
        others = [i for i in range(len(self.configs)) if i != anchor]
        tie_break = rng.random(len(others))
        if self.strategy == "neighbour":
            order = sorted(range(len(others)), key=lambda j: (self._distance[anchor, others[j]], tie_break[j]))
        else:  # random: K-1 distinct others, uniformly
            order = sorted(range(len(others)), key=lambda j: tie_break[j])
        chosen = [others[j] for j in order[: self.k - 1]]
        return [self.configs[anchor]] + [self.configs[i] for i in chosen]

    def step(self, t: int) -> list[Pair]:
        """Returns the batch of pairs of step ``t`` (0-based); depends only on seed and t."""
        if t < 0:
            raise ValueError(f"step must be >= 0, got {t}")
        round_index, slot = divmod(t, self.k)
        batch = []
        for item in range(self.tasks_per_step):
            task = self._task_at(round_index * self.tasks_per_step + item)
            configs = self.round_configs(round_index, item)
            batch.append(Pair(task, configs[slot], configs[0], slot, round_index))
        return batch

    def steps(self, n_steps: int, start: int = 0) -> Iterator[list[Pair]]:
        """Yields the batches of steps ``start`` .. ``start + n_steps - 1``."""
        for t in range(start, start + n_steps):
            yield self.step(t)

    def statistics(self, n_steps: int, start: int = 0) -> ScheduleStats:
        """Returns coverage counts over ``n_steps`` steps from ``start``."""
        config_counts: Counter[str] = Counter()
        pair_cells: dict[str, Counter[str]] = {}
        task_counts: Counter[str] = Counter()
        letters = self.configs[0].letters
        for batch in self.steps(n_steps, start):
            for pair in batch:
                config_counts[pair.config.code] += 1
                task_counts[pair.task] += 1
                levels = pair.config.levels
                for i in range(len(letters)):
                    for j in range(i + 1, len(letters)):
                        key = f"{letters[i]}{letters[j]}"
                        cell = f"{letters[i]}{levels[i]}{letters[j]}{levels[j]}"
                        pair_cells.setdefault(key, Counter())[cell] += 1
        return ScheduleStats(
            n_steps=n_steps,
            n_pairs=sum(config_counts.values()),
            config_counts=dict(config_counts),
            factor_pair_cells={k: dict(v) for k, v in pair_cells.items()},
            task_counts=dict(task_counts),
        )


@dataclass(frozen=True)
class ScheduleStats:
    """Coverage of a stretch of schedule: per configuration, per factor-pair level cell, per task."""

    n_steps: int
    n_pairs: int
    config_counts: dict[str, int]
    factor_pair_cells: dict[str, dict[str, int]]
    task_counts: dict[str, int]

    def cell_imbalance(self) -> float:
        """Returns max/min count over all factor-pair level cells (1.0 is perfectly even)."""
        counts = [c for cells in self.factor_pair_cells.values() for c in cells.values()]
        return max(counts) / min(counts) if counts else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_steps": self.n_steps,
            "n_pairs": self.n_pairs,
            "config_counts": self.config_counts,
            "factor_pair_cells": self.factor_pair_cells,
            "cell_imbalance": self.cell_imbalance(),
        }
