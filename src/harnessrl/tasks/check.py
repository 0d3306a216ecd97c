"""Proves task verifiers against gold solutions: gold passes, doing nothing fails.

For each task, in a fresh sandbox: lay out the workspace, apply the gold actions, verify
(must pass); in another fresh sandbox: lay out the workspace, do nothing, verify with no
answer (must fail). A task whose setup or gold crashes is an offender with the error, never
a crash of the check. Tasks run in a thread pool: each has its own sandboxes and the work is
waiting on subprocesses.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harnessrl.progress import Progress
from harnessrl.tasks.model import Task, apply_action, prepare_workspace, verify_task

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.base import TaskSuite

SandboxFactory = Callable[[], "Sandbox"]


def default_sandbox_factory(**options: Any) -> SandboxFactory:
    """Returns a factory opening a fresh sandbox (own workspace) with ``open_sandbox(**options)``."""
    from harnessrl.sandbox import open_sandbox

    def factory() -> Sandbox:
        return open_sandbox(**options)

    return factory


@dataclass
class TaskCheck:
    """One task's check: did gold pass, did doing nothing fail, and what went wrong."""

    id: str
    gold_passed: bool = False
    noop_failed: bool = False
    error: str = ""
    duration_s: float = 0.0
    gold_detail: str = ""
    noop_detail: str = ""

    @property
    def ok(self) -> bool:
        """True when the verifier is proven: gold passes, doing nothing fails, no error."""
        return self.gold_passed and self.noop_failed and not self.error

    @property
    def problem(self) -> str:
        """Returns what is wrong in one line ("" when ok): error, gold failed, or noop passed."""
        if self.error:
            return f"error: {_one_line(self.error)}"
        problems = []
        if not self.gold_passed:
            problems.append(f"gold failed: {_one_line(self.gold_detail) or 'verifier rejected the gold solution'}")
        if not self.noop_failed:
            problems.append(
                f"noop passed: {_one_line(self.noop_detail) or 'verifier accepts an untouched workspace'}"
            )
        return "; ".join(problems)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass
class CheckReport:
    """The outcome of checking a suite split: per-task results and what was skipped, and why."""

    suite: str
    split: str
    results: list[TaskCheck] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def checked(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def offenders(self) -> list[TaskCheck]:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> bool:
        """True when at least one task was checked and none offends."""
        return self.checked > 0 and not self.offenders

    def to_dict(self) -> dict[str, Any]:
        """Returns ``{suite, split, checked, passed, offenders: [{id, problem}], skipped}``."""
        return {
            "suite": self.suite,
            "split": self.split,
            "checked": self.checked,
            "passed": self.passed,
            "offenders": [{"id": r.id, "problem": r.problem} for r in self.offenders],
            "skipped": dict(self.skipped),
        }

    def summary(self) -> str:
        """Returns a human-readable report: one line per offender, then the totals."""
        lines = [f"OFFENDER {r.id}: {r.problem}" for r in self.offenders]
        lines.append(
            f"suite {self.suite!r} split {self.split!r}: checked {self.checked}, "
            f"passed {self.passed}, offenders {len(self.offenders)}"
        )
        if self.skipped:
            total = sum(self.skipped.values())
            lines.append(f"skipped {total}:")
            lines += [f"  {count:4d}  {reason}" for reason, count in sorted(self.skipped.items())]
        return "\n".join(lines)


def _close(sandbox: Any) -> None:
    with contextlib.suppress(Exception):
        sandbox.close()


def _run_gold(task: Task, sandbox: Sandbox) -> tuple[bool, str]:
    prepare_workspace(task, sandbox)
    answer: str | None = None
    for index, action in enumerate(task.gold):
        try:
            submitted = apply_action(action, sandbox)
        except Exception as exc:
            return False, f"gold action {index} ({action.kind}) raised {type(exc).__name__}: {exc}"
        if submitted is not None:
            answer = submitted
    verdict = verify_task(task, sandbox, answer)
    if verdict.passed:
        return True, ""
    failing = [r for r in verdict.results if not r.passed] or list(verdict.results)
    return False, "\n".join(f"FAIL {r.name}: {r.detail}" for r in failing)


def _run_noop(task: Task, sandbox: Sandbox) -> tuple[bool, str]:
    prepare_workspace(task, sandbox)
    verdict = verify_task(task, sandbox, None)
    return not verdict.passed, verdict.explain() if verdict.passed else ""


def check_task(task: Task, sandbox_factory: SandboxFactory | None = None) -> TaskCheck:
    """Returns the check of one task: gold in one fresh sandbox, nothing in another."""
    factory = sandbox_factory or default_sandbox_factory()
    result = TaskCheck(id=task.id)
    start = time.perf_counter()
    stage = "gold"
    try:
        sandbox = factory()
        try:
            result.gold_passed, result.gold_detail = _run_gold(task, sandbox)
        finally:
            _close(sandbox)
        stage = "noop"
        sandbox = factory()
        try:
            result.noop_failed, result.noop_detail = _run_noop(task, sandbox)
        finally:
            _close(sandbox)
    except Exception as exc:  # setup and sandbox errors make an offender, not a crash
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result.error = (
            f"{stage} run: {type(exc).__name__}: {exc} "
            f"({os.path.basename(where.filename)}:{where.lineno})"
        )
    result.duration_s = time.perf_counter() - start
    return result


def check_tasks(
    tasks: Iterable[Task],
    workers: int | None = None,
    progress: bool | None = None,
    sandbox_factory: SandboxFactory | None = None,
) -> list[TaskCheck]:
    """Checks tasks in a thread pool; returns their results in input order.

    ``workers`` defaults to the number of CPUs; ``progress`` (``harnessrl.progress``: a bar on
    a terminal, timestamped lines otherwise, on stderr) is on unless it is False.
    """
    task_list: Sequence[Task] = list(tasks)
    factory = sandbox_factory or default_sandbox_factory()
    workers = max(1, workers or os.cpu_count() or 1)
    show = progress is not False
    results: list[TaskCheck | None] = [None] * len(task_list)
    with (
        Progress(len(task_list), "check", "task", enabled=show) as bar,
        ThreadPoolExecutor(max_workers=workers) as pool,
    ):
        futures = {pool.submit(check_task, task, factory): i for i, task in enumerate(task_list)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            bar.update(1)
    return [r for r in results if r is not None]


def check_suite(
    suite: TaskSuite,
    split: str,
    limit: int | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    seed: int = 0,
    sandbox_factory: SandboxFactory | None = None,
) -> CheckReport:
    """Checks a split of a suite; the report carries the suite's own skip counts."""
    suite.check_split(split)
    tasks = list(suite.tasks(split, limit=limit, seed=seed))
    results = check_tasks(tasks, workers=workers, progress=progress, sandbox_factory=sandbox_factory)
    return CheckReport(suite=suite.name, split=split, results=results, skipped=suite.skipped_in(split))
