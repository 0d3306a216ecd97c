"""The `TaskSuite` interface and the list-backed suite that task files and Python lists load into.

A suite is named data: splits of tasks. ``harnessrl.tasks.suite`` finds suites by name or path.
"""

from __future__ import annotations

import dataclasses
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from harnessrl.sandbox import SandboxMount
from harnessrl.tasks.model import Task

TASK_FILE_SUFFIXES: tuple[str, ...] = (".yaml", ".yml", ".json", ".jsonl")


class TaskSuite(ABC):
    """A named collection of tasks in splits (e.g. ``train`` and ``test``).

    Subclasses implement ``splits`` and ``tasks``; ``get`` scans every split unless overridden.
    ``skipped`` maps a reason to how many source tasks the suite could not offer, so that
    nothing is dropped silently. ``requires`` names the Python packages its tasks import in
    the sandbox and ``mounts`` the read-only host directories they need there
    (``harnessrl.tasks.needs``; ``load_suite`` checks both).
    """

    name: str = ""
    description: str = ""
    requires: tuple[str, ...] = ()
    mounts: tuple[SandboxMount, ...] = ()

    @abstractmethod
    def splits(self) -> tuple[str, ...]:
        """Returns the split names, e.g. ``("train", "test")``."""

    @abstractmethod
    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> Iterator[Task]:
        """Yields the tasks of ``split``; with ``limit``, a sample of that many drawn with ``seed``."""

    def get(self, task_id: str) -> Task:
        """Returns the task with id ``task_id``; raises ``KeyError`` naming the suite."""
        for split in self.splits():
            for task in self.tasks(split):
                if task.id == task_id:
                    return task
        raise KeyError(f"suite {self.name!r} has no task {task_id!r}")

    @property
    def skipped(self) -> dict[str, int]:
        """Returns ``{reason: count}`` of source tasks this suite could not offer."""
        return {}

    def skipped_in(self, split: str) -> dict[str, int]:
        """Returns ``{reason: count}`` of skipped source tasks of one split (default: all)."""
        return self.skipped

    def check_split(self, split: str) -> None:
        """Raises ``ValueError`` naming the valid splits when ``split`` is not one of them."""
        if split not in self.splits():
            raise ValueError(
                f"suite {self.name!r} has no split {split!r}; use one of {', '.join(self.splits())}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, splits={self.splits()!r})"


def with_mounts(task: Task, mounts: Sequence[SandboxMount]) -> Task:
    """Returns ``task`` with ``mounts`` added to its own (a copy; the same task when none)."""
    if not mounts:
        return task
    merged = {m.target: m for m in (*mounts, *task.mounts)}
    return dataclasses.replace(task, mounts=tuple(merged.values()))


def seeded_order(items: Sequence[Any], limit: int | None, seed: int) -> list[Any]:
    """Returns ``limit`` of ``items`` (all when None) drawn and ordered with ``seed``.

    Seed 0 keeps the source order (``sample_in_order``); any other seed shuffles the whole
    split with ``random.Random(seed)`` and takes a prefix, so a larger ``limit`` of the same
    seed extends a smaller one, and different seeds evaluate different tasks first.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if seed == 0:
        return sample_in_order(items, limit, seed)
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    return shuffled if limit is None else shuffled[:limit]


def sample_in_order(items: Sequence[Any], limit: int | None, seed: int) -> list[Any]:
    """Returns ``items`` when ``limit`` is None or covers them all, else ``limit`` of them drawn
    with ``random.Random(seed)`` and kept in their original order."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    chosen = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in chosen]


class ListSuite(TaskSuite):
    """A suite over tasks held in memory, grouped by split (task files and Python lists load
    into this); ``tasks(split, limit, seed)`` draws and orders them with ``seeded_order``.
    The suite's ``mounts`` are added to each task's own."""

    def __init__(
        self,
        name: str,
        tasks_by_split: Mapping[str, Sequence[Task]],
        description: str = "",
        skipped: Mapping[str, int] | None = None,
        requires: Sequence[str] = (),
        mounts: Sequence[SandboxMount] = (),
    ) -> None:
        self.name = name
        self.description = description
        self.requires = tuple(requires)
        self.mounts = tuple(mounts)
        self._by_split: dict[str, list[Task]] = {
            s: [with_mounts(t, self.mounts) for t in ts] for s, ts in tasks_by_split.items()}
        self._by_id: dict[str, Task] = {}
        for split, split_tasks in self._by_split.items():
            for task in split_tasks:
                if task.id in self._by_id:
                    raise ValueError(f"suite {name!r}: duplicate task id {task.id!r} (split {split!r})")
                self._by_id[task.id] = task
        self._skipped = dict(skipped or {})

    @classmethod
    def from_tasks(cls, name: str, tasks: Iterable[Task], description: str = "",
                   requires: Sequence[str] = (), mounts: Sequence[SandboxMount] = ()) -> ListSuite:
        """Returns a suite whose splits are the tasks' own ``split`` fields, in first-seen order."""
        by_split: dict[str, list[Task]] = {}
        for task in tasks:
            by_split.setdefault(task.split, []).append(task)
        return cls(name, by_split, description=description, requires=requires, mounts=mounts)

    def splits(self) -> tuple[str, ...]:
        return tuple(self._by_split)

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> Iterator[Task]:
        self.check_split(split)
        return iter(seeded_order(self._by_split[split], limit, seed))

    def size(self, split: str) -> int:
        """Returns how many tasks ``tasks(split)`` yields without a limit."""
        self.check_split(split)
        return len(self._by_split[split])

    def get(self, task_id: str) -> Task:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise KeyError(f"suite {self.name!r} has no task {task_id!r}") from None

    def all_tasks(self) -> list[Task]:
        """Returns every task of every split, split by split."""
        return [t for ts in self._by_split.values() for t in ts]

    @property
    def skipped(self) -> dict[str, int]:
        return dict(self._skipped)

    def __len__(self) -> int:
        return len(self._by_id)
