"""The task model: what an agent is asked to do, how its workspace starts, how success is decided."""

from __future__ import annotations

import base64
import os
import shlex
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from harnessrl.sandbox import SandboxError, SandboxMount
from harnessrl.tasks.verify import (
    Check,
    CheckContext,
    CheckResult,
    PythonCheck,
    Verdict,
    evaluate,
)

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox

ActionKind = Literal["write_file", "edit_file", "delete_file", "run", "submit"]
ACTION_KINDS: tuple[str, ...] = ("write_file", "edit_file", "delete_file", "run", "submit")
ACTION_FIELDS: tuple[str, ...] = ("path", "content", "old", "new", "command", "answer")


@dataclass(frozen=True)
class Action:
    """One abstract step of a gold solution, replayable through any harness's tool interface.

    ``write_file`` needs ``path`` and ``content`` (text, or bytes for a binary file);
    ``edit_file`` needs ``path``, ``old`` and ``new`` (exactly one occurrence of ``old`` is
    replaced); ``delete_file`` needs ``path``; ``run`` needs ``command``; ``submit`` needs
    ``answer`` (may be empty when the task only checks the workspace). A tool interface
    without a native form of an action (a delete, a binary write) replays ``as_shell()``.
    In dicts, binary content is ``content_b64`` (base64).
    """

    kind: ActionKind
    path: str | None = None
    content: str | bytes | None = None
    old: str | None = None
    new: str | None = None
    command: str | None = None
    answer: str | None = None

    def __post_init__(self) -> None:
        required = {
            "write_file": ("path", "content"),
            "edit_file": ("path", "old", "new"),
            "delete_file": ("path",),
            "run": ("command",),
            "submit": (),
        }
        if self.kind not in required:
            raise ValueError(f"unknown action kind {self.kind!r}; expected one of {ACTION_KINDS}")
        missing = [name for name in required[self.kind] if getattr(self, name) is None]
        if missing:
            raise ValueError(f"action {self.kind!r} needs field(s) {', '.join(missing)}")

    @classmethod
    def write(cls, path: str, content: str) -> Action:
        return cls("write_file", path=path, content=content)

    @classmethod
    def edit(cls, path: str, old: str, new: str) -> Action:
        return cls("edit_file", path=path, old=old, new=new)

    @classmethod
    def delete(cls, path: str) -> Action:
        return cls("delete_file", path=path)

    @classmethod
    def run(cls, command: str) -> Action:
        return cls("run", command=command)

    @classmethod
    def submit(cls, answer: str = "") -> Action:
        return cls("submit", answer=answer)

    def to_dict(self) -> dict[str, Any]:
        """Returns the action as a plain dict without unset fields."""
        out: dict[str, Any] = {"kind": self.kind}
        for name in ACTION_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bytes):
                out["content_b64"] = base64.b64encode(value).decode("ascii")
            elif value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Action:
        """Returns the action of a dict written by ``to_dict`` (``content_b64``: binary content)."""
        unknown = set(data) - {"kind", *ACTION_FIELDS, "content_b64"}
        if unknown:
            raise ValueError(f"unknown action field(s): {', '.join(sorted(unknown))}")
        if "kind" not in data:
            raise ValueError(f"action needs 'kind' (one of {', '.join(ACTION_KINDS)})")
        fields_given = dict(data)
        if "content_b64" in fields_given:
            if "content" in fields_given:
                raise ValueError("action has both 'content' and 'content_b64'; keep one")
            try:
                fields_given["content"] = base64.b64decode(str(fields_given.pop("content_b64")), validate=True)
            except ValueError as exc:
                raise ValueError(f"content_b64 is not valid base64 ({exc})") from None
        return cls(**fields_given)

    @property
    def needs_shell(self) -> bool:
        """True when tool interfaces replay this action as ``as_shell()`` (a delete or a binary
        write, which no file-editing tool expresses)."""
        return self.kind == "delete_file" or isinstance(self.content, bytes)

    def as_shell(self) -> str:
        """Returns a shell command with the same effect (used by shell-only harnesses)."""
        if self.kind == "run":
            return str(self.command)
        if self.kind == "delete_file":
            return f"rm -f -- {shlex.quote(str(self.path))}"
        if self.kind == "write_file" and isinstance(self.content, bytes):
            # base64 in a heredoc: ASCII lines no fence closes, no argument-length limit
            encoded = base64.encodebytes(self.content).decode("ascii")
            program = ("import base64, os, sys; p = sys.argv[1]; os.makedirs(os.path.dirname(p) or '.', "
                       "exist_ok=True); open(p, 'wb').write(base64.b64decode(sys.stdin.read()))")
            return (f"python3 -c {shlex.quote(program)} {shlex.quote(str(self.path))} "
                    f"<<'HARNESSRL_B64'\n{encoded}HARNESSRL_B64")
        if self.kind == "write_file":
            path = shlex.quote(str(self.path))
            parent = shlex.quote(str(Path(str(self.path)).parent))
            body = str(self.content)
            marker = "HARNESSRL_EOF"
            while marker in body:
                marker += "_"
            nl = "" if body.endswith("\n") or body == "" else "\n"
            if nl:
                # A heredoc always ends with a newline; strip it again with python when needed.
                return (
                    f"mkdir -p {parent} && python3 -c 'import sys; "
                    f"open(sys.argv[1], \"w\").write(sys.argv[2])' {path} {shlex.quote(body)}"
                )
            return f"mkdir -p {parent} && cat > {path} <<'{marker}'\n{body}{marker}"
        if self.kind == "edit_file":
            script = (
                "import sys; p, o, n = sys.argv[1:4]; s = open(p).read(); "
                "c = s.count(o); assert c == 1, f'{c} occurrences'; open(p, 'w').write(s.replace(o, n))"
            )
            return (
                f"python3 -c {shlex.quote(script)} {shlex.quote(str(self.path))} "
                f"{shlex.quote(str(self.old))} {shlex.quote(str(self.new))}"
            )
        return "true"


