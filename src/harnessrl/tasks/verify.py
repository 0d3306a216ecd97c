"""Verifiers: declarative, composable checks that decide whether a task was solved.

Every check reads the workspace through the sandbox's confined file API, and every check
that runs code (a command, a sqlite query, a test file) runs it inside the sandbox.
Checks serialise to and from plain dicts (``{"kind": ..., ...}``) for task files.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.sandbox import SandboxMount
from harnessrl.tasks.python_check import (
    call_with_timeout,
    import_name,
    mount_for,
    roots_for,
    runner_command,
    runner_detail,
    warn_host_check,
)
from harnessrl.tasks.runner import isolated_python, run_tests_command

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox


@dataclass(frozen=True)
class CheckContext:
    """What a check may look at: the episode's sandbox and the answer the agent submitted."""

    sandbox: Sandbox
    answer: str | None = None

    @property
    def workspace(self) -> Path:
        """Returns the workspace's host directory (what a sandboxed check sees as its cwd)."""
        return Path(self.sandbox.workspace.root)


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome with a human-readable reason."""

    passed: bool
    name: str
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    """A verifier's final outcome: pass/fail, reward in [0, 1], and every leaf check's result."""

    passed: bool
    results: tuple[CheckResult, ...] = ()

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0

    def explain(self) -> str:
        """Returns one line per leaf check, marked PASS or FAIL."""
        return "\n".join(
            f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.detail}" for r in self.results
        )


_REGISTRY: dict[str, type[Check]] = {}


class Check(ABC):
    """Base class of all checks. Subclasses are frozen dataclasses with a unique ``kind``."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _REGISTRY[cls.kind] = cls

    @abstractmethod
    def run(self, ctx: CheckContext) -> list[CheckResult]:
        """Returns the leaf results of this check."""

    def verdict(self, ctx: CheckContext) -> Verdict:
        """Returns the verdict: a leaf check passes when all its results pass."""
        results = self.run(ctx)
        return Verdict(passed=all(r.passed for r in results), results=tuple(results))

    def to_dict(self) -> dict[str, Any]:
        """Returns the check as a plain dict, ``kind`` first."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Check):
                value = value.to_dict()
            elif isinstance(value, tuple) and value and isinstance(value[0], Check):
                value = [c.to_dict() for c in value]
            elif isinstance(value, tuple):
                value = _untuple(value)
            out[f.name] = value
        return out


def _untuple(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_untuple(v) for v in value]
    return value


def _tuplify(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_tuplify(v) for v in value)
    return value


def known_check_kinds() -> list[str]:
    """Returns the kinds a task file may use in a verifier (callables are code-only)."""
    return sorted(k for k, cls in _REGISTRY.items() if cls is not PythonCheck)


def check_from_dict(data: Mapping[str, Any], where: str = "verifier") -> Check:
    """Builds a check from a dict; raises ``ValueError`` naming the field and the fix."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping with a 'kind', got {type(data).__name__}")
    kind = data.get("kind")
    if kind not in _REGISTRY or kind == PythonCheck.kind:
        raise ValueError(
            f"{where}.kind: unknown check kind {kind!r}; use one of {', '.join(known_check_kinds())}"
        )
    cls = _REGISTRY[kind]
    names = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - set(names) - {"kind"}
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))} for check {kind!r}; "
            f"allowed: {', '.join(names)}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name == "kind":
            continue
        if name == "checks":
            if not isinstance(value, list) or not value:
                raise ValueError(f"{where}.checks: expected a non-empty list of checks")
            value = tuple(
                check_from_dict(item, f"{where}.checks[{i}]") for i, item in enumerate(value)
            )
        elif name == "check":
            value = check_from_dict(value, f"{where}.check")
        else:
            value = _tuplify(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: check {kind!r}: {exc}") from None


def evaluate(check: Check, ctx: CheckContext) -> Verdict:
    """Runs ``check`` and returns the verdict; a crashing check is a failed check, not a crash."""
    try:
        return check.verdict(ctx)
    except Exception as exc:  # a verifier error must never take down a rollout
        detail = f"verifier error: {type(exc).__name__}: {exc}"
        return Verdict(passed=False, results=(CheckResult(False, check.kind, detail),))


def _read(ctx: CheckContext, path: str) -> str | None:
    try:
        if not ctx.sandbox.exists(path):
            return None
        return ctx.sandbox.read_file(path)
    except Exception:
        return None


# --- file checks -------------------------------------------------------------------------


@dataclass(frozen=True)
class FileExists(Check):
    """The path exists (file or directory)."""

    kind: ClassVar[str] = "file_exists"
    path: str

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        ok = ctx.sandbox.exists(self.path)
        return [CheckResult(ok, f"file_exists({self.path})", "present" if ok else "missing")]


@dataclass(frozen=True)
class FileAbsent(Check):
    """The path does not exist."""

    kind: ClassVar[str] = "file_absent"
    path: str

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        ok = not ctx.sandbox.exists(self.path)
        return [CheckResult(ok, f"file_absent({self.path})", "absent" if ok else "still present")]


def _normalise_text(text: str, strip: bool) -> str:
    if not strip:
        return text
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@dataclass(frozen=True)
class FileEquals(Check):
    """The file's text equals ``content`` (trailing whitespace per line ignored when ``strip``)."""

    kind: ClassVar[str] = "file_equals"
    path: str
    content: str
    strip: bool = True

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        text = _read(ctx, self.path)
        name = f"file_equals({self.path})"
        if text is None:
            return [CheckResult(False, name, "missing")]
        ok = _normalise_text(text, self.strip) == _normalise_text(self.content, self.strip)
        return [CheckResult(ok, name, "equal" if ok else f"differs; got {text[:200]!r}")]


@dataclass(frozen=True)
class FileContains(Check):
    """The file's text contains ``text`` (or, with ``negate``, does not)."""

    kind: ClassVar[str] = "file_contains"
    path: str
    text: str
    negate: bool = False

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        body = _read(ctx, self.path)
        name = f"file_contains({self.path}, {self.text!r}{', negate' if self.negate else ''})"
        if body is None:
            return [CheckResult(False, name, "missing")]
        ok = (self.text in body) != self.negate
        return [CheckResult(ok, name, "ok" if ok else "not satisfied")]


@dataclass(frozen=True)
class FileMatches(Check):
    """The file's text matches the regular expression ``pattern`` (``re.search``, MULTILINE)."""

    kind: ClassVar[str] = "file_matches"
    path: str
    pattern: str

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"pattern {self.pattern!r} is not a valid regex: {exc}") from None

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        body = _read(ctx, self.path)
        name = f"file_matches({self.path}, /{self.pattern}/)"
        if body is None:
            return [CheckResult(False, name, "missing")]
        ok = re.search(self.pattern, body, re.MULTILINE) is not None
        return [CheckResult(ok, name, "matched" if ok else "no match")]


