"""Finding task suites: by name through the entry-point group ``harnessrl.task_suites`` (a built-in table stands in when the package is not installed),
or by path: a task file (``.yaml``, ``.yml``, ``.json``, ``.jsonl``) or a directory of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from harnessrl.tasks.base import TASK_FILE_SUFFIXES, TaskSuite
from harnessrl.tasks.files import load_task_suite
from harnessrl.tasks.model import Task

ENTRY_POINT_GROUP = "harnessrl.task_suites"

# Used when the distribution's entry points are not visible (a source checkout on PYTHONPATH).
BUILTIN_SUITES: dict[str, str] = {
    "workspace": "harnessrl.tasks.builtin.workspace:suite",
    "agentbench-os": "harnessrl.tasks.external.agentbench_os:suite",
}

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


def select_tasks(
    suite_name: str, split: str, limit: int | None, seed: int,
    tiers: list[int] | None = None, families: list[str] | None = None,
) -> list[Task]:
    """Returns up to ``limit`` tasks of ``split`` in the tiers and families given (None = all),
    in the suite's seeded order."""
    suite = load_suite(suite_name)
    chosen: list[Task] = []
    for task in suite.tasks(split, seed=seed):
        if (tiers is None or task.tier in tiers) and (families is None or task.family in families):
            chosen.append(task)
            if limit is not None and len(chosen) >= limit:
                break
    if not chosen:
        raise ValueError(f"no {split} tasks in suite {suite_name!r} with tiers {tiers} and families {families}")
    return chosen