SetupBuilder = Callable[[Path], None]


@dataclass
class TaskSetup:
    """How a task's workspace starts.

    ``files`` maps workspace-relative paths to text or bytes; ``builder`` is trusted suite code
    (not model output) called with the workspace's host path to lay binary fixtures such as
    sqlite databases; ``script`` is a shell script run inside the sandbox after both.
    A builder must be a module-level function (or ``functools.partial`` of one) so that task
    checks can run in worker processes.
    """

    files: dict[str, str | bytes] = field(default_factory=dict)
    script: str | None = None
    builder: SetupBuilder | None = None


@dataclass
class Task:
    """One task: instruction, starting workspace, verifier and gold solution.

    ``protected_files`` are laid into the workspace after the episode and before the
    verifier runs (tests the agent must not edit), so rewriting them cannot pass a task.
    ``expects_answer`` says the task is solved by a submitted answer (checked with
    ``AnswerEquals`` and friends) rather than only by the state of the workspace.
    ``mounts`` are host directories the episode's sandbox shows (read-only unless a mount
    says otherwise) from the start to the verdict: fixtures or tools the task needs outside
    the workspace (a suite's ``mounts`` declaration sets them, see ``ListSuite``).
    """

    id: str
    instruction: str
    verifier: Check
    gold: list[Action]
    setup: TaskSetup = field(default_factory=TaskSetup)
    family: str = "misc"
    tier: int = 1
    split: str = "train"
    tags: tuple[str, ...] = ()
    protected_files: dict[str, str] = field(default_factory=dict)
    expects_answer: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    mounts: tuple[SandboxMount, ...] = ()

    def __post_init__(self) -> None:
        if not self.id or any(c.isspace() for c in self.id):
            raise ValueError(f"task id {self.id!r} must be non-empty and contain no whitespace")
        if not self.instruction.strip():
            raise ValueError(f"task {self.id}: instruction is empty")
        if not 1 <= int(self.tier) <= 4:
            raise ValueError(f"task {self.id}: tier {self.tier} is out of range 1..4")
        if not isinstance(self.verifier, Check):
            raise TypeError(f"task {self.id}: verifier must be a Check, got {type(self.verifier)}")


def prepare_workspace(task: Task, sandbox: Sandbox) -> None:
    """Lays out the task's starting workspace in ``sandbox`` (its mounts, files, builder, then
    script)."""
    if task.mounts:
        sandbox.restart(mounts=task.mounts)
    for rel_path, content in task.setup.files.items():
        sandbox.write_file(rel_path, content)
    if task.setup.builder is not None:
        task.setup.builder(sandbox.workspace.root)
        match_workspace_owner(sandbox.workspace.root)
    if task.setup.script:
        result = sandbox.exec(task.setup.script)
        if not result.ok:
            raise RuntimeError(
                f"task {task.id}: setup script failed (exit {result.exit_code}): "
                f"{(result.stderr or result.stdout)[-500:]}"
            )


def match_workspace_owner(root: Path) -> None:
    """Gives every entry under ``root`` the owner of ``root`` itself.

    A builder runs on the host (as root when harnessrl does), while the sandbox runs the
    policy's commands as an unprivileged user that owns the workspace; without this, files
    a builder made (a sqlite database to update) would be read-only to the policy.
    """
    if os.geteuid() != 0:
        return  # files we create are already ours
    owner = root.stat()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if (info.st_uid, info.st_gid) != (owner.st_uid, owner.st_gid):
                os.lchown(path, owner.st_uid, owner.st_gid)