def _lookup(document: Any, dotted: str) -> Any:
    current = document
    for part in dotted.split(".") if dotted else []:
        if isinstance(current, list):
            current = current[int(part)]
        elif isinstance(current, dict):
            current = current[part]
        else:
            raise KeyError(part)
    return current


def _values_equal(actual: Any, expected: Any, tolerance: float) -> bool:
    if isinstance(expected, tuple):
        expected = list(_untuple(expected))
    if isinstance(actual, bool) or isinstance(expected, bool):
        return actual == expected
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        return abs(float(actual) - float(expected)) <= tolerance
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            _values_equal(a, e, tolerance) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, dict) and isinstance(expected, dict):
        return set(actual) == set(expected) and all(
            _values_equal(actual[k], expected[k], tolerance) for k in expected
        )
    return actual == expected


@dataclass(frozen=True)
class JsonField(Check):
    """A JSON file's value at a dotted path (``a.b.0``; empty for the root) equals ``value``."""

    kind: ClassVar[str] = "json_field"
    path: str
    field: str
    value: Any
    tolerance: float = 1e-6

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"json_field({self.path}, {self.field or '<root>'})"
        body = _read(ctx, self.path)
        if body is None:
            return [CheckResult(False, name, "missing")]
        try:
            actual = _lookup(json.loads(body), self.field)
        except (json.JSONDecodeError, KeyError, IndexError, ValueError) as exc:
            return [CheckResult(False, name, f"unreadable: {type(exc).__name__}: {exc}")]
        ok = _values_equal(actual, self.value, self.tolerance)
        return [CheckResult(ok, name, "equal" if ok else f"got {actual!r}")]


# --- checks that run code in the sandbox ---------------------------------------------------


_SQLITE_SCRIPT = (
    "import json, sqlite3, sys\n"
    "con = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\n"
    "print(json.dumps([list(r) for r in con.execute(sys.argv[2]).fetchall()]))\n"
)


