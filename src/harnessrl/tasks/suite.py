"""Finding task suites: by name through the entry-point group ``harnessrl.task_suites`` (a built-in table stands in when the package is not installed),
by path: a task file (``.yaml``, ``.yml``, ``.json``, ``.jsonl``) or a directory of them, or
in Python code: ``module:attr`` (an importable module) or ``path/to/file.py[:attr]`` (attr
``suite``, else ``tasks``, by default), where the object is a ``TaskSuite``, a list of ``Task`` objects (the
module's ``requires`` and ``mounts``, if any, are the list's needs), or a callable returning
either.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from harnessrl.tasks.base import TASK_FILE_SUFFIXES, ListSuite, TaskSuite
from harnessrl.tasks.files import load_task_suite
from harnessrl.tasks.model import Task
from harnessrl.tasks.needs import check_suite_needs, parse_mounts

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


PYTHON_SUITE_ATTRS: tuple[str, ...] = ("suite", "tasks")
"""The attributes a ``file.py`` suite is read from when no ``:attr`` is given (the first found)."""


def _split_python_target(text: str) -> tuple[str, str] | None:
    """Returns ``(file or module, attr)`` for ``file.py[:attr]`` or ``module:attr``, else None."""
    head, colon, attr = text.rpartition(":") if ":" in text else (text, "", "")
    if head.endswith(".py"):
        return head, attr
    if colon and head and attr and "/" not in head and not head.lower().endswith(TASK_FILE_SUFFIXES):
        return head, attr
    return None


def _load_python_file(path: Path) -> Any:
    """Imports ``path`` as the top-level module named by its stem, its folder first on
    ``sys.path``: the suite's PythonChecks and builders must be importable by that name again
    (in the sandbox and in worker processes)."""
    if not path.is_file():
        raise FileNotFoundError(f"Python suite file {path} does not exist")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
            return loaded
        raise ValueError(
            f"cannot load {path} as module {name!r}: another module of that name is already "
            f"imported ({getattr(loaded, '__file__', None) or 'built in'}); rename the file")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _python_suite(text: str, source: str, attr: str, kwargs: dict[str, Any]) -> TaskSuite:
    """Returns the suite held by ``attr`` of a Python file or module (see the module docstring)."""
    module = _load_python_file(Path(source)) if source.endswith(".py") else importlib.import_module(source)
    if not attr:
        attr = next((name for name in PYTHON_SUITE_ATTRS if hasattr(module, name)), PYTHON_SUITE_ATTRS[0])
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{text}: {source} has no attribute {attr!r}; define `{attr}` (or, for a "
                             f"file, one of {', '.join(PYTHON_SUITE_ATTRS)}) as a TaskSuite, a list "
                             "of Task objects or a function returning either")
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, TaskSuite):
        obj = obj(**kwargs)
    name = Path(source).stem if source.endswith(".py") else source.rpartition(".")[2]
    if isinstance(obj, list | tuple) and all(isinstance(item, Task) for item in obj) and obj:
        # a list's needs are the module's `requires` and `mounts`, when it defines them
        return ListSuite.from_tasks(name, obj, requires=tuple(getattr(module, "requires", ())),
                                    mounts=parse_mounts(getattr(module, "mounts", ())))
    if not isinstance(obj, TaskSuite):
        raise TypeError(f"{text} resolved to {type(obj).__name__}, not a TaskSuite or a "
                        "non-empty list of Task objects")
    if not obj.name:
        obj.name = name
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
    """Returns the suite (see ``find_suite``) after checking that this host can give its
    sandbox what the suite declares it needs (``requires``, ``mounts``; raises
    ``SuiteNeedsError`` naming what is missing)."""
    suite = find_suite(name_or_path, **kwargs)
    check_suite_needs(suite.name, suite.requires, suite.mounts)
    return suite


def find_suite(name_or_path: str | Path, **kwargs: Any) -> TaskSuite:
    """Returns the suite registered under a name, or loaded from a task file or directory.

    A registered entry point may be a ``TaskSuite`` or a callable ``suite(**kwargs)`` returning
    one; ``kwargs`` are passed to that callable. An unknown name raises ``ValueError`` listing
    the available suites.
    """
    python_target = _split_python_target(str(name_or_path))
    if python_target is not None:
        return _python_suite(str(name_or_path), *python_target, kwargs)
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
            f"(or pass a path to a {'/'.join(TASK_FILE_SUFFIXES)} task file or a directory of them, "
            "a Python file `suite.py[:attr]`, or `module:attr`)"
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


def parse_limit(text: str) -> int | None:
    """Returns the ``--limit`` value: None for ``all``, else a count >= 0 (an argparse type)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--limit takes a number of tasks or 'all', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--limit must be >= 0 or 'all', got {value}")
    return value


def parse_task_ids(text: str) -> list[str]:
    """Returns the ids of a comma-separated ``--task-ids`` value, in order, each once."""
    ids = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not ids:
        raise argparse.ArgumentTypeError("--task-ids needs at least one task id (a,b,c)")
    return ids


def tasks_by_id(suite: TaskSuite, task_ids: list[str]) -> list[Task]:
    """Returns the tasks with ``task_ids`` in that order; raises ``ValueError`` naming every
    id the suite does not have."""
    found: list[Task] = []
    missing: list[str] = []
    for task_id in task_ids:
        try:
            found.append(suite.get(task_id))
        except KeyError:
            missing.append(task_id)
    if missing:
        raise ValueError(f"suite {suite.name!r} has no task(s) {', '.join(missing)}; "
                         "`harnessrl tasks list --suite ...` shows the ids")
    return found


def split_size(suite: TaskSuite, split: str) -> int | None:
    """Returns how many tasks ``suite.tasks(split)`` yields without a limit, when the suite can
    tell without generating them all (a list suite, or one with a ``size(split)`` method)."""
    size = getattr(suite, "size", None)
    return int(size(split)) if callable(size) else None


def select_tasks(
    suite_name: str, split: str, limit: int | None, seed: int,
    tiers: list[int] | None = None, families: list[str] | None = None,
    task_ids: list[str] | None = None,
) -> list[Task]:
    """Returns up to ``limit`` tasks of ``split`` in the tiers and families given (None = all),
    in the suite's seeded order; with ``task_ids``, exactly those tasks, in that order."""
    suite = load_suite(suite_name)
    if task_ids:
        return tasks_by_id(suite, task_ids)
    chosen: list[Task] = []
    for task in suite.tasks(split, seed=seed):
        if (tiers is None or task.tier in tiers) and (families is None or task.family in families):
            chosen.append(task)
            if limit is not None and len(chosen) >= limit:
                break
    if not chosen:
        raise ValueError(f"no {split} tasks in suite {suite_name!r} with tiers {tiers} and families {families}")
    return chosen
