"""Codex CLI's patch grammar (``*** Begin Patch`` ... ``*** End Patch``): the parser and the
applier behind ``codex_exec``'s ``apply_patch`` tool.

Deviations from Codex, for exact replay of gold actions: an ``*** Update File`` keeps a missing
final newline missing (Codex always adds one) and ``*** Add File`` overwrites an existing file.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harnessrl.harness.tools.common import (
    ToolError,
    display_path,
    inside_root,
    is_dir,
    read_text,
    resolve_path,
    split_lines,
)

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox

PATCH_BEGIN, PATCH_END = "*** Begin Patch", "*** End Patch"
ADD_FILE, DELETE_FILE, UPDATE_FILE = "*** Add File: ", "*** Delete File: ", "*** Update File: "
MOVE_TO, END_OF_FILE = "*** Move to: ", "*** End of File"


class PatchError(ToolError):
    """A patch that does not parse or does not apply; the message is for the model."""


@dataclass(frozen=True)
class PatchChunk:
    """One ``@@`` hunk: an optional context line to seek first, old and new lines."""

    context: str | None
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]
    end_of_file: bool = False


@dataclass(frozen=True)
class PatchOp:
    """One file section of a patch: ``add`` (content), ``delete``, or ``update`` (chunks)."""

    kind: str
    path: str
    content: str = ""
    move_to: str | None = None
    chunks: tuple[PatchChunk, ...] = ()


def _header_value(line: str, prefix: str) -> str:
    value = line[len(prefix):].strip()
    if not value:
        raise PatchError(f"missing path after '{prefix.strip()}'")
    return value


def _parse_chunk(lines: list[str], index: int, first: bool, path: str) -> tuple[PatchChunk, int]:
    """Returns one update chunk starting at ``lines[index]`` and the index after it."""
    context: str | None = None
    line = lines[index]
    if line.startswith("@@"):
        context = line[2:].strip() or None
        index += 1
    elif not first:
        raise PatchError(
            f"Expected update hunk to start with a @@ context marker, got: '{line}'"
        )
    old: list[str] = []
    new: list[str] = []
    end_of_file = False
    while index < len(lines):
        line = lines[index]
        if line.rstrip() == END_OF_FILE:
            end_of_file = True
            index += 1
            break
        if line.startswith(("@@", "***")):  # the next hunk or file section
            break
        if line == "":  # an empty line is an empty context line
            old.append("")
            new.append("")
        elif line[0] == " ":
            old.append(line[1:])
            new.append(line[1:])
        elif line[0] == "-":
            old.append(line[1:])
        elif line[0] == "+":
            new.append(line[1:])
        else:
            raise PatchError(
                f"Unexpected line found in update hunk for '{path}': '{line}'. Every line should"
                " start with ' ' (context line), '+' (added line), or '-' (removed line)"
            )
        index += 1
    if not old and not new:
        raise PatchError(f"Update hunk for '{path}' does not contain any lines")
    return PatchChunk(context, tuple(old), tuple(new), end_of_file), index


def parse_patch(text: str) -> list[PatchOp]:
    """Returns the file operations of a patch in Codex's grammar; raises PatchError."""
    lines = text.strip().split("\n")
    if not lines or lines[0].strip() != PATCH_BEGIN:
        raise PatchError(f"Invalid patch: the first line of the patch must be '{PATCH_BEGIN}'")
    if len(lines) < 2 or lines[-1].strip() != PATCH_END:
        raise PatchError(f"Invalid patch: the last line of the patch must be '{PATCH_END}'")
    body = lines[1:-1]
    ops: list[PatchOp] = []
    index = 0
    while index < len(body):
        line = body[index]
        stripped = line.strip()
        if not stripped:
            index += 1
            continue
        if stripped.startswith(ADD_FILE.strip()):
            path = _header_value(stripped, ADD_FILE)
            index += 1
            added: list[str] = []
            while index < len(body) and body[index].startswith("+"):
                added.append(body[index][1:])
                index += 1
            ops.append(PatchOp("add", path, content="".join(f"{x}\n" for x in added)))
        elif stripped.startswith(DELETE_FILE.strip()):
            ops.append(PatchOp("delete", _header_value(stripped, DELETE_FILE)))
            index += 1
        elif stripped.startswith(UPDATE_FILE.strip()):
            path = _header_value(stripped, UPDATE_FILE)
            index += 1
            move_to = None
            if index < len(body) and body[index].strip().startswith(MOVE_TO.strip()):
                move_to = _header_value(body[index].strip(), MOVE_TO)
                index += 1
            chunks: list[PatchChunk] = []
            while index < len(body) and not body[index].startswith("***"):
                if not body[index].strip() and not chunks:
                    index += 1
                    continue
                chunk, index = _parse_chunk(body, index, not chunks, path)
                chunks.append(chunk)
            if not chunks:
                raise PatchError(f"Update file hunk for path '{path}' is empty")
            ops.append(PatchOp("update", path, move_to=move_to, chunks=tuple(chunks)))
        else:
            raise PatchError(
                f"'{stripped[:200]}' is not a valid hunk header. Valid hunk headers: "
                "'*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"
            )
    if not ops:
        raise PatchError("Invalid patch: it changes no file")
    return ops


