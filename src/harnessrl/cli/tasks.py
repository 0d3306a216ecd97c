"""`harnessrl tasks list | show | check`: browse task suites and prove their verifiers."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any

import yaml

from harnessrl.cli.common import command, suite_named
from harnessrl.tasks.base import TaskSuite
from harnessrl.tasks.model import Task
from harnessrl.tasks.suite import (
    available_suites,
    load_suite,
    parse_limit,
    parse_task_ids,
    tasks_by_id,
)

DEFAULT_SUITE = "workspace"
DEFAULT_SPLIT = "test"


def register(subparsers: Any) -> None:
    """Adds the `tasks` sub-command with its `list`, `show` and `check` actions."""
    parser = command(subparsers, "tasks", example="harnessrl tasks check --suite workspace --split test --limit 8",
        help="list, show and check task suites",
        description="Browse task suites and prove each verifier against its gold solution.",
    )
    actions = parser.add_subparsers(dest="tasks_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: _usage(parser))

    suite_help = (
        f"suite name ({', '.join(available_suites())}) or a path to a task file / directory "
        f"(default: {DEFAULT_SUITE})"
    )
    p = command(actions, "list", example="harnessrl tasks list --suite workspace --split test", help="list the tasks of a suite", description="Lists tasks: id, family, tier, split and the first line of the instruction.")
    p.add_argument("--suite", default=DEFAULT_SUITE, help=suite_help)
    p.add_argument("--split", default=None, help="only this split (default: every split)")
    p.add_argument("--limit", type=int, default=None, help="at most N tasks per split (a seeded sample)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.add_argument("--suites", action="store_true", help="list the available suites instead")
    p.set_defaults(func=run_list)

    p = command(actions, "show", example="harnessrl tasks show ws-test-files-1-7", help="show one task in full", description="Shows a task: instruction, setup files, verifier and gold solution.")
    p.add_argument("task_id", metavar="TASK_ID", help="the task's id")
    p.add_argument("--suite", default=DEFAULT_SUITE, help=suite_help)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_show)

    p = command(actions, "check", example="harnessrl tasks check --suite configs/tasks/example.yaml",
        help="prove verifiers: gold passes, doing nothing fails",
        description="For every task: gold actions in a fresh sandbox must pass the verifier, and "
        "an untouched workspace must fail it. Exits 1 naming each offender.",
    )
    p.add_argument("--suite", default=DEFAULT_SUITE, help=suite_help)
    p.add_argument(
        "--split", default=None,
        help=f"split to check (default: {DEFAULT_SPLIT} when the suite has it, else every split)",
    )
    p.add_argument("--limit", type=parse_limit, default=None,
                   help="check a seeded sample of N tasks per split ('all', the default: every task)")
    p.add_argument("--task-ids", type=parse_task_ids, default=None,
                   help="check only these comma-separated task ids (a,b,c)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    p.add_argument("--workers", type=int, default=None, help="parallel tasks (default: CPU count)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_check)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _load(name: str) -> TaskSuite:
    try:
        return suite_named(name, lambda: load_suite(name))
    except ImportError as exc:
        # An optional suite whose dependency is missing: say how to install it.
        raise ValueError(str(exc)) from None


def _splits(suite: TaskSuite, split: str | None, default: str | None) -> list[str]:
    if split is not None:
        suite.check_split(split)
        return [split]
    if default is not None and default in suite.splits():
        return [default]
    return list(suite.splits())


def _first_line(text: str, width: int) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def run_list(args: argparse.Namespace) -> int:
    """Prints the tasks (or, with --suites, the suite names); returns 0."""
    if args.suites:
        names = available_suites()
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    suite = _load(args.suite)
    tasks = [
        t for s in _splits(suite, args.split, None) for t in suite.tasks(s, limit=args.limit, seed=args.seed)
    ]
    if args.json:
        rows = [
            {"id": t.id, "family": t.family, "tier": t.tier, "split": t.split, "tags": list(t.tags),
             "expects_answer": t.expects_answer, "instruction": t.instruction}
            for t in tasks
        ]
        print(json.dumps(rows, indent=2))
        return 0
    header = ("id", "family", "tier", "split")
    table = [(t.id, t.family, str(t.tier), t.split) for t in tasks]
    widths = [max([len(h)] + [len(r[i]) for r in table]) for i, h in enumerate(header)]
    used = sum(widths) + 2 * len(widths)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + "  instruction")
    for row, task in zip(table, tasks, strict=True):
        cells = "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True))
        print(f"{cells}  {_first_line(task.instruction, max(30, 120 - used))}")
    skipped = suite.skipped
    footer = f"{len(tasks)} task(s) in suite {suite.name!r}"
    if skipped:
        footer += f"; {sum(skipped.values())} source task(s) skipped (see `harnessrl tasks check`)"
    print(footer)
    return 0


def _find(suite: TaskSuite, task_id: str) -> Task:
    try:
        return suite.get(task_id)
    except KeyError:
        ids = [t.id for s in suite.splits() for t in suite.tasks(s)]
        close = difflib.get_close_matches(task_id, ids, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `harnessrl tasks list`"
        raise ValueError(f"suite {suite.name!r} has no task {task_id!r}{hint}") from None


def task_view(task: Task) -> dict[str, Any]:
    """Returns a JSON-safe view of a task, including ones that hold code (shown by name)."""
    files: dict[str, str] = {
        path: content if isinstance(content, str) else f"<{len(content)} bytes binary>"
        for path, content in task.setup.files.items()
    }
    setup: dict[str, Any] = {"files": files, "script": task.setup.script}
    if task.setup.builder is not None:
        setup["builder"] = getattr(task.setup.builder, "__qualname__", repr(task.setup.builder))
    return {
        "id": task.id,
        "family": task.family,
        "tier": task.tier,
        "split": task.split,
        "tags": list(task.tags),
        "expects_answer": task.expects_answer,
        "instruction": task.instruction,
        "setup": setup,
        "protected_files": dict(task.protected_files),
        "verifier": task.verifier.to_dict(),
        "gold": [a.to_dict() for a in task.gold],
        "metadata": task.metadata,
    }


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.rstrip("\n").splitlines())


def run_show(args: argparse.Namespace) -> int:
    """Prints one task in full; returns 0."""
    suite = _load(args.suite)
    task = _find(suite, args.task_id)
    view = task_view(task)
    if args.json:
        print(json.dumps(view, indent=2, default=str, ensure_ascii=False))
        return 0
    out = [
        f"id: {task.id}",
        f"family: {task.family}  tier: {task.tier}  split: {task.split}  "
        f"tags: {', '.join(task.tags) or '-'}  expects_answer: {task.expects_answer}",
        "instruction:",
        _indent(task.instruction),
    ]
    if view["setup"]["files"]:
        out.append("setup files:")
        for path, content in view["setup"]["files"].items():
            out.append(f"  {path}:")
            out.append(_indent(content or "<empty>", "    "))
    if task.setup.builder is not None:
        out.append(f"setup builder: {view['setup']['builder']}")
    if task.setup.script:
        out += ["setup script:", _indent(task.setup.script)]
    if task.protected_files:
        out.append("protected files: " + ", ".join(task.protected_files))
    out += ["verifier:", _indent(yaml.safe_dump(view["verifier"], sort_keys=False, width=100))]
    out.append("gold:")
    for i, action in enumerate(task.gold, start=1):
        fields = action.to_dict()
        kind = fields.pop("kind")
        out.append(f"  {i}. {kind}")
        for name, value in fields.items():
            text = str(value)
            out.append(f"     {name}: {text}" if "\n" not in text else f"     {name}:\n{_indent(text, '       ')}")
    print("\n".join(out))
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Checks a suite split; prints offenders and totals; returns 1 on any offender."""
    from harnessrl.tasks.check import CheckReport, check_tasks

    suite = _load(args.suite)
    splits = _splits(suite, args.split, DEFAULT_SPLIT)
    if args.task_ids:
        tasks = tasks_by_id(suite, args.task_ids)
    else:
        tasks = [t for s in splits for t in suite.tasks(s, limit=args.limit, seed=args.seed)]
    progress = False if args.quiet or args.json else None
    results = check_tasks(tasks, workers=args.workers, progress=progress)
    skipped: dict[str, int] = {}
    for split in splits:
        for reason, count in suite.skipped_in(split).items():
            skipped[reason] = skipped.get(reason, 0) + count
    report = CheckReport(suite=suite.name, split="+".join(splits), results=results, skipped=skipped)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
    if report.checked == 0:
        print("nothing was checked", file=sys.stderr)
        return 1
    return 0 if report.ok else 1