@dataclass(frozen=True)
class SqliteQuery(Check):
    """A read-only query on a sqlite database in the workspace returns ``expected`` rows.

    Rows compare in order unless ``ordered`` is false; numbers compare within ``tolerance``.
    """

    kind: ClassVar[str] = "sqlite_query"
    db: str
    query: str
    expected: Any
    ordered: bool = True
    tolerance: float = 1e-6

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"sqlite_query({self.db}, {self.query!r})"
        if not ctx.sandbox.exists(self.db):
            return [CheckResult(False, name, "database missing")]
        result = ctx.sandbox.exec(isolated_python(_SQLITE_SCRIPT, self.db, self.query))
        if not result.ok:
            return [CheckResult(False, name, f"query failed: {result.stderr.strip()[-300:]}")]
        try:
            rows = json.loads(result.stdout)
        except json.JSONDecodeError:
            return [CheckResult(False, name, f"unreadable output {result.stdout[:200]!r}")]
        expected = [list(row) for row in _untuple(self.expected)]
        if not self.ordered:
            rows, expected = sorted(rows, key=repr), sorted(expected, key=repr)
        ok = _values_equal(rows, expected, self.tolerance)
        return [CheckResult(ok, name, "rows match" if ok else f"got {rows[:10]!r}")]


@dataclass(frozen=True)
class CommandExit(Check):
    """A shell command run in the sandbox exits with ``code`` (and prints ``stdout`` if given)."""

    kind: ClassVar[str] = "command_exit"
    command: str
    code: int = 0
    stdout: str | None = None
    timeout_s: float = 30.0

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        result = ctx.sandbox.exec(self.command, timeout=self.timeout_s)
        name = f"command_exit({self.command!r})"
        ok = result.exit_code == self.code and not result.timed_out
        if ok and self.stdout is not None:
            ok = result.stdout.strip() == self.stdout.strip()
        detail = f"exit {result.exit_code}" + (" (timed out)" if result.timed_out else "")
        if not ok:
            detail += f"; {(result.stderr or result.stdout).strip()[-300:]!r}"
        return [CheckResult(ok, name, detail)]


@dataclass(frozen=True)
class PytestPasses(Check):
    """The test file passes under pytest in the sandbox (a built-in runner when pytest is absent),
    run by an isolated interpreter that loads nothing of the workspace but the code under test
    (`harnessrl.tasks.runner`)."""

    kind: ClassVar[str] = "pytest_passes"
    test_path: str
    timeout_s: float = 60.0

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"pytest_passes({self.test_path})"
        if not ctx.sandbox.exists(self.test_path):
            return [CheckResult(False, name, "test file missing")]
        root = str(getattr(ctx.sandbox, "inside_root", "."))
        result = ctx.sandbox.exec(run_tests_command(root, self.test_path), timeout=self.timeout_s)
        ok = result.ok
        return [CheckResult(ok, name, "passed" if ok else (result.stdout + result.stderr)[-400:])]


# --- answer checks -------------------------------------------------------------------------


def _parse_number(text: str) -> float | None:
    match = re.search(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text.replace(",", ""))
    return float(match.group()) if match else None


@dataclass(frozen=True)
class AnswerEquals(Check):
    """The submitted answer equals ``expected``.

    ``mode``: ``exact`` (after strip), ``casefold`` (case and surrounding whitespace ignored),
    ``number`` (first number in the answer within ``tolerance``), ``lines`` (same set of
    non-empty lines, order ignored), ``contains`` (expected occurs in the answer).
    """

    kind: ClassVar[str] = "answer_equals"
    expected: str
    mode: str = "casefold"
    tolerance: float = 1e-6

    MODES: ClassVar[tuple[str, ...]] = ("exact", "casefold", "number", "lines", "contains")

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(self.MODES)}")

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"answer_equals({self.expected!r}, {self.mode})"
        if ctx.answer is None:
            return [CheckResult(False, name, "no answer submitted")]
        got, want = ctx.answer.strip(), str(self.expected).strip()
        if self.mode == "exact":
            ok = got == want
        elif self.mode == "casefold":
            ok = " ".join(got.casefold().split()) == " ".join(want.casefold().split())
        elif self.mode == "number":
            number, target = _parse_number(got), _parse_number(want)
            ok = number is not None and target is not None and abs(number - target) <= self.tolerance
        elif self.mode == "lines":
            ok = {line.strip() for line in got.splitlines() if line.strip()} == {
                line.strip() for line in want.splitlines() if line.strip()
            }
        else:
            ok = want.casefold() in got.casefold()
        return [CheckResult(ok, name, "match" if ok else f"got {got[:200]!r}")]


