"""Out-of-space tool interfaces and observation format: call syntaxes no level of the space uses.

``codex_exec`` (Codex CLI): ``exec_command`` (argv or shell string, ``workdir``,
``timeout_ms``), ``apply_patch`` with Codex's patch grammar, and ``final_answer``; calls are
written ``<function=NAME>BODY</function>`` where BODY is the JSON arguments, except for
``apply_patch`` whose body is the raw patch (Codex's freeform tool; ``{"input": patch}`` is
accepted too). Up to five calls per response, run in order.
``aider_editblock`` (Aider): SEARCH/REPLACE blocks after the file's path (several per
response; an empty SEARCH writes the whole file), shell commands in ```bash blocks or on
``/run <cmd>`` lines, and ``/submit <answer>``; everything runs in the order written.
``codex_header`` (Codex CLI): the observation as an ``Exit code / Wall time / Output`` header.

Deviations, all for exact replay of gold actions: an ``*** Update File`` keeps a missing final
newline missing (Codex always adds one), ``*** Add File`` overwrites an existing file, and an
Aider block with an empty SEARCH replaces the whole file (Aider appends to an existing one).
Both interfaces return ``[]`` from ``stop_sequences`` because they allow several calls per
response.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.harness.base import (
    ObservationFormat,
    ParsedOutput,
    ToolCall,
    ToolInterface,
    ToolOutput,
    ToolSpec,
)
from harnessrl.harness.registry import register
from harnessrl.harness.tools import (
    SchemaToolInterface,
    ToolError,
    ansi_c_quote,
    breaks_fence,
    call_from_json,
    display_path,
    inside_root,
    is_dir,
    object_schema,
    python_edit_command,
    python_write_command,
    read_text,
    resolve_path,
    shell_output,
    split_lines,
    tag_safe_json,
)
from harnessrl.sandbox import WORKSPACE_MOUNT

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Action


# ============================================================================================
# Codex patch grammar: parser and applier
# ============================================================================================

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


# ============================================================================================
# codex_exec
# ============================================================================================

CODEX_MAX_CALLS = 5
CODEX_MAX_TIMEOUT_MS = 600000

CODEX_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "exec_command",
        "Runs a command and returns its output. `cmd` is an argv list (e.g. [\"bash\", \"-lc\","
        " \"ls -la\"]) or a shell string; it starts in `workdir` (default: the workspace root)."
        f" `timeout_ms` limits its run time (max {CODEX_MAX_TIMEOUT_MS}).",
        object_schema(
            {
                "cmd": {"type": ["array", "string"], "items": {"type": "string"}, "minItems": 1,
                        "description": "The command: an argv list or a shell string."},
                "workdir": {"type": "string", "description": "Directory to run in, relative to the workspace."},
                "timeout_ms": {"type": "integer", "minimum": 1, "maximum": CODEX_MAX_TIMEOUT_MS,
                               "description": "Timeout in milliseconds."},
            },
            ["cmd"],
        ),
    ),
    ToolSpec(
        "apply_patch",
        "Edits files with a patch in the apply_patch format (see the instructions). The body of"
        " the call is the raw patch text.",
        object_schema({"input": {"type": "string", "description": "The whole patch."}}, ["input"]),
    ),
    ToolSpec(
        "final_answer",
        "Ends the task with your final answer (empty when the task asks for none).",
        object_schema({"answer": {"type": "string", "description": "The final answer."}}, ["answer"]),
    ),
)

CODEX_USAGE = """## Tools

Call a tool by writing <function=TOOL_NAME>BODY</function>. For exec_command and final_answer the body is a JSON object with the arguments; for apply_patch the body is the raw patch. You may make up to {max_calls} calls in one response; they run in order.

### exec_command
{exec_description}
<function=exec_command>{{"cmd": ["bash", "-lc", "grep -rn 'def main' ."], "workdir": "src"}}</function>

### apply_patch
Use apply_patch to edit files. The patch language is a stripped-down, file-oriented diff format:

