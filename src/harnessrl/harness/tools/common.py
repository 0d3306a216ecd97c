"""What every tool interface shares: workspace paths, file text, tool outputs, fenced blocks and
the shell commands the oracle writes files with.

File paths are relative to the workspace or absolute under ``/workspace``; a refused path, a
missing file or a bad argument raises ToolError, which the interface turns into a tool output
with ``is_error=True``, never an exception.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harnessrl.harness.base import ToolOutput, encodable  # noqa: F401 - re-exported
from harnessrl.sandbox import WORKSPACE_MOUNT, SandboxError
from harnessrl.tasks.model import Action

if TYPE_CHECKING:
    from harnessrl.sandbox import ExecResult, Sandbox


class ToolError(Exception):
    """A model-facing failure of one tool call (bad argument, refused path, missing file)."""


SNIPPET_CONTEXT_LINES = 4  # lines shown around an edit


def resolve_path(path: str, sandbox: Sandbox | None = None) -> str:
    """Returns ``path`` as a normalized workspace-relative path ("." for the root).

    Accepts relative paths and absolute paths under ``/workspace`` (and, for the ``none``
    backend, absolute host paths inside the workspace). Raises ToolError for anything else;
    symlinks are checked later by the sandbox's own file operations.
    """
    if not isinstance(path, str) or not path.strip():
        raise ToolError("the path is empty")
    if "\x00" in path:
        raise ToolError("the path contains a NUL byte")
    text = path.strip()
    if text == WORKSPACE_MOUNT or text.startswith(WORKSPACE_MOUNT + "/"):
        relative = text[len(WORKSPACE_MOUNT):].lstrip("/") or "."
    elif text.startswith("/"):
        host_root = str(sandbox.workspace.root) if sandbox is not None else None
        if host_root and (text == host_root or text.startswith(host_root.rstrip("/") + "/")):
            relative = text[len(host_root):].lstrip("/") or "."
        else:
            raise ToolError(
                f"path '{text}' is outside the workspace; use a path relative to the workspace"
                f" or an absolute path under {WORKSPACE_MOUNT}"
            )
    else:
        relative = text
    normalized = posixpath.normpath(relative)
    if normalized == ".." or normalized.startswith("../"):
        raise ToolError(f"path '{text}' is outside the workspace")
    return normalized


def display_path(relative: str) -> str:
    """Returns the path as the policy sees it: absolute under ``/workspace``."""
    if relative.startswith("/"):
        return relative
    relative = posixpath.normpath(relative)
    return WORKSPACE_MOUNT if relative in ("", ".") else f"{WORKSPACE_MOUNT}/{relative}"


def inside_root(sandbox: Sandbox) -> str:
    """Returns the workspace directory as commands inside the sandbox see it."""
    return str(getattr(sandbox, "inside_root", WORKSPACE_MOUNT))


def read_text(sandbox: Sandbox, relative: str) -> str:
    """Returns a workspace file's text; undecodable bytes survive a later ``write_file``."""
    return sandbox.read_bytes(relative).decode("utf-8", "surrogateescape")


def is_dir(sandbox: Sandbox, relative: str) -> bool:
    """Returns whether ``relative`` is a directory of the workspace (not through a symlink)."""
    try:
        sandbox.list_dir(relative)
    except SandboxError:
        return False
    return True


