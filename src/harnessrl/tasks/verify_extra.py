"""More verifiers: a file's kind and bytes (symlinks, the executable bit, binary equality) and
an answer compared with what a command prints (stdout, stderr, or both together).

Like every check they look at the workspace from inside the sandbox (a small ``python3``
program that reads ``lstat``), round-trip to dicts, and compose with ``all`` / ``any`` / ``not``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import ClassVar

from harnessrl.tasks.runner import isolated_python
from harnessrl.tasks.verify import AnswerEquals, Check, CheckContext, CheckResult

# Prints what lstat says about one path as JSON (null when it does not exist).
_LSTAT_SCRIPT = (
    "import json, os, stat, sys\n"
    "p = sys.argv[1]\n"
    "try:\n"
    "    s = os.lstat(p)\n"
    "except OSError:\n"
    "    print('null'); raise SystemExit\n"
    "link = stat.S_ISLNK(s.st_mode)\n"
    "print(json.dumps({'link': link, 'target': os.readlink(p) if link else None,\n"
    "                  'file': stat.S_ISREG(s.st_mode), 'mode': stat.S_IMODE(s.st_mode)}))\n"
)


def _lstat(ctx: CheckContext, path: str) -> dict[str, object] | str | None:
    """Returns the lstat facts of ``path`` in the sandbox, None when absent, or an error text."""
    result = ctx.sandbox.exec(isolated_python(_LSTAT_SCRIPT, path))
    if not result.ok:
        return f"lstat failed: {(result.stderr or result.stdout).strip()[-200:]}"
    facts = json.loads(result.stdout)
    return facts if isinstance(facts, dict) else None


@dataclass(frozen=True)
class IsSymlink(Check):
    """``path`` is a symbolic link (pointing at ``target`` exactly, when given)."""

    kind: ClassVar[str] = "is_symlink"
    path: str
    target: str | None = None

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"is_symlink({self.path}{', ' + self.target if self.target else ''})"
        facts = _lstat(ctx, self.path)
        if not isinstance(facts, dict):
            return [CheckResult(False, name, facts or "missing")]
        if not facts["link"]:
            return [CheckResult(False, name, "not a symlink")]
        ok = self.target is None or facts["target"] == self.target
        return [CheckResult(ok, name, f"points to {facts['target']!r}")]


@dataclass(frozen=True)
class IsExecutable(Check):
    """``path`` is a regular file whose owner-executable bit is set (or, with
    ``executable=False``, not set); a symlink is never followed."""

    kind: ClassVar[str] = "is_executable"
    path: str
    executable: bool = True

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"is_executable({self.path}{'' if self.executable else ', false'})"
        facts = _lstat(ctx, self.path)
        if not isinstance(facts, dict):
            return [CheckResult(False, name, facts or "missing")]
        if not facts["file"]:
            return [CheckResult(False, name, "not a regular file")]
        mode = int(str(facts["mode"]))
        ok = bool(mode & 0o100) == self.executable
        return [CheckResult(ok, name, f"mode {mode:o}")]


@dataclass(frozen=True)
class BytesEqual(Check):
    """The file's bytes have the SHA-256 ``sha256`` (``BytesEqual.of(path, data)`` computes it),
    so a task file can pin a binary file without holding it."""

    kind: ClassVar[str] = "bytes_equal"
    path: str
    sha256: str

    def __post_init__(self) -> None:
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"sha256 {self.sha256!r} is not 64 lowercase hex digits")

    @classmethod
    def of(cls, path: str, data: bytes) -> BytesEqual:
        """Returns the check that ``path`` holds exactly ``data``."""
        return cls(path, hashlib.sha256(data).hexdigest())

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"bytes_equal({self.path})"
        try:
            data = ctx.sandbox.read_bytes(self.path) if ctx.sandbox.exists(self.path) else None
        except Exception as exc:  # a directory, a fifo, a link out of the workspace
            return [CheckResult(False, name, f"unreadable: {exc}")]
        if data is None:
            return [CheckResult(False, name, "missing")]
        digest = hashlib.sha256(data).hexdigest()
        ok = digest == self.sha256
        return [CheckResult(ok, name, "equal" if ok else f"differs ({len(data)} bytes, sha256 {digest[:12]}...)")]


@dataclass(frozen=True)
class AnswerMatchesOutput(Check):
    """The submitted answer equals what ``command`` prints in the sandbox at verification
    time: its ``stdout``, its ``stderr``, or ``both`` (stdout, then stderr, joined by a newline
    when both are non-empty), compared like ``answer_equals`` with ``mode``.

    For suites whose gold answer is "the output of this command" (errors included).
    """

    kind: ClassVar[str] = "answer_matches_output"
    command: str
    streams: str = "stdout"
    mode: str = "exact"
    timeout_s: float = 30.0

    STREAMS: ClassVar[tuple[str, ...]] = ("stdout", "stderr", "both")

    def __post_init__(self) -> None:
        if self.streams not in self.STREAMS:
            raise ValueError(f"streams {self.streams!r} is not one of {', '.join(self.STREAMS)}")
        AnswerEquals("", mode=self.mode)  # the same modes, the same error

    def run(self, ctx: CheckContext) -> list[CheckResult]:
        name = f"answer_matches_output({self.command!r}, {self.streams}, {self.mode})"
        result = ctx.sandbox.exec(self.command, timeout=self.timeout_s)
        if result.timed_out:
            return [CheckResult(False, name, f"the command timed out after {self.timeout_s} s")]
        parts = {"stdout": [result.stdout], "stderr": [result.stderr],
                 "both": [result.stdout, result.stderr]}[self.streams]
        expected = "\n".join(part.rstrip("\n") for part in parts if part.strip())
        compared = AnswerEquals(expected, mode=self.mode).run(ctx)[0]
        return [CheckResult(compared.passed, name, compared.detail)]
