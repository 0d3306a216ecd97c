"""The built-in ``workspace`` suite: procedurally generated shell/file/data/code tasks, tiers 1-4.

Eight families (files, text, data, sqlite, code, search, state, recovery) × four tiers, each
cell an unbounded, deterministic stream of tasks. A task is a pure function of its id
``ws-<split>-<family>-<tier>-<index>``, so ``get(task_id)`` regenerates it exactly. Train and
test are disjoint by construction: each split has its own vocabulary of names (files, people,
tables, columns...), its own instruction wordings, and some split-specific schemas and formats
(see ``families/vocab.py`` and each family's ``Templates``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from typing import Any

from harnessrl.tasks.base import TaskSuite
from harnessrl.tasks.builtin.families import FAMILIES
from harnessrl.tasks.builtin.families.common import SPLITS, TIERS, GenContext
from harnessrl.tasks.model import Task

TASK_ID = re.compile(r"^ws-(?P<split>[a-z]+)-(?P<family>[a-z]+)-(?P<tier>\d+)-(?P<index>\d+)$")

DEFAULT_PER_CELL: dict[str, int] = {"train": 100, "test": 10}


def generate_task(split: str, family: str, tier: int, index: int) -> Task:
    """Returns the task at ``index`` of one (split, family, tier) cell; the same inputs always
    give the same task."""
    if split not in SPLITS:
        raise KeyError(f"workspace suite has no split {split!r}; use one of {', '.join(SPLITS)}")
    if family not in FAMILIES:
        raise KeyError(f"workspace suite has no family {family!r}; use one of {', '.join(FAMILIES)}")
    if tier not in TIERS:
        raise KeyError(f"workspace suite has no tier {tier}; use one of {TIERS}")
    if index < 0:
        raise KeyError(f"task index must be >= 0, got {index}")
    return FAMILIES[family][tier](GenContext(split, family, tier, index))


class WorkspaceSuite(TaskSuite):
    """The procedural ``workspace`` suite: ``per_cell[split]`` tasks per (family, tier) cell.

    ``tasks(split, limit, seed)`` interleaves the cells round by round (the cell order of each
    round shuffled with ``seed``, and with a non-zero ``seed`` each cell's indices permuted
    too), so any prefix, and so any ``limit``, is stratified by family and tier.
    """

    name = "workspace"
    description = (
        "Procedural shell/file/data/sqlite/code/search/state-tracking/error-recovery tasks, "
        "tiers 1-4, with disjoint train and test vocabularies and wordings."
    )

    def __init__(
        self,
        train_per_cell: int = DEFAULT_PER_CELL["train"],
        test_per_cell: int = DEFAULT_PER_CELL["test"],
        families: Sequence[str] | None = None,
        tiers: Sequence[int] | None = None,
    ) -> None:
        unknown = sorted(set(families or ()) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown workspace families {unknown}; choose from {', '.join(FAMILIES)}")
        bad_tiers = sorted(set(tiers or ()) - set(TIERS))
        if bad_tiers:
            raise ValueError(f"unknown tiers {bad_tiers}; choose from {TIERS}")
        if train_per_cell < 0 or test_per_cell < 0:
            raise ValueError("train_per_cell and test_per_cell must be >= 0")
        self.per_cell = {"train": int(train_per_cell), "test": int(test_per_cell)}
        self.families = tuple(families) if families else tuple(FAMILIES)
        self.tiers = tuple(sorted(tiers)) if tiers else TIERS

    def splits(self) -> tuple[str, ...]:
        """Returns ``("train", "test")``."""
        return SPLITS

    def cells(self) -> list[tuple[str, int]]:
        """Returns the (family, tier) cells this suite covers."""
        return [(family, tier) for family in self.families for tier in self.tiers]

    def size(self, split: str) -> int:
        """Returns how many tasks ``tasks(split)`` yields without a limit."""
        self.check_split(split)
        return self.per_cell[split] * len(self.cells())

    def task_ids(self, split: str, limit: int | None = None, seed: int = 0) -> list[str]:
        """Returns the ids ``tasks(split, limit, seed)`` yields, in the same order."""
        return [f"ws-{split}-{family}-{tier}-{index}"
                for family, tier, index in self._schedule(split, limit, seed)]

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> Iterator[Task]:
        """Yields the tasks of ``split``; with ``limit``, the first ``limit`` of the stratified
        order drawn with ``seed``."""
        for family, tier, index in self._schedule(split, limit, seed):
            yield generate_task(split, family, tier, index)

    def get(self, task_id: str) -> Task:
        """Returns the task with id ``task_id``, regenerated from the id alone.

        Any index is valid (each cell is an unbounded stream); raises ``KeyError`` for an id
        that is not a workspace id.
        """
        match = TASK_ID.match(task_id)
        if match is None:
            raise KeyError(
                f"suite 'workspace' has no task {task_id!r}; ids look like ws-<split>-<family>-<tier>-<index>"
            )
        return generate_task(match["split"], match["family"], int(match["tier"]), int(match["index"]))

    def _schedule(self, split: str, limit: int | None, seed: int) -> Iterator[tuple[str, int, int]]:
        self.check_split(split)
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        total = self.size(split)
        count = total if limit is None else min(limit, total)
        per_cell = self.per_cell[split]
        cells = self.cells()
        orders: dict[tuple[str, int], Sequence[int]] = {}
        for family, tier in cells:
            indices: list[int] | range = range(per_cell)
            if seed:
                indices = list(indices)
                random.Random(f"{seed}/{split}/{family}/{tier}").shuffle(indices)
            orders[(family, tier)] = indices
        rng = random.Random(f"workspace-rounds/{seed}/{split}")
        emitted = 0
        for round_number in range(per_cell):
            round_cells = list(cells)
            rng.shuffle(round_cells)
            for family, tier in round_cells:
                if emitted >= count:
                    return
                yield family, tier, orders[(family, tier)][round_number]
                emitted += 1


def suite(**kwargs: Any) -> WorkspaceSuite:
    """Returns the workspace suite (the ``harnessrl.task_suites`` entry point ``workspace``).

    Keyword arguments: ``train_per_cell`` (default 100, so 3,200 train tasks),
    ``test_per_cell`` (default 10, so 320 test tasks), ``families`` and ``tiers`` to restrict
    the cells.
    """
    return WorkspaceSuite(**kwargs)