*** Begin Patch
[ one or more file sections ]
*** End Patch

Each file section starts with one of three headers:
*** Add File: <path> - create a new file. Every following line is a + line (the initial contents).
*** Delete File: <path> - remove an existing file. Nothing follows.
*** Update File: <path> - patch an existing file in place (optionally followed by "*** Move to: <new path>" to rename it).

An Update section holds one or more hunks, each introduced by @@ (optionally followed by a line of the file, such as a class or function definition, that locates the hunk). Within a hunk every line starts with ' ' (context), '-' (removed) or '+' (added). Show 3 lines of context above and below each change; "*** End of File" marks a hunk at the end of the file. File paths are relative to the workspace, never absolute.

<function=apply_patch>
*** Begin Patch
*** Update File: app/greet.py
@@ def greet():
-    print("Hi")
+    print("Hello, world!")
*** End Patch
</function>

### final_answer
When the task is done, call final_answer with your answer:
<function=final_answer>{{"answer": "42"}}</function>"""
CODEX_EXAMPLE = """I'll list the files in the workspace first.

<function=exec_command>{"cmd": ["bash", "-lc", "ls -la"]}</function>"""
CODEX_FORMAT_ERROR = """{problem}

Call a tool as <function=TOOL_NAME>BODY</function>, for example:
{example}"""
CODEX_PATCH_DONE = "Success. Updated the following files:\n{summary}"
CODEX_FINISHED = "Final answer recorded."

_FUNCTION_CALL = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.S)
_FUNCTION_OPEN = re.compile(r"<function=([^>\n]*)>")

# Programs that codex_exec's oracle runs through an argv list (no shell quoting involved).
ARGV_WRITE_PROGRAM = """import os, sys
path, content = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:
    f.write(content)
"""
ARGV_EDIT_PROGRAM = """import sys
path, old, new = sys.argv[1:4]
with open(path, encoding='utf-8', errors='surrogateescape', newline='') as f:
    text = f.read()
count = text.count(old)
if count != 1:
    raise SystemExit(f'edit failed: the old text occurs {count} times in {path}, expected 1')
with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:
    f.write(text.replace(old, new, 1))