def split_lines(text: str) -> list[str]:
    """Returns the lines of ``text`` without their newlines (a final newline adds no line)."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


def number_lines(lines: list[str], first: int = 1) -> str:
    """Returns ``lines`` numbered like ``cat -n`` (six-wide number, a tab, the line)."""
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def edit_snippet(text: str, first_line: int, changed_lines: int) -> str:
    """Returns ``cat -n`` lines around an edit that starts at 0-based line ``first_line``."""
    lines = split_lines(text)
    start = max(0, first_line - SNIPPET_CONTEXT_LINES)
    end = min(len(lines), first_line + changed_lines + SNIPPET_CONTEXT_LINES)
    return number_lines(lines[start:end], start + 1)


def error_output(tool: str, message: str) -> ToolOutput:
    """Returns the output of a call that failed before or while running (``is_error``)."""
    return ToolOutput(tool=tool, output=message, is_error=True)


def shell_output(tool: str, result: ExecResult, output: str | None = None) -> ToolOutput:
    """Returns the ToolOutput of a finished shell command."""
    return ToolOutput(
        tool=tool,
        output=result.stdout if output is None else output,
        stderr=result.stderr,
        exit_code=result.exit_code,
        duration_s=result.duration_s,
        truncated=result.truncated,
        timed_out=result.timed_out,
    )


_FENCE_CLOSE = re.compile(r"`{3,}")


@dataclass(frozen=True)
class FencedBlock:
    """A fenced code block: its info string (language) and body."""

    info: str
    body: str
    start: int  # character offset of the opening fence line


def fenced_blocks(text: str) -> tuple[list[FencedBlock], bool]:
    """Returns the fenced blocks of ``text`` in order, and whether the last one is unterminated.

    An opening fence is a line starting with three backticks (after indentation) and an
    optional info string; the block ends at the next line made only of backticks.
    """
    blocks: list[FencedBlock] = []
    offset = 0
    opened: tuple[str, int, list[str]] | None = None
    for line in text.split("\n"):
        stripped = line.strip()
        if opened is None:
            if stripped.startswith("```"):
                opened = (stripped[3:].strip().lower(), offset, [])
        elif _FENCE_CLOSE.fullmatch(stripped):
            blocks.append(FencedBlock(opened[0], "\n".join(opened[2]), opened[1]))
            opened = None
        else:
            opened[2].append(line)
        offset += len(line) + 1
    return blocks, opened is not None


def breaks_fence(text: str) -> bool:
    """Returns whether a line of ``text`` would close a fenced block it is placed in."""
    return any(_FENCE_CLOSE.fullmatch(line.strip()) for line in text.split("\n"))


# Python programs (run with ``python3 -`` from a heredoc) that write or edit a file with exact
# bytes. Literals are written with ascii(), so the program is ASCII and each literal one line.
PY_WRITE_TEMPLATE = """python3 - <<'PYEOF'
import os
path, content = {path}, {content}
os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:
    f.write(content)
PYEOF"""
PY_EDIT_TEMPLATE = """python3 - <<'PYEOF'
path, old, new = {path}, {old}, {new}
with open(path, encoding='utf-8', errors='surrogateescape', newline='') as f:
    text = f.read()
count = text.count(old)
if count != 1:
    raise SystemExit(f'edit failed: the old text occurs {{count}} times in {{path}}, expected 1')
with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:
    f.write(text.replace(old, new, 1))
PYEOF"""


def replayable(action: Action) -> Action:
    """Returns ``action``, or a ``run`` of its shell form when tool interfaces have no native
    form of it (``Action.needs_shell``: a delete or a binary write)."""
    return Action.run(action.as_shell()) if action.needs_shell else action


def python_write_command(path: str, content: str) -> str:
    """Returns a shell command that writes ``content`` to ``path`` byte for byte."""
    return PY_WRITE_TEMPLATE.format(path=ascii(path), content=ascii(content))


def python_edit_command(path: str, old: str, new: str) -> str:
    """Returns a shell command replacing the single occurrence of ``old`` in ``path``."""
    return PY_EDIT_TEMPLATE.format(path=ascii(path), old=ascii(old), new=ascii(new))


def heredoc_write_command(path: str, content: str) -> str | None:
    """Returns ``cat <<'EOF' > path`` writing ``content`` exactly, or None when a heredoc can't
    (content without a final newline, or with a line that would close a fence)."""
    if (content and not content.endswith("\n")) or breaks_fence(content) or "\r" in content:
        return None
    delimiter = "EOF"
    while delimiter in content:
        delimiter += "_"
    parent = posixpath.dirname(path)
    mkdir = f"mkdir -p {shlex.quote(parent)} && " if parent else ""
    return f"{mkdir}cat <<'{delimiter}' > {shlex.quote(path)}\n{content}{delimiter}"


def ansi_c_quote(text: str) -> str:
    """Returns ``text`` as a one-line bash ``$'...'`` string."""
    escapes = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    out = []
    for char in text:
        if char in escapes:
            out.append(escapes[char])
        elif ord(char) < 32 or ord(char) == 127:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"