_NORMALIZERS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)


def seek_sequence(lines: list[str], pattern: list[str], start: int, end_of_file: bool) -> int | None:
    """Returns where ``pattern`` occurs in ``lines`` at or after ``start`` (exact first, then
    ignoring trailing, then surrounding whitespace, as Codex does), or None."""
    if not pattern:
        return start
    if len(pattern) > len(lines):
        return None
    last = len(lines) - len(pattern)
    first = last if end_of_file else start
    for normalize in _NORMALIZERS:
        wanted = [normalize(p) for p in pattern]
        for i in range(first, last + 1):
            if all(normalize(lines[i + k]) == wanted[k] for k in range(len(pattern))):
                return i
    return None


def apply_chunks(original: str, chunks: tuple[PatchChunk, ...], path: str) -> str:
    """Returns ``original`` with the update ``chunks`` applied; raises PatchError."""
    lines = split_lines(original)
    keep_final_newline = original.endswith("\n") or not original
    replacements: list[tuple[int, int, list[str]]] = []
    index = 0
    for chunk in chunks:
        if chunk.context is not None:
            found = seek_sequence(lines, [chunk.context], index, False)
            if found is None:
                raise PatchError(f"Failed to find context '{chunk.context}' in {path}")
            index = found + 1
        if not chunk.old_lines:  # a pure addition goes at the end of the file
            replacements.append((len(lines), 0, list(chunk.new_lines)))
            continue
        old, new = list(chunk.old_lines), list(chunk.new_lines)
        found = seek_sequence(lines, old, index, chunk.end_of_file)
        if found is None and old[-1] == "":  # a trailing empty context line may be absent
            old = old[:-1]
            new = new[:-1] if new and new[-1] == "" else new
            found = seek_sequence(lines, old, index, chunk.end_of_file) if old else None
        if found is None:
            expected = "\n".join(chunk.old_lines)
            raise PatchError(f"Failed to find expected lines in {path}:\n{expected}")
        replacements.append((found, len(old), new))
        index = found + len(old)
    for start, length, new_lines in sorted(replacements, key=lambda r: r[0], reverse=True):
        lines[start:start + length] = new_lines
    text = "\n".join(lines)
    return text + "\n" if lines and keep_final_newline else text


def apply_patch(ops: list[PatchOp], sandbox: Sandbox) -> tuple[list[str], tuple[str, ...]]:
    """Applies parsed ``ops`` (all or nothing for content errors); returns the summary lines
    (``A path``, ``M path``, ``D path``) and the changed workspace paths."""
    state: dict[str, str | None] = {}  # path -> new content, None to delete
    summary: list[str] = []

    def current(relative: str) -> str | None:
        if relative in state:
            return state[relative]
        if not sandbox.exists(relative):
            return None
        if is_dir(sandbox, relative):
            raise PatchError(f"{display_path(relative)} is a directory")
        return read_text(sandbox, relative)

    for op in ops:
        relative = resolve_path(op.path, sandbox)
        if op.kind == "add":
            if is_dir(sandbox, relative):
                raise PatchError(f"Cannot add {op.path}: it is a directory")
            state[relative] = op.content
            summary.append(f"A {op.path}")
            continue
        original = current(relative)
        if original is None:
            verb = "delete" if op.kind == "delete" else "update"
            raise PatchError(f"Failed to {verb} {op.path}: the file does not exist")
        if op.kind == "delete":
            state[relative] = None
            summary.append(f"D {op.path}")
            continue
        updated = apply_chunks(original, op.chunks, op.path)
        if op.move_to is not None:
            target = resolve_path(op.move_to, sandbox)
            if is_dir(sandbox, target):
                raise PatchError(f"Cannot move {op.path} to {op.move_to}: it is a directory")
            state[relative] = None
            state[target] = updated
            summary.append(f"M {op.move_to}")
        else:
            state[relative] = updated
            summary.append(f"M {op.path}")
    for relative, content in state.items():
        if content is None:
            sandbox.exists(relative)  # refuses a path that leaves the workspace
            target = f"{inside_root(sandbox)}/{relative}"
            result = sandbox.exec(f"rm -f -- {shlex.quote(target)}")
            if not result.ok:
                raise PatchError(f"Failed to delete {relative}: {result.stderr.strip()}")
        else:
            sandbox.write_file(relative, content)
    return summary, tuple(state)