"""


def _patch_safe(text: str) -> bool:
    """Returns whether ``text`` can be written as whole ``+``/``-`` lines of a raw patch body."""
    return (not text or text.endswith("\n")) and "</function>" not in text


@register
class CodexExecTools(SchemaToolInterface):
    """Codex CLI: ``exec_command``, ``apply_patch`` and ``final_answer`` in ``<function=...>``."""

    out_of_space = True
    name = "codex_exec"
    description = "exec_command (argv), apply_patch (Codex patch grammar), final_answer in <function=...> calls (Codex CLI)"
    submit_tool = "final_answer"
    tool_specs = CODEX_SPECS
    handlers: ClassVar[dict[str, str]] = {
        "exec_command": "_exec", "apply_patch": "_apply_patch", "final_answer": "_final_answer",
    }

    def usage(self) -> str:
        """Returns the Codex-style tool instructions with the apply_patch grammar."""
        return CODEX_USAGE.format(max_calls=CODEX_MAX_CALLS, exec_description=CODEX_SPECS[0].description)

    def example(self) -> str:
        """Returns a sentence and one ``exec_command`` call."""
        return CODEX_EXAMPLE

    def _format_error(self, problem: str) -> ParsedOutput:
        return ParsedOutput(error=CODEX_FORMAT_ERROR.format(problem=problem, example=CODEX_EXAMPLE),
                            error_kind="format")

    def parse(self, text: str) -> ParsedOutput:
        """Returns the ``<function=NAME>BODY</function>`` calls in order, or an error."""
        found: list[tuple[str, str]] = []
        end = 0
        for match in _FUNCTION_CALL.finditer(text):
            found.append((match.group(1).strip(), match.group(2)))
            end = match.end()
        tail = _FUNCTION_OPEN.search(text, end)
        if tail is not None:  # generation stopped before the closing tag
            found.append((tail.group(1).strip(), text[tail.end():]))
        if not found:
            return self._format_error("No tool call found in your response.")
        if len(found) > CODEX_MAX_CALLS:
            return self._format_error(
                f"Found {len(found)} tool calls; make at most {CODEX_MAX_CALLS} calls per response."
            )
        calls = []
        for index, (name, body) in enumerate(found, start=1):
            call = self._decode(name, body)
            if isinstance(call, str):
                return self._format_error(f"Tool call #{index} ({name[:60]}): {call}")
            problem = self.check_call(call)
            if problem is not None:
                return ParsedOutput(error=problem, error_kind="tool")
            calls.append(call)
        start = _FUNCTION_OPEN.search(text)
        return ParsedOutput(calls=tuple(calls), thought=text[: start.start() if start else 0].strip())

    @staticmethod
    def _decode(name: str, body: str) -> ToolCall | str:
        """Returns the call of one ``<function=name>`` body, or what is wrong with it."""
        stripped = body.strip()
        if name == "apply_patch" and not stripped.startswith("{"):
            return ToolCall(name, {"input": stripped})
        if not stripped:
            return ToolCall(name, {})
        try:
            arguments = json.loads(stripped)
        except (ValueError, RecursionError) as exc:
            reason = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
            return f"the body is not a valid JSON object of arguments ({reason[:200]})"
        return call_from_json({"name": name, "arguments": arguments})

    # ---- tools ----
    def _exec(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        cmd = arguments["cmd"]
        command = shlex.join(cmd) if isinstance(cmd, list) else cmd
        if not command.strip():
            raise ToolError("`cmd` is empty")
        workdir = resolve_path(arguments.get("workdir") or ".", sandbox)
        if not is_dir(sandbox, workdir):
            raise ToolError(f"workdir {display_path(workdir)} is not a directory of the workspace")
        directory = inside_root(sandbox) + ("" if workdir == "." else f"/{workdir}")
        timeout_ms = arguments.get("timeout_ms")
        result = sandbox.exec(
            f"cd {shlex.quote(directory)} || exit 1\n{command}",
            timeout=None if timeout_ms is None else timeout_ms / 1000.0,
        )
        return shell_output("exec_command", result)

    def _apply_patch(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        summary, changed = apply_patch(parse_patch(arguments["input"]), sandbox)
        return ToolOutput(tool="apply_patch", output=CODEX_PATCH_DONE.format(summary="\n".join(summary)),
                          exit_code=0, changed_paths=changed)

    def _final_answer(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        return ToolOutput(tool="final_answer", output=CODEX_FINISHED, submitted=arguments["answer"])

    def render(self, action: Action, thought: str = "") -> str:
        """Returns a sentence and one ``<function=...>`` call performing ``action``."""
        prefix = f"{thought.strip()}\n\n" if thought.strip() else ""
        path = str(action.path)
        if action.kind == "write_file" and _patch_safe(str(action.content)):
            lines = "".join(f"+{line}\n" for line in split_lines(str(action.content)))
            patch = f"{PATCH_BEGIN}\n{ADD_FILE}{path}\n{lines}{PATCH_END}"
            return f"{prefix}<function=apply_patch>\n{patch}\n</function>"
        old, new = str(action.old), str(action.new)
        if (action.kind == "edit_file" and old.strip() and old.endswith("\n")
                and _patch_safe(old) and _patch_safe(new)):
            removed = "".join(f"-{line}\n" for line in split_lines(old))
            added = "".join(f"+{line}\n" for line in split_lines(new))
            patch = f"{PATCH_BEGIN}\n{UPDATE_FILE}{path}\n@@\n{removed}{added}{PATCH_END}"
            return f"{prefix}<function=apply_patch>\n{patch}\n</function>"
        if action.kind == "write_file":
            arguments: dict[str, Any] = {"cmd": ["python3", "-c", ARGV_WRITE_PROGRAM, path, action.content]}
        elif action.kind == "edit_file":
            arguments = {"cmd": ["python3", "-c", ARGV_EDIT_PROGRAM, path, old, new]}
        elif action.kind == "run":
            arguments = {"cmd": ["bash", "-lc", action.command]}
        else:
            return f"{prefix}<function=final_answer>{tag_safe_json({'answer': action.answer or ''})}</function>"
        return f"{prefix}<function=exec_command>{tag_safe_json(arguments)}</function>"


# ============================================================================================
# aider_editblock
# ============================================================================================

AIDER_MAX_CALLS = 10
_HEAD = re.compile(r"<{5,9} SEARCH\s*")
_DIVIDER = re.compile(r"={5,9}\s*")
_UPDATED = re.compile(r">{5,9} REPLACE\s*")
AIDER_SHELL_LANGS = frozenset({"bash", "sh", "shell"})

AIDER_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "edit",
        "A SEARCH/REPLACE block: replace the first exact match of `search` in the file at `path`"
        " with `replace`; an empty `search` writes the whole file.",
        object_schema(
            {
                "path": {"type": "string", "description": "The file path, relative to the workspace."},
                "search": {"type": "string", "description": "Lines to find (empty: write the file)."},
                "replace": {"type": "string", "description": "Lines to put in their place."},
            },
            ["path", "search", "replace"],
        ),
    ),
    ToolSpec(
        "run",
        "A shell command (a ```bash block or a `/run <command>` line), run in the workspace.",
        object_schema({"command": {"type": "string", "description": "The shell command."}}, ["command"]),
    ),
    ToolSpec(
        "submit",
        "`/submit <answer>`: end the task with a one-line answer (just `/submit` when none).",
        object_schema({"answer": {"type": "string", "description": "The final answer."}}, ["answer"]),
    ),
)

AIDER_USAGE = """# File editing rules