# --- composition -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AllOf(Check):
    """Passes when every child check passes."""

    kind: ClassVar[str] = "all"
    checks: tuple[Check, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.checks:
            raise ValueError("'all' needs at least one check")

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        return list(self.verdict(ctx).results)

    def verdict(self, ctx: CheckContext) -> Verdict:
        verdicts = [evaluate(c, ctx) for c in self.checks]
        results = tuple(r for v in verdicts for r in v.results)
        return Verdict(passed=all(v.passed for v in verdicts), results=results)


@dataclass(frozen=True)
class AnyOf(Check):
    """Passes when at least one child check passes."""

    kind: ClassVar[str] = "any"
    checks: tuple[Check, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.checks:
            raise ValueError("'any' needs at least one check")

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        return list(self.verdict(ctx).results)

    def verdict(self, ctx: CheckContext) -> Verdict:
        verdicts = [evaluate(c, ctx) for c in self.checks]
        results = tuple(r for v in verdicts for r in v.results)
        return Verdict(passed=any(v.passed for v in verdicts), results=results)


@dataclass(frozen=True)
class Not(Check):
    """Passes when the child check fails."""

    kind: ClassVar[str] = "not"
    check: Check

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        verdict = evaluate(self.check, ctx)
        return [CheckResult(not verdict.passed, f"not({self.check.kind})", verdict.explain()[:300])]


@dataclass(frozen=True)
class PythonCheck(Check):
    """A Python callable ``fn(ctx) -> bool | CheckResult`` (suites written in code only).

    By default it runs INSIDE the episode's sandbox: ``fn`` must be importable by name (a
    module-level function); its module's folder is mounted read-only, the sandbox's
    ``python3`` imports it there and calls it with a context whose ``workspace`` is the
    workspace as a `Path` inside, ``answer`` the submitted answer and ``sandbox`` None; what it
    starts (``python hello.py``, ``pytest``) is sandboxed too. Its exit decides the result.
    ``on_host=True`` runs ``fn`` in this process instead, with the full `CheckContext`: it then
    runs as the trainer's user, outside the sandbox, and the run says so once with a warning.
    Either way ``timeout_s`` bounds it: past it the check fails (a host call is left running
    in a daemon thread; Python cannot stop it, but the verdict no longer waits).
    """

    kind: ClassVar[str] = "python"
    fn: Callable[[CheckContext], bool | CheckResult]
    name: str = "python"
    on_host: bool = False
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.on_host and import_name(self.fn) is None:
            raise ValueError(
                f"PythonCheck {self.name!r}: {self.fn!r} cannot be imported by name, so it cannot"
                " run inside the sandbox; make it a module-level function, or pass on_host=True"
                " to run it on the host (outside the sandbox, as the trainer's user)")

    def mounts(self) -> tuple[SandboxMount, ...]:
        """Returns the read-only mounts its sandboxed run needs (none on the host)."""
        found = None if self.on_host else import_name(self.fn)
        return () if found is None else tuple(mount_for(root) for root in roots_for(found[0]))

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        if self.on_host:
            warn_host_check(self.name, self.fn)
            finished, out = call_with_timeout(self.fn, ctx, self.timeout_s)
            if not finished:
                return [CheckResult(False, self.name, f"timed out after {self.timeout_s} s (on the host)")]
            if isinstance(out, CheckResult):
                return [out]
            return [CheckResult(bool(out), self.name, "ok" if out else "returned false")]
        module, qualname = import_name(self.fn) or ("", "")
        result = ctx.sandbox.exec(runner_command(module, qualname, ctx.answer), timeout=self.timeout_s)
        passed = result.exit_code == 0 and not result.timed_out
        detail = runner_detail(result.stdout)
        if result.timed_out:
            detail = f"timed out after {self.timeout_s} s"
        elif detail is None or result.exit_code == 3:
            detail = (detail or f"exit {result.exit_code}") + f"; {(result.stderr or result.stdout).strip()[-300:]!r}"
        return [CheckResult(passed, self.name, detail)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "fn": getattr(self.fn, "__qualname__", "?"),
                "on_host": self.on_host}
