"""Task suites: the `TaskSuite` interface, a list-backed suite, and the registry that finds suites.

A suite is named data: splits of tasks. Suites are found by name through the entry-point
group ``harnessrl.task_suites`` (a built-in table stands in when the package is not installed),
or by path: a task file (``.yaml``, ``.yml``, ``.json``, ``.jsonl``) or a directory of them.
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from harnessrl.tasks.model import Task

ENTRY_POINT_GROUP = "harnessrl.task_suites"

# Used when the distribution's entry points are not visible (a source checkout on PYTHONPATH).
BUILTIN_SUITES: dict[str, str] = {
    "workspace": "harnessrl.tasks.builtin.workspace:suite",
    "agentbench-os": "harnessrl.tasks.external.agentbench_os:suite",
}

TASK_FILE_SUFFIXES: tuple[str, ...] = (".yaml", ".yml", ".json", ".jsonl")


class TaskSuite(ABC):
    """A named collection of tasks in splits (e.g. ``train`` and ``test``).

    Subclasses implement ``splits`` and ``tasks``; ``get`` scans every split unless overridden.
    ``skipped`` maps a reason to how many source tasks the suite could not offer, so that
    nothing is dropped silently.
    """

    name: str = ""
    description: str = ""

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
    """A suite over tasks held in memory, grouped by split (task files load into this)."""

    def __init__(
        self,
        name: str,
        tasks_by_split: Mapping[str, Sequence[Task]],
        description: str = "",
        skipped: Mapping[str, int] | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self._by_split: dict[str, list[Task]] = {s: list(ts) for s, ts in tasks_by_split.items()}
        self._by_id: dict[str, Task] = {}
        for split, split_tasks in self._by_split.items():
            for task in split_tasks:
                if task.id in self._by_id:
                    raise ValueError(f"suite {name!r}: duplicate task id {task.id!r} (split {split!r})")
                self._by_id[task.id] = task
        self._skipped = dict(skipped or {})

    @classmethod
    def from_tasks(cls, name: str, tasks: Iterable[Task], description: str = "") -> ListSuite:
        """Returns a suite whose splits are the tasks' own ``split`` fields, in first-seen order."""
        by_split: dict[str, list[Task]] = {}
        for task in tasks:
            by_split.setdefault(task.split, []).append(task)
        return cls(name, by_split, description=description)

    def splits(self) -> tuple[str, ...]:
        return tuple(self._by_split)

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> Iterator[Task]:
        self.check_split(split)
        return iter(sample_in_order(self._by_split[split], limit, seed))

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


def _entry_points() -> dict[str, metadata.EntryPoint]:
    try:
        return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken distribution must not hide the built-in suites
        return {}


def available_suites() -> list[str]:
    """Returns the names ``load_suite`` accepts (entry points plus the built-in table), sorted."""
    return sorted(set(_entry_points()) | set(BUILTIN_SUITES))


def _load_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def _looks_like_path(name_or_path: str | Path) -> bool:
    text = str(name_or_path)
    return (
        isinstance(name_or_path, Path)
        or text.lower().endswith(TASK_FILE_SUFFIXES)
        or "/" in text
        or text.startswith(".")
        or Path(text).exists()
    )


def load_suite(name_or_path: str | Path, **kwargs: Any) -> TaskSuite:
    """Returns the suite registered under a name, or loaded from a task file or directory.

    A registered entry point may be a ``TaskSuite`` or a callable ``suite(**kwargs)`` returning
    one; ``kwargs`` are passed to that callable. An unknown name raises ``ValueError`` listing
    the available suites.
    """
    if _looks_like_path(name_or_path):
        from harnessrl.tasks.files import load_task_suite

        return load_task_suite(Path(name_or_path))
    name = str(name_or_path)
    entry_points = _entry_points()
    if name in entry_points:
        loader: Callable[[], Any] = entry_points[name].load
    elif name in BUILTIN_SUITES:
        target = BUILTIN_SUITES[name]

        def loader() -> Any:
            return _load_target(target)
    else:
        raise ValueError(
            f"unknown task suite {name!r}; available: {', '.join(available_suites())} "
            f"(or pass a path to a {'/'.join(TASK_FILE_SUFFIXES)} task file or a directory of them)"
        )
    obj = loader()
    suite = obj if isinstance(obj, TaskSuite) else obj(**kwargs) if callable(obj) else obj
    if not isinstance(suite, TaskSuite):
        raise TypeError(
            f"task suite {name!r} resolved to {type(suite).__name__}, not a TaskSuite; "
            f"its entry point must be a TaskSuite or a callable returning one"
        )
    if not suite.name:
        suite.name = name
    return suite