Describe each change with a *SEARCH/REPLACE block* per the examples below.
Every *SEARCH/REPLACE block* must use this format:
1. The *FULL* file path alone on a line, verbatim. No bold asterisks, no quotes around it, no escaping of characters, etc.
2. The opening fence and code language, eg: ```python
3. The start of search block: <<<<<<< SEARCH
4. A contiguous chunk of lines to search for in the existing source code
5. The dividing line: =======
6. The lines to replace into the source code
7. The end of the replace block: >>>>>>> REPLACE
8. The closing fence: ```

Every *SEARCH* section must *EXACTLY MATCH* the existing file content, character for character, including all comments, docstrings, etc.
*SEARCH/REPLACE* blocks will *only* replace the first match occurrence.
Keep *SEARCH/REPLACE* blocks concise: include just the changing lines and a few surrounding lines if needed for uniqueness.
To create a new file (or to rewrite a whole file), use an *empty* `SEARCH` section and put the whole content in the `REPLACE` section.

Example:

mathweb/flask/app.py
```python
<<<<<<< SEARCH
from flask import Flask
=======
import math
from flask import Flask
>>>>>>> REPLACE
```

# Shell commands

Put shell commands in a ```bash block (one or more commands), or on a line of their own that starts with `/run `:

```bash
python -m pytest -q
```

Edits and commands run in the order you write them, in the workspace ({workspace}).

# Finishing

When the task is done, write a line `/submit <answer>` with your final one-line answer (just `/submit` when the task asks for no answer)."""
AIDER_EXAMPLE = """I'll create the script that prints the greeting.

hello.py
```python
<<<<<<< SEARCH
=======
print("hello")
>>>>>>> REPLACE
```"""
AIDER_FORMAT_ERROR = """{problem}

Use SEARCH/REPLACE blocks for edits, ```bash blocks or `/run <command>` lines for commands, and `/submit <answer>` to finish. For example:
{example}"""
AIDER_NO_ACTION = "No SEARCH/REPLACE blocks, shell commands or /submit found in your reply."
AIDER_APPLIED = "Applied edit to {path}"
AIDER_NO_MATCH = """## SearchReplaceNoExactMatch: This SEARCH block failed to exactly match lines in {path}
<<<<<<< SEARCH
{search}=======
{replace}>>>>>>> REPLACE