def check_mounts_for(check: Check) -> tuple[SandboxMount, ...]:
    """Returns the read-only mounts the sandboxed Python checks under ``check`` need, once each."""
    found: dict[str, SandboxMount] = {}
    pending = [check]
    while pending:
        current = pending.pop()
        if isinstance(current, PythonCheck):
            found.update((mount.target, mount) for mount in current.mounts())
        for f in fields(current):  # type: ignore[arg-type]
            value = getattr(current, f.name)
            children = value if isinstance(value, tuple) else (value,)
            pending += [child for child in children if isinstance(child, Check)]
    return tuple(found[target] for target in sorted(found))


def verify_task(task: Task, sandbox: Sandbox, answer: str | None = None) -> Verdict:
    """Returns the verdict on the workspace (and submitted answer) after an episode.

    Nothing the policy started may touch verification: first every process of the episode is
    ended (`Sandbox.restart`: a fresh session over the same workspace, which also mounts the
    modules of sandboxed Python checks), then the protected files are laid in, overwriting
    whatever the agent left at those paths (a symlink, a file or a fifo where a folder on the
    way should be is removed first), then the checks run from the workspace root. A workspace
    in which that cannot be done, or a sandbox that cannot restart, gives a failed check that
    says why, never an exception.
    """
    mounts = {mount.target: mount for mount in (*task.mounts, *check_mounts_for(task.verifier))}
    try:
        sandbox.restart(mounts=tuple(mounts.values()), verification=True)
    except (SandboxError, OSError) as exc:
        return _not_verified("verification could not start", exc)
    for rel_path, content in task.protected_files.items():
        try:
            _lay_in(sandbox, rel_path, content)
        except (SandboxError, OSError) as exc:
            return _not_verified(f"protected file {rel_path!r} could not be laid in", exc)
    return evaluate(task.verifier, CheckContext(sandbox=sandbox, answer=answer))


def _not_verified(what: str, exc: BaseException) -> Verdict:
    return Verdict(passed=False, results=(CheckResult(False, "verification", f"{what}: {exc}"),))


# Removes, along a protected file's path, the file itself and each component on the way that
# is not a real folder (a symlink, a file, a fifo), and gives the sandbox user back its own
# folders on the way (``chmod 000``); then ``write_file`` can lay the file in.
_CLEAR_PATH = (
    'chmod -f u+rwx .; p=""; for part in "$@"; do p="${p:+$p/}$part";'
    ' if [ -L "$p" ] || { [ -e "$p" ] && [ ! -d "$p" ]; }; then rm -rf -- "$p"; break; fi;'
    ' [ -d "$p" ] && chmod -f u+rwx -- "$p"; done; rm -rf -- "$p"'
)


def _way_is_clear(sandbox: Sandbox, rel_path: str) -> bool:
    """True when every folder on the way to ``rel_path`` is a real folder its owner may use
    (or does not exist yet), and ``rel_path`` itself is absent or a regular file."""
    path = Path(sandbox.workspace.root)
    parts = [part for part in rel_path.split("/") if part not in ("", ".")]
    for index, part in enumerate(["", *parts]):
        path = path / part if part else path
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return True
        if index == len(parts):
            return stat.S_ISREG(mode)
        if not stat.S_ISDIR(mode) or mode & 0o700 != 0o700:
            return False
    return True


def _lay_in(sandbox: Sandbox, rel_path: str, content: str | bytes) -> None:
    """Writes protected file ``rel_path``, clearing first whatever the agent put in its way."""
    if not _way_is_clear(sandbox, rel_path):
        words = " ".join(shlex.quote(part) for part in rel_path.split("/") if part not in ("", "."))
        sandbox.exec(f"set -- {words}; {_CLEAR_PATH}")
    sandbox.write_file(rel_path, content)


def apply_action(action: Action, sandbox: Sandbox) -> str | None:
    """Applies one gold action directly to the sandbox; returns the submitted answer if any."""
    if action.kind == "write_file":
        content = action.content
        sandbox.write_file(str(action.path), content if isinstance(content, bytes) else str(content))
    elif action.kind == "delete_file":
        sandbox.exec(action.as_shell())
    elif action.kind == "edit_file":
        sandbox.edit_file(str(action.path), str(action.old), str(action.new))
    elif action.kind == "run":
        sandbox.exec(str(action.command))
    elif action.kind == "submit":
        return action.answer or ""
    return None
