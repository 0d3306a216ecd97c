"""``aider_editblock`` (Aider), a tool interface outside the space: SEARCH/REPLACE blocks after
the file's path (several per response; an empty SEARCH writes the whole file), shell commands in
```bash blocks or on ``/run <cmd>`` lines, and ``/submit <answer>`` (a multi-line answer: a line
``/submit`` alone, then the answer in a plain ``` block); everything runs in the order written.

Deviation from Aider, for exact replay of gold actions: a block with an empty SEARCH replaces
the whole file (Aider appends to an existing one).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.harness.base import ParsedOutput, ToolCall, ToolOutput, ToolSpec
from harnessrl.harness.registry import register
from harnessrl.harness.tools.arguments import object_schema
from harnessrl.harness.tools.common import (
    ToolError,
    ansi_c_quote,
    breaks_fence,
    is_dir,
    python_edit_command,
    python_write_command,
    read_text,
    replayable,
    resolve_path,
    shell_output,
)
from harnessrl.harness.tools.schema import SchemaToolInterface
from harnessrl.sandbox import WORKSPACE_MOUNT

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Action

AIDER_MAX_CALLS = 10
_HEAD = re.compile(r"<{5,9} SEARCH\s*")
_DIVIDER = re.compile(r"={5,9}\s*")
_UPDATED = re.compile(r">{5,9} REPLACE\s*")
AIDER_SHELL_LANGS = frozenset({"bash", "sh", "shell"})
# Info strings of the fence that may hold a multi-line answer after a bare `/submit` line.
AIDER_ANSWER_LANGS = frozenset({"", "text"})
_FENCE_OPEN = re.compile(r"(`{3,})\s*(\w*)\s*")

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
        "`/submit <answer>`: end the task with the answer (just `/submit` when none); a multi-line"
        " answer goes in a plain ``` block on the lines after a `/submit` line.",
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

When the task is done, write a line `/submit <answer>` with your final answer (just `/submit` when the task asks for no answer). When the answer has several lines, write `/submit` alone on a line and put the answer in a plain ``` block right after it:

/submit
```
first line of the answer
second line of the answer
```"""
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


def _answer_fence(lines: list[str], index: int) -> str | None:
    """Returns the fence opening a multi-line answer at ``lines[index]`` (a plain or ```text
    fence right after a bare ``/submit`` line), or None."""
    if index >= len(lines):
        return None
    match = _FENCE_OPEN.fullmatch(lines[index].strip())
    if match is None or match.group(2).lower() not in AIDER_ANSWER_LANGS:
        return None
    return match.group(1)


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
            elif line.rstrip() == "/submit" and (fence := _answer_fence(lines, index + 1)) is not None:
                end = index + 2
                while end < len(lines) and lines[end].strip() != fence:
                    end += 1
                if end >= len(lines):
                    return self._format_error(f"The answer block after `/submit` is not closed with a line of {fence}.")
                calls.append(ToolCall("submit", {"answer": "\n".join(lines[index + 2:end])}))
                index = end
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
        action = replayable(action)
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
            answer = action.answer or ""
            if "\n" not in answer.strip():
                return f"{prefix}/submit {answer.strip()}".rstrip()
            fence = "```"
            while any(line.strip().startswith(fence) for line in answer.split("\n")):
                fence += "`"
            return f"{prefix}/submit\n{fence}\n{answer}\n{fence}"
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