The SEARCH section must exactly match an existing block of lines including all white space, comments, indentation, docstrings, etc"""
AIDER_MISSING_FILE = "Cannot apply the SEARCH/REPLACE block: {path} does not exist. Use an empty SEARCH section to create it."
AIDER_SUBMITTED = "Submitted."


def _marker(line: str) -> bool:
    stripped = line.strip()
    return bool(_HEAD.fullmatch(stripped) or _DIVIDER.fullmatch(stripped) or _UPDATED.fullmatch(stripped))


def _strip_filename(line: str) -> str | None:
    """Returns the file name on a line before a SEARCH block (Aider's rules), or None."""
    text = line.strip()
    if not text or text == "..." or _marker(text):
        return None
    if text.startswith("```"):
        candidate = text[3:].strip()
        return candidate if candidate and ("." in candidate or "/" in candidate) else None
    text = text.rstrip(":").lstrip("#").strip().strip("`").strip("*").strip()
    if not text or any(c.isspace() for c in text):
        return None
    return text


def _find_filename(lines: list[str], head: int) -> tuple[str | None, int]:
    """Returns the file name of the block whose SEARCH marker is ``lines[head]`` and the index
    of its line: the line before the marker, looking further back only past fence lines (Aider).
    Without a name, the index is the first fence line above the marker (or ``head``)."""
    start = head
    for index in range(head - 1, max(0, head - 3) - 1, -1):
        name = _strip_filename(lines[index])
        if name:
            return name, index
        if not lines[index].strip().startswith("```"):
            break
        start = index
    return None, start


def _lines_text(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _edit_block_safe(text: str) -> bool:
    """Returns whether ``text`` can be a SEARCH or REPLACE section exactly."""
    return (not text or text.endswith("\n")) and not any(_marker(line) for line in text.split("\n"))


@register
class AiderEditBlockTools(SchemaToolInterface):
    """Aider: SEARCH/REPLACE edit blocks, ```bash or ``/run`` commands, ``/submit``."""

    out_of_space = True
    name = "aider_editblock"
    description = "SEARCH/REPLACE edit blocks, ```bash or /run commands and /submit (Aider)"
    submit_tool = "submit"
    tool_specs = AIDER_SPECS
    handlers: ClassVar[dict[str, str]] = {"edit": "_edit", "run": "_run", "submit": "_submit"}

    def usage(self) -> str:
        """Returns Aider's edit-block rules, the command syntax and how to finish."""
        return AIDER_USAGE.replace("{workspace}", WORKSPACE_MOUNT)

    def example(self) -> str:
        """Returns a sentence and one SEARCH/REPLACE block creating a file."""
        return AIDER_EXAMPLE

    def _format_error(self, problem: str) -> ParsedOutput:
        return ParsedOutput(error=AIDER_FORMAT_ERROR.format(problem=problem, example=AIDER_EXAMPLE),
                            error_kind="format")

    def parse(self, text: str) -> ParsedOutput:
        """Returns the edits, commands and submit of ``text`` in the order written, or an error."""
        lines = text.split("\n")
        calls: list[ToolCall] = []
        first_action = -1
        last_path: str | None = None
        index = 0
        while index < len(lines):
            line = lines[index]
            stripped = line.strip()
            start = index
            if _HEAD.fullmatch(stripped):
                found_path, start = _find_filename(lines, index)
                path = found_path or last_path
                if path is None:
                    return self._format_error(
                        "Bad/missing filename. The filename must be alone on the line before the"
                        " opening fence ```"
                    )
                section: list[list[str]] = [[], []]
                part, index = 0, index + 1
                while index < len(lines) and not (part == 1 and _UPDATED.fullmatch(lines[index].strip())):
                    current = lines[index].strip()
                    if part == 0 and _DIVIDER.fullmatch(current):
                        part = 1
                    elif _HEAD.fullmatch(current) or (_UPDATED.fullmatch(current) and part == 0):
                        return self._format_error(f"Expected `=======` not `{current[:80]}`")
                    else:
                        section[part].append(lines[index])
                    index += 1
                if index >= len(lines):
                    wanted = "`>>>>>>> REPLACE`" if part == 1 else "`=======`"
                    return self._format_error(f"Expected {wanted} before the end of your reply.")
                calls.append(ToolCall("edit", {
                    "path": path, "search": _lines_text(section[0]), "replace": _lines_text(section[1])}))
                last_path = path
            elif stripped.startswith("```") and stripped[3:].strip().lower() in AIDER_SHELL_LANGS:
                if index + 1 < len(lines) and _HEAD.fullmatch(lines[index + 1].strip()):
                    index += 1  # a ```bash fence around an edit block of a shell script
                    continue
                body: list[str] = []
                index += 1
                while index < len(lines) and not re.fullmatch(r"`{3,}", lines[index].strip()):
                    body.append(lines[index])
                    index += 1
                if index >= len(lines):
                    return self._format_error("Your ```bash block is not closed with a line of ```.")
                command = "\n".join(body)
                if command.strip():
                    calls.append(ToolCall("run", {"command": command}))
            elif line.startswith("/run "):
                if line[5:].strip():
                    calls.append(ToolCall("run", {"command": line[5:].strip()}))
            elif line.rstrip() == "/submit" or line.startswith("/submit "):
                calls.append(ToolCall("submit", {"answer": line[len("/submit"):].strip()}))
            else:
                index += 1
                continue
            if first_action < 0:
                first_action = start
            index += 1
        if not calls:
            return self._format_error(AIDER_NO_ACTION)
        if len(calls) > AIDER_MAX_CALLS:
            return self._format_error(
                f"Found {len(calls)} edits and commands; use at most {AIDER_MAX_CALLS} per reply."
            )
        return ParsedOutput(calls=tuple(calls), thought="\n".join(lines[:max(first_action, 0)]).strip())

    # ---- tools ----
    def _edit(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        relative = resolve_path(arguments["path"], sandbox)
        search, replace = arguments["search"], arguments["replace"]
        shown = arguments["path"]
        if is_dir(sandbox, relative):
            raise ToolError(f"{shown} is a directory, not a file")
        if not search.strip():
            sandbox.write_file(relative, replace)
            return ToolOutput(tool="edit", output=AIDER_APPLIED.format(path=shown), changed_paths=(relative,))
        if not sandbox.exists(relative):
            raise ToolError(AIDER_MISSING_FILE.format(path=shown))
        text = read_text(sandbox, relative)
        updated = _replace_block(text, search, replace)
        if updated is None:
            raise ToolError(AIDER_NO_MATCH.format(path=shown, search=search, replace=replace))
        sandbox.write_file(relative, updated)
        return ToolOutput(tool="edit", output=AIDER_APPLIED.format(path=shown), changed_paths=(relative,))

    def _run(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        return shell_output("run", sandbox.exec(arguments["command"]))

    def _submit(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        return ToolOutput(tool="submit", output=AIDER_SUBMITTED, submitted=arguments["answer"])

    def render(self, action: Action, thought: str = "") -> str:
        """Returns a sentence and the block, command or ``/submit`` line performing ``action``."""
        prefix = f"{thought.strip()}\n\n" if thought.strip() else ""
        path = str(action.path)
        plain_path = bool(path) and not any(c.isspace() for c in path)
        if action.kind == "write_file" and plain_path and _edit_block_safe(str(action.content)):
            return f"{prefix}{path}\n```\n<<<<<<< SEARCH\n=======\n{action.content}>>>>>>> REPLACE\n```"
        old, new = str(action.old), str(action.new)
        if (action.kind == "edit_file" and plain_path and old.strip() and old.endswith("\n")
                and _edit_block_safe(old) and _edit_block_safe(new)):
            return f"{prefix}{path}\n```\n<<<<<<< SEARCH\n{old}=======\n{new}>>>>>>> REPLACE\n```"
        if action.kind == "submit":
            return f"{prefix}/submit {action.answer or ''}".rstrip()
        if action.kind == "write_file":
            command = python_write_command(path, str(action.content))
        elif action.kind == "edit_file":
            command = python_edit_command(path, old, new)
        else:
            command = str(action.command)
            if "\n" not in command and command.strip() == command and command:
                return f"{prefix}/run {command}"
            if breaks_fence(command):
                command = f"eval {ansi_c_quote(command)}"
        return f"{prefix}```bash\n{command}\n```"


def _replace_block(text: str, search: str, replace: str) -> str | None:
    """Returns ``text`` with the first exact match of ``search`` replaced, else the first match
    of its lines ignoring trailing whitespace, else None (Aider's exact-then-flexible order)."""
    if search in text:
        return text.replace(search, replace, 1)
    lines = text.splitlines(keepends=True)
    wanted = [line.rstrip() for line in search.splitlines()]
    for start in range(len(lines) - len(wanted) + 1):
        if all(lines[start + k].rstrip() == wanted[k] for k in range(len(wanted))):
            return "".join(lines[:start]) + replace + "".join(lines[start + len(wanted):])
    return None


# ============================================================================================
# codex_header observation
# ============================================================================================

CODEX_HEAD_LINES = 128  # lines kept at each end of a long output
CODEX_MAX_CHARS = 10000
CODEX_OMITTED = "[... omitted {omitted} of {total} lines ...]"


@register
class CodexHeaderObservation(ObservationFormat):
    """Codex CLI: ``Exit code`` / ``Wall time`` / (``Total output lines``) / ``Output`` header."""

    out_of_space = True
    name = "codex_header"
    description = "Exit code / Wall time / Output header, long output cut to head and tail lines (Codex CLI)"

    def format(self, output: ToolOutput) -> str:
        """Returns the header block and the (head and tail of the) output."""
        code = output.exit_code if output.exit_code is not None else (1 if output.is_error else 0)
        text = output.output
        if output.stderr:
            text = (text.rstrip("\n") + "\n" if text else "") + output.stderr
        if output.timed_out:
            text = f"command timed out after {round(output.duration_s * 1000)} milliseconds\n{text}"
        lines = text.split("\n")
        total = len(lines)
        sections = [f"Exit code: {code}", f"Wall time: {output.duration_s:.1f} seconds"]
        if total > 2 * CODEX_HEAD_LINES:
            omitted = total - 2 * CODEX_HEAD_LINES
            lines = [*lines[:CODEX_HEAD_LINES], CODEX_OMITTED.format(omitted=omitted, total=total),
                     *lines[-CODEX_HEAD_LINES:]]
            sections.append(f"Total output lines: {total}")
        body = "\n".join(lines)
        if len(body) > CODEX_MAX_CHARS:
            half = CODEX_MAX_CHARS // 2
            body = f"{body[:half]}\n[... omitted {len(body) - CODEX_MAX_CHARS} characters ...]\n{body[-half:]}"
            if len(sections) == 2:
                sections.append(f"Total output lines: {total}")
        sections += ["Output:", body]
        return "\n".join(sections)

    def format_error(self, message: str, kind: str = "format") -> str:
        """Returns the error as Codex reports a call it could not run: plain text."""
        return f"{kind} error: {message}"


OUT_OF_SPACE_TOOLS: dict[str, type[ToolInterface]] = {
    cls.name: cls for cls in (CodexExecTools, AiderEditBlockTools)
}
OUT_OF_SPACE_OBSERVATIONS: dict[str, type[ObservationFormat]] = {
    CodexHeaderObservation.name: CodexHeaderObservation,
}
