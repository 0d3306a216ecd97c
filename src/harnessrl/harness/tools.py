"""Factor T, the tool interface: three in-space realizations and the helpers they share.

T0 ``shell_block`` (mini-swe-agent): one shell tool; a response is a THOUGHT and exactly one
fenced shell block; ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` submits and whatever the
same command prints after that line is the answer.
T1 ``shell_editor_json`` (SWE-agent / OpenHands function calling): ``bash``,
``str_replace_editor`` and ``submit``; a response holds one ``{"name": ..., "arguments": ...}``
JSON object, bare or in a ```json fence.
T2 ``fine_grained_tagged`` (the Claude Code tool set in Hermes / Qwen syntax): ``Read``,
``Write``, ``Edit``, ``Bash``, ``Grep``, ``Glob``, ``Finish``; up to five
``<tool_call>{json}</tool_call>`` blocks per response, run in order.

File paths are relative to the workspace or absolute under ``/workspace``; a refused path, a
missing file or a bad argument becomes a tool output with ``is_error=True``, never an exception.

Stop sequences: every interface returns ``[]``. T0's only natural stop, the closing fence, is
the same string as an opening fence; T1's JSON object has no fixed closing text; T2 allows
several calls per response, so stopping at the first ``</tool_call>`` would cut the rest.
Generation ends at the chat template's end-of-turn token instead.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.harness.base import ParsedOutput, ToolCall, ToolInterface, ToolOutput, ToolSpec
from harnessrl.harness.registry import register
from harnessrl.sandbox import WORKSPACE_MOUNT, SandboxError

if TYPE_CHECKING:
    from harnessrl.sandbox import ExecResult, Sandbox
    from harnessrl.tasks.model import Action


# ============================================================================================
# Shared helpers (also used by out_of_space.py)
# ============================================================================================


class ToolError(Exception):
    """A model-facing failure of one tool call (bad argument, refused path, missing file)."""


INTERNAL_ERROR = "internal error"  # marks a failure no handler anticipated (a bug to fix)
MAX_JSON_ATTEMPTS = 64  # '{' or '[' positions tried when looking for a JSON object in free text
MAX_VIEW_CHARS = 16000  # longest file view before it is clipped (OpenHands' MAX_RESPONSE_LEN)
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


def encodable(text: str) -> str:
    """Returns ``text`` with what UTF-8 cannot encode (lone surrogates from undecodable file
    bytes or JSON escapes) replaced, so an observation can always be tokenized."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:  # bytes read with surrogateescape come back as U+FFFD, like a UTF-8 terminal shows
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "replace").decode("utf-8")
    return text


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


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
_JSON_TYPE_NAMES = {
    str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object",
    type(None): "null",
}


def _type_name(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _check_value(name: str, value: Any, schema: dict[str, Any]) -> str | None:
    """Returns what is wrong with one argument value, or None (a small JSON-schema subset)."""
    expected = schema.get("type")
    if expected is not None:
        options = expected if isinstance(expected, list) else [expected]
        if not any(_JSON_TYPES[t](value) for t in options):
            wanted = " or ".join(options)
            return f"argument `{name}` must be of type {wanted}, got {_type_name(value)}"
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"argument `{name}` must be one of {allowed}, got {json.dumps(value, default=str)[:80]}"
    if _JSON_TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"argument `{name}` must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"argument `{name}` must be <= {schema['maximum']}, got {value}"
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"argument `{name}` needs at least {schema['minItems']} item(s), got {len(value)}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"argument `{name}` takes at most {schema['maxItems']} item(s), got {len(value)}"
        item_schema = schema.get("items")
        if isinstance(item_schema, dict):
            for index, item in enumerate(value):
                problem = _check_value(f"{name}[{index}]", item, item_schema)
                if problem:
                    return problem
    return None


def validate_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """Returns a model-facing message naming the bad argument and showing the schema, or None."""
    schema = spec.parameters
    problem: str | None = None
    if not isinstance(arguments, dict):
        problem = f"the arguments must be a JSON object, got {_type_name(arguments)}"
    else:
        properties: dict[str, Any] = schema.get("properties", {})
        missing = [name for name in schema.get("required", []) if name not in arguments]
        unknown = [name for name in arguments if name not in properties]
        if missing:
            problem = f"missing required argument `{missing[0]}`"
        elif unknown and schema.get("additionalProperties", True) is False:
            problem = f"unexpected argument `{str(unknown[0])[:80]}`"
        else:
            for name, value in arguments.items():
                if name in properties:
                    problem = _check_value(name, value, properties[name])
                    if problem:
                        break
    if problem is None:
        return None
    return (
        f"Invalid arguments for tool `{spec.name}`: {problem}.\n"
        f"Expected arguments (JSON schema): {json.dumps(schema, ensure_ascii=False)}"
    )


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """Returns a strict JSON schema of an object with ``properties``."""
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class JsonFound:
    """JSON objects found in free text, and the first decoding error on the way."""

    objects: tuple[Any, ...]
    first_error: str | None
    start: int  # where the first object starts (-1 when none)


_JSON_START = re.compile(r"[\[{]")


def find_json_objects(text: str) -> JsonFound:
    """Returns the top-level JSON objects and arrays in ``text`` in order (the outermost value
    at each place; text around them is tolerated)."""
    decoder = json.JSONDecoder()
    objects: list[Any] = []
    first_error: str | None = None
    start = -1
    match = _JSON_START.search(text)
    attempts = 0
    while match is not None and attempts < MAX_JSON_ATTEMPTS:
        attempts += 1
        position = match.start()
        try:
            value, end = decoder.raw_decode(text, position)
        except (ValueError, RecursionError) as exc:
            if first_error is None and text[position] == "{":
                first_error = str(exc) if isinstance(exc, ValueError) else "the JSON is nested too deeply"
            match = _JSON_START.search(text, position + 1)
            continue
        if isinstance(value, dict | list):
            objects.append(value)
            if start < 0 and isinstance(value, dict):
                start = position
        match = _JSON_START.search(text, end)
    return JsonFound(tuple(objects), first_error, start)


def call_from_json(value: Any) -> ToolCall | str:
    """Returns the call in a decoded ``{"name": ..., "arguments": {...}}`` object, or a message."""
    if not isinstance(value, dict):
        return f"a tool call must be a JSON object, got a JSON {_type_name(value)}"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return "the tool call needs a \"name\" that is a non-empty string"
    arguments = value.get("arguments", {})
    shown = encodable(name[:80])
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return f"the \"arguments\" of `{shown}` are a string that is not valid JSON"
    if not isinstance(arguments, dict):
        return f"the \"arguments\" of `{shown}` must be a JSON object, got {_type_name(arguments)}"
    extra = sorted(set(value) - {"name", "arguments"})
    if extra:
        key = encodable(str(extra[0])[:80])
        return f"unexpected key `{key}` in the tool call; use only \"name\" and \"arguments\""
    return ToolCall(name=name, arguments=arguments)


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


def tool_list(specs: list[ToolSpec]) -> str:
    """Returns the names of ``specs`` as a comma-separated list."""
    return ", ".join(spec.name for spec in specs)


class SchemaToolInterface(ToolInterface):
    """A tool interface whose tools have JSON schemas: validation and dispatch are shared.

    Subclasses set ``tool_specs`` and ``handlers`` (tool name -> method name); each handler
    takes ``(arguments, sandbox)`` and returns a ToolOutput or raises ToolError/SandboxError.
    """

    tool_specs: ClassVar[tuple[ToolSpec, ...]] = ()
    handlers: ClassVar[dict[str, str]] = {}

    def specs(self) -> list[ToolSpec]:
        """Returns the tools this interface offers (submit included)."""
        return list(self.tool_specs)

    def check_call(self, call: ToolCall) -> str | None:
        """Returns why ``call`` cannot run (unknown tool, arguments against the schema), or None."""
        spec = next((s for s in self.tool_specs if s.name == call.name), None)
        if spec is None:
            shown = call.name if isinstance(call.name, str) else repr(call.name)
            return encodable(f"Unknown tool `{shown[:100]}`. Available tools: {tool_list(self.specs())}.")
        problem = validate_arguments(spec, call.arguments)
        return None if problem is None else encodable(problem)

    def execute(self, call: ToolCall, sandbox: Sandbox) -> ToolOutput:
        """Runs one call in the sandbox; every failure becomes an ``is_error`` output."""
        name = call.name if isinstance(call.name, str) else str(call.name)
        problem = self.check_call(call)
        if problem is not None:
            return error_output(name, encodable(problem))
        handler = getattr(self, self.handlers[name])
        try:
            output = handler(call.arguments, sandbox)
            return replace(output, output=encodable(output.output), stderr=encodable(output.stderr))
        except (ToolError, SandboxError) as exc:
            return error_output(name, encodable(str(exc)))
        except Exception as exc:  # bad input must never crash an episode (bad input is an observation: docs/architecture.md)
            message = f"{name} failed ({INTERNAL_ERROR} {type(exc).__name__}): {exc}"
            return error_output(name, encodable(message))


# ============================================================================================
# T0: shell_block (mini-swe-agent)
# ============================================================================================

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_SUBMIT_COMMAND = re.compile(rf"^\s*echo\s+(['\"]?){SUBMIT_MARKER}\1(\s|&&|;|\||$)")
_THOUGHT_LABEL = re.compile(r"^THOUGHT:\s*")
T0_SHELL_LANGS = frozenset({"bash", "sh", "shell", ""})

T0_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "bash",
        "Run one shell command (or several joined with && or ||) in the workspace.",
        object_schema({"command": {"type": "string", "description": "the shell command"}}, ["command"]),
    ),
    ToolSpec(
        "submit",
        f"Submit: a command whose first line is `echo {SUBMIT_MARKER}`; whatever it prints after"
        " that line is the final answer.",
        object_schema(
            {"command": {"type": "string", "description": f"`echo {SUBMIT_MARKER}` [&& answer command]"}},
            ["command"],
        ),
    ),
)

T0_USAGE = f"""Your response must contain exactly ONE bash code block with ONE command (or commands connected with && or ||).
Include a THOUGHT section before your command where you explain your reasoning process.
Format your response as shown in <format_example>.

<format_example>
THOUGHT: Your reasoning and analysis here. Explain why you want to perform the action.

```bash
your_command_here
```
</format_example>

Failure to follow these rules will cause your response to be rejected.

## Environment
- Commands run with bash in the workspace ({WORKSPACE_MOUNT}); the working directory persists between commands.
- Commands are not interactive: no editors (vim, nano) and no prompts.

## Useful command examples
### Create a new file:
```bash
cat <<'EOF' > newfile.py
import math
print(math.pi)
EOF
```
### Edit files with sed:
```bash
sed -i 's/old_string/new_string/g' filename.py
```
### View file content with line numbers:
```bash
nl -ba filename.py | sed -n '10,20p'
```

## Submission
When you have completed your work, issue exactly the following command:
```bash
echo {SUBMIT_MARKER}
```
If the task asks for an answer, print it in the same command, after the marker:
```bash
echo {SUBMIT_MARKER} && echo 42
```
Everything printed after the first line is your final answer. You cannot continue working after submitting."""

T0_EXAMPLE = """THOUGHT: I need to see which files are in the workspace before changing anything.

```bash
ls -la
```"""

T0_FORMAT_ERROR = """Please always provide EXACTLY ONE action in triple backticks, found {count} actions.

Please format your action in triple backticks as shown in <response_example>.

<response_example>
{example}
</response_example>

If you have completed your assignment, please consult the first message about how to submit your solution (you will not be able to continue working on this task after that)."""
T0_UNTERMINATED = "Your last code block is not closed: end it with a line of three backticks (```)."
T0_EMPTY_BLOCK = "Your code block is empty: put one shell command in it."


@register
class ShellBlockTools(SchemaToolInterface):
    """T0: one shell tool; the action is the single ```bash block after a THOUGHT."""

    level, name = 0, "shell_block"
    description = "one shell tool; exactly one fenced shell block per response (mini-swe-agent)"
    submit_tool = "submit"
    tool_specs = T0_SPECS
    handlers: ClassVar[dict[str, str]] = {"bash": "_bash", "submit": "_bash"}

    def usage(self) -> str:
        """Returns mini-swe-agent's response-format instructions."""
        return T0_USAGE

    def example(self) -> str:
        """Returns a THOUGHT and one shell block."""
        return T0_EXAMPLE

    def parse(self, text: str) -> ParsedOutput:
        """Returns the one shell block's command as a ``bash`` (or ``submit``) call."""
        blocks, unterminated = fenced_blocks(text)
        actions = [b for b in blocks if b.info in T0_SHELL_LANGS]
        if len(actions) != 1:
            message = T0_FORMAT_ERROR.format(count=len(actions), example=T0_EXAMPLE)
            if unterminated and not actions:
                message = f"{T0_UNTERMINATED}\n\n{message}"
            return ParsedOutput(error=message, error_kind="format")
        command = actions[0].body
        if not command.strip():
            return ParsedOutput(error=T0_EMPTY_BLOCK, error_kind="format")
        thought = _THOUGHT_LABEL.sub("", text[: actions[0].start].strip(), count=1)
        name = "submit" if _SUBMIT_COMMAND.match(command.lstrip("\n")) else "bash"
        return ParsedOutput(calls=(ToolCall(name, {"command": command}),), thought=thought)

    def _bash(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        result = sandbox.exec(arguments["command"])
        first, newline, rest = result.stdout.lstrip().partition("\n")
        if first.strip() == SUBMIT_MARKER:  # mini-swe-agent: the marker line ends the episode
            answer = rest.strip() if newline else ""
            return replace(shell_output("submit", result, output=answer), submitted=answer)
        return shell_output("bash", result)

    def render(self, action: Action, thought: str = "") -> str:
        """Returns a THOUGHT and one shell block performing ``action``."""
        command = self.render_command(action)
        prefix = f"THOUGHT: {thought.strip()}\n\n" if thought.strip() else ""
        return f"{prefix}```bash\n{command}\n```"

    @staticmethod
    def render_command(action: Action) -> str:
        """Returns the shell command of ``action`` (safe to put in a fenced block)."""
        if action.kind == "write_file":
            path, content = str(action.path), str(action.content)
            return heredoc_write_command(path, content) or python_write_command(path, content)
        if action.kind == "edit_file":
            return python_edit_command(str(action.path), str(action.old), str(action.new))
        if action.kind == "run":
            command = str(action.command)
            return f"eval {ansi_c_quote(command)}" if breaks_fence(command) else command
        answer = action.answer or ""
        if not answer:
            return f"echo {SUBMIT_MARKER}"
        quoted = ansi_c_quote(answer) if breaks_fence(answer) else shlex.quote(answer)
        return f"echo {SUBMIT_MARKER} && printf '%s\\n' {quoted}"


# ============================================================================================
# T1: shell_editor_json (SWE-agent / OpenHands function calling)
# ============================================================================================

T1_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "bash",
        "Execute a bash command in the terminal. The working directory persists between calls."
        " Commands are not interactive; long outputs are truncated.",
        object_schema(
            {"command": {"type": "string", "description": "The bash command to execute."}},
            ["command"],
        ),
    ),
    ToolSpec(
        "str_replace_editor",
        "Custom editing tool for viewing, creating and editing files.\n"
        "* `view` on a file shows `cat -n` numbered lines (optionally `view_range`); on a"
        " directory it lists files up to 2 levels deep.\n"
        "* `create` writes `file_text` to `path` (creating parent directories; an existing file"
        " is overwritten).\n"
        "* `str_replace` replaces `old_str` with `new_str` (empty when omitted); `old_str` must"
        " match EXACTLY ONE location of the file, whitespace included.\n"
        "* `insert` inserts `new_str` after line `insert_line` (0 inserts at the top).",
        object_schema(
            {
                "command": {
                    "type": "string",
                    "enum": ["view", "create", "str_replace", "insert"],
                    "description": "The command to run.",
                },
                "path": {
                    "type": "string",
                    "description": f"Path of the file or directory, e.g. `{WORKSPACE_MOUNT}/file.py`.",
                },
                "file_text": {"type": "string", "description": "Content of the file (`create`)."},
                "old_str": {"type": "string", "description": "Text to replace (`str_replace`)."},
                "new_str": {"type": "string", "description": "New text (`str_replace`, `insert`)."},
                "insert_line": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Insert `new_str` after this line (`insert`).",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                    "description": "[start, end] lines to show (`view`); end -1 means to the end.",
                },
            },
            ["command", "path"],
        ),
    ),
    ToolSpec(
        "submit",
        "Submit your work and end the task; `answer` is the final answer (may be empty when the"
        " task asks for no answer).",
        object_schema({"answer": {"type": "string", "description": "The final answer."}}, ["answer"]),
    ),
)

T1_USAGE_HEAD = """You have access to the following functions. To call one, reply with a short discussion of what you will do next, followed by EXACTLY ONE function call: a JSON object {"name": <function name>, "arguments": <arguments object>}, preferably in a ```json block:

```json
{"name": "bash", "arguments": {"command": "ls -la"}}
```

Call exactly one function per response. File paths are absolute under """ + WORKSPACE_MOUNT + """ (paths relative to it work too)."""
T1_FUNCTION_TEMPLATE = """---- BEGIN FUNCTION #{index}: {name} ----
Description: {description}
Parameters:
{parameters}
---- END FUNCTION #{index} ----"""
T1_EXAMPLE = """I will first look at the files in the workspace.

```json
{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/workspace"}}
```"""
T1_FORMAT_ERROR = """{problem}

Reply with exactly one function call as a JSON object, for example:
{example}"""

# OpenHands / SWE-agent editor messages.
T1_VIEW_FILE = "Here's the result of running `cat -n` on {path}:\n{numbered}\n"
T1_VIEW_DIR = "Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{listing}\n"
T1_CLIPPED = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you."
    " You should retry this tool after you have searched inside the file with `grep -n` in order"
    " to find the line numbers of what you are looking for.</NOTE>"
)
T1_CREATED = "File created successfully at: {path}"
T1_EDITED = (
    "The file {path} has been edited. Here's the result of running `cat -n` on a snippet of"
    " {path}:\n{snippet}\nReview the changes and make sure they are as expected. Edit the file"
    " again if necessary."
)
T1_INSERTED = (
    "The file {path} has been edited. Here's the result of running `cat -n` on a snippet of the"
    " edited file:\n{snippet}\nReview the changes and make sure they are as expected (correct"
    " indentation, no duplicate lines, etc). Edit the file again if necessary."
)
T1_NOT_FOUND = "No replacement was performed, old_str `{old}` did not appear verbatim in {path}."
T1_NOT_UNIQUE = (
    "No replacement was performed. Multiple occurrences ({count}) of old_str `{old}` in lines"
    " {lines}. Please ensure it is unique."
)
T1_NO_PATH = "Invalid `path` parameter: {path}. The path {path} does not exist. Please provide a valid path."
T1_DIR_ONLY_VIEW = (
    "Invalid `path` parameter: {path}. The path {path} is a directory and only the `view`"
    " command can be used on directories."
)
T1_NEEDS = "Parameter `{param}` is required for command: {command}."
T1_BAD_INSERT = (
    "Invalid `insert_line` parameter: {line}. It should be within the range of lines of the file: [0, {count}]"
)
T1_BAD_RANGE = "Invalid `view_range`: {range}. {reason}"
T1_SUBMITTED = "Your answer has been submitted."


def _describe_parameters(spec: ToolSpec) -> str:
    schema = spec.parameters
    required = set(schema.get("required", []))
    lines = []
    for index, (name, prop) in enumerate(schema.get("properties", {}).items(), start=1):
        kind = prop.get("type", "any")
        kind = " or ".join(kind) if isinstance(kind, list) else kind
        need = "required" if name in required else "optional"
        allowed = f" Allowed values: {json.dumps(prop['enum'])}." if "enum" in prop else ""
        lines.append(f"  ({index}) {name} ({kind}, {need}): {prop.get('description', '')}{allowed}")
    return "\n".join(lines) or "  (none)"


@register
class ShellEditorJsonTools(SchemaToolInterface):
    """T1: ``bash``, ``str_replace_editor`` and ``submit``, one JSON call per response."""

    level, name = 1, "shell_editor_json"
    description = "bash, a str_replace editor and submit; one JSON function call per response (SWE-agent/OpenHands)"
    submit_tool = "submit"
    tool_specs = T1_SPECS
    handlers: ClassVar[dict[str, str]] = {
        "bash": "_bash", "str_replace_editor": "_editor", "submit": "_submit",
    }

    def usage(self) -> str:
        """Returns the function-calling manual (OpenHands' in-context function format)."""
        functions = [
            T1_FUNCTION_TEMPLATE.format(
                index=i, name=spec.name, description=spec.description,
                parameters=_describe_parameters(spec),
            )
            for i, spec in enumerate(self.specs(), start=1)
        ]
        return T1_USAGE_HEAD + "\n\n" + "\n\n".join(functions)

    def example(self) -> str:
        """Returns a discussion and one JSON call in a fence."""
        return T1_EXAMPLE

    def _format_error(self, problem: str) -> ParsedOutput:
        message = T1_FORMAT_ERROR.format(problem=problem, example=T1_EXAMPLE)
        return ParsedOutput(error=message, error_kind="format")

    def parse(self, text: str) -> ParsedOutput:
        """Returns the one JSON function call in ``text`` (fenced or bare), or an error."""
        found = find_json_objects(text)
        known = {spec.name for spec in self.tool_specs}

        def is_call(value: Any) -> bool:
            return isinstance(value, dict) and "name" in value and (
                "arguments" in value or value.get("name") in known)

        candidates = [value for value in found.objects if is_call(value)]
        if any(isinstance(value, list) and any(is_call(v) for v in value) for value in found.objects):
            return self._format_error(
                "Found a JSON array of function calls; reply with ONE function call object."
            )
        if not candidates:
            if found.first_error and not found.objects:
                return self._format_error(f"Your function call is not valid JSON: {found.first_error}.")
            return self._format_error("No function call found in your response.")
        if len(candidates) > 1:
            return self._format_error(
                f"Found {len(candidates)} function calls; call exactly ONE function per response."
            )
        call = call_from_json(candidates[0])
        if isinstance(call, str):
            return self._format_error(f"Malformed function call: {call}.")
        problem = self.check_call(call)
        if problem is not None:
            return ParsedOutput(error=problem, error_kind="tool")
        thought = text[: max(found.start, 0)].strip()
        if thought.endswith("```json") or thought.endswith("```"):
            thought = thought.rsplit("```", 1)[0].strip()
        return ParsedOutput(calls=(call,), thought=thought)

    # ---- tools ----
    def _bash(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        return shell_output("bash", sandbox.exec(arguments["command"]))

    def _submit(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        return ToolOutput(tool="submit", output=T1_SUBMITTED, submitted=arguments["answer"])

    def _editor(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        command = arguments["command"]
        relative = resolve_path(arguments["path"], sandbox)
        shown = display_path(relative)
        if command == "create":
            if "file_text" not in arguments:
                raise ToolError(T1_NEEDS.format(param="file_text", command=command))
            if is_dir(sandbox, relative):
                raise ToolError(T1_DIR_ONLY_VIEW.format(path=shown))
            sandbox.write_file(relative, arguments["file_text"])
            return ToolOutput(tool="str_replace_editor", output=T1_CREATED.format(path=shown),
                              changed_paths=(relative,))
        if not sandbox.exists(relative):
            raise ToolError(T1_NO_PATH.format(path=shown))
        if is_dir(sandbox, relative):
            if command != "view":
                raise ToolError(T1_DIR_ONLY_VIEW.format(path=shown))
            if "view_range" in arguments:
                raise ToolError("The `view_range` parameter is not allowed when `path` points to a directory.")
            return ToolOutput(tool="str_replace_editor", output=self._view_dir(sandbox, relative))
        if command == "view":
            return ToolOutput(tool="str_replace_editor",
                              output=self._view_file(sandbox, relative, arguments.get("view_range")))
        if command == "str_replace":
            return self._str_replace(sandbox, relative, arguments)
        return self._insert(sandbox, relative, arguments)

    @staticmethod
    def _view_dir(sandbox: Sandbox, relative: str) -> str:
        entries: list[str] = []

        def walk(directory: str, depth: int) -> None:
            for name in sandbox.list_dir(directory):
                if name.startswith("."):
                    continue
                child = posixpath.normpath(posixpath.join(directory, name.rstrip("/")))
                entries.append(display_path(child) + ("/" if name.endswith("/") else ""))
                if name.endswith("/") and depth < 2:
                    walk(child, depth + 1)

        walk(relative, 1)
        listing = "\n".join([display_path(relative), *entries])
        return T1_VIEW_DIR.format(path=display_path(relative), listing=listing)

    @staticmethod
    def _view_file(sandbox: Sandbox, relative: str, view_range: list[int] | None) -> str:
        lines = split_lines(read_text(sandbox, relative))
        first = 1
        if view_range is not None:
            start, end = view_range
            count = len(lines)
            if not 1 <= start <= max(count, 1):
                reason = f"Its first element `{start}` should be within the range of lines of the file: [1, {count}]"
                raise ToolError(T1_BAD_RANGE.format(range=view_range, reason=reason))
            if end != -1 and end < start:
                reason = f"Its second element `{end}` should be larger or equal than its first `{start}`"
                raise ToolError(T1_BAD_RANGE.format(range=view_range, reason=reason))
            if end != -1 and end > count:
                reason = f"Its second element `{end}` should be smaller than the number of lines in the file: `{count}`"
                raise ToolError(T1_BAD_RANGE.format(range=view_range, reason=reason))
            lines = lines[start - 1:] if end == -1 else lines[start - 1:end]
            first = start
        numbered = number_lines(lines, first)
        if len(numbered) > MAX_VIEW_CHARS:
            numbered = numbered[:MAX_VIEW_CHARS] + "\n" + T1_CLIPPED
        return T1_VIEW_FILE.format(path=display_path(relative), numbered=numbered)

    @staticmethod
    def _str_replace(sandbox: Sandbox, relative: str, arguments: dict[str, Any]) -> ToolOutput:
        if "old_str" not in arguments:
            raise ToolError(T1_NEEDS.format(param="old_str", command="str_replace"))
        old, new = arguments["old_str"], arguments.get("new_str", "")
        shown = display_path(relative)
        if not old:
            raise ToolError("Parameter `old_str` must not be empty for command: str_replace.")
        text = read_text(sandbox, relative)
        count = text.count(old)
        if count == 0:
            raise ToolError(T1_NOT_FOUND.format(old=old, path=shown))
        if count > 1:
            starts, position = [], text.find(old)
            while position != -1:
                starts.append(text.count("\n", 0, position) + 1)
                position = text.find(old, position + 1)
            raise ToolError(T1_NOT_UNIQUE.format(count=count, old=old, lines=starts))
        first_line = text[: text.find(old)].count("\n")
        updated = text.replace(old, new, 1)
        sandbox.write_file(relative, updated)
        snippet = edit_snippet(updated, first_line, new.count("\n") + 1)
        return ToolOutput(tool="str_replace_editor", output=T1_EDITED.format(path=shown, snippet=snippet),
                          changed_paths=(relative,))

    @staticmethod
    def _insert(sandbox: Sandbox, relative: str, arguments: dict[str, Any]) -> ToolOutput:
        for param in ("insert_line", "new_str"):
            if param not in arguments:
                raise ToolError(T1_NEEDS.format(param=param, command="insert"))
        line, new = arguments["insert_line"], arguments["new_str"]
        text = read_text(sandbox, relative)
        count = len(split_lines(text))
        if not 0 <= line <= count:
            raise ToolError(T1_BAD_INSERT.format(line=line, count=count))
        # Insert whole lines: one trailing newline of new_str is the line end, not an extra line.
        new_lines = (new[:-1] if new.endswith("\n") else new).split("\n")
        pieces = text.split("\n")
        updated = "\n".join(pieces[:line] + new_lines + pieces[line:])
        sandbox.write_file(relative, updated)
        snippet = edit_snippet(updated, line, len(new_lines))
        shown = display_path(relative)
        return ToolOutput(tool="str_replace_editor", output=T1_INSERTED.format(path=shown, snippet=snippet),
                          changed_paths=(relative,))

    def render(self, action: Action, thought: str = "") -> str:
        """Returns a discussion and one JSON call performing ``action``."""
        if action.kind == "write_file":
            call = {"name": "str_replace_editor", "arguments": {
                "command": "create", "path": display_path(str(action.path)), "file_text": action.content}}
        elif action.kind == "edit_file":
            call = {"name": "str_replace_editor", "arguments": {
                "command": "str_replace", "path": display_path(str(action.path)),
                "old_str": action.old, "new_str": action.new}}
        elif action.kind == "run":
            call = {"name": "bash", "arguments": {"command": action.command}}
        else:
            call = {"name": "submit", "arguments": {"answer": action.answer or ""}}
        prefix = f"{thought.strip()}\n\n" if thought.strip() else ""
        return f"{prefix}```json\n{json.dumps(call, ensure_ascii=False)}\n```"


# ============================================================================================
# T2: fine_grained_tagged (Claude Code tool set, Hermes / Qwen <tool_call> syntax)
# ============================================================================================

T2_MAX_CALLS = 5  # calls per response, run in order
T2_READ_LIMIT = 2000  # lines Read returns by default (Claude Code)
T2_LINE_CHARS = 2000  # longer lines are cut in Read output (Claude Code)
T2_GLOB_RESULTS = 100  # Glob results shown (Claude Code)
T2_SEARCH_CHARS = 20000  # Grep output kept
T2_MAX_TIMEOUT_MS = 600000

T2_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "Read",
        "Reads a file from the workspace. Output is `cat -n` style: line numbers starting at 1."
        f" By default reads up to {T2_READ_LIMIT} lines from the start; `offset` (the line"
        " number to start from) and `limit` (the number of lines) read a part of a long file.",
        object_schema(
            {
                "file_path": {"type": "string", "description": f"Absolute path (under {WORKSPACE_MOUNT}) of the file."},
                "offset": {"type": "integer", "minimum": 0, "description": "Line number to start reading from."},
                "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to read."},
            },
            ["file_path"],
        ),
    ),
    ToolSpec(
        "Write",
        "Writes a file, overwriting it if it exists and creating parent directories.",
        object_schema(
            {
                "file_path": {"type": "string", "description": "Absolute path of the file to write."},
                "content": {"type": "string", "description": "The complete content of the file."},
            },
            ["file_path", "content"],
        ),
    ),
    ToolSpec(
        "Edit",
        "Performs an exact string replacement in a file. `old_string` must occur exactly once"
        " unless `replace_all` is true. An empty `old_string` creates a new file.",
        object_schema(
            {
                "file_path": {"type": "string", "description": "Absolute path of the file to modify."},
                "old_string": {"type": "string", "description": "The text to replace."},
                "new_string": {"type": "string", "description": "The text to replace it with."},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
            },
            ["file_path", "old_string", "new_string"],
        ),
    ),
    ToolSpec(
        "Bash",
        "Executes a bash command in a persistent shell session (the working directory persists)."
        f" Optional timeout in milliseconds (max {T2_MAX_TIMEOUT_MS}).",
        object_schema(
            {
                "command": {"type": "string", "description": "The command to execute."},
                "timeout": {"type": "integer", "minimum": 1, "maximum": T2_MAX_TIMEOUT_MS,
                            "description": "Timeout in milliseconds."},
                "description": {"type": "string", "description": "What the command does, in 5-10 words."},
            },
            ["command"],
        ),
    ),
    ToolSpec(
        "Grep",
        "Searches file contents with a regular expression (Python `re` syntax), recursively"
        " under `path` (default: the workspace). `glob` filters files (e.g. \"*.py\","
        " \"*.{ts,tsx}\"); `output_mode` is \"files_with_matches\" (default), \"content\""
        " (matching lines as path:line:text) or \"count\".",
        object_schema(
            {
                "pattern": {"type": "string", "description": "The regular expression to search for."},
                "path": {"type": "string", "description": "File or directory to search in."},
                "glob": {"type": "string", "description": "Glob pattern that file names must match."},
                "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"],
                                "description": "What to show."},
                "-i": {"type": "boolean", "description": "Case insensitive search."},
            },
            ["pattern"],
        ),
    ),
    ToolSpec(
        "Glob",
        "Finds files by name with a glob pattern such as \"**/*.py\" or \"src/**/*.ts\","
        " relative to `path` (default: the workspace). Returns matching file paths, sorted.",
        object_schema(
            {
                "pattern": {"type": "string", "description": "The glob pattern to match files against."},
                "path": {"type": "string", "description": "The directory to search in."},
            },
            ["pattern"],
        ),
    ),
    ToolSpec(
        "Finish",
        "Ends the task. `result` is the final answer (empty when the task asks for no answer).",
        object_schema({"result": {"type": "string", "description": "The final answer."}}, ["result"]),
    ),
)

# The Hermes / Qwen tool-use instructions (also what `harnessrl serve` renders client tools with).
HERMES_TOOL_USE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""
T2_USAGE = HERMES_TOOL_USE + """

# Tool use notes
- You may make up to {max_calls} tool calls in one response; they run in order.
- File paths are absolute paths under {workspace} (relative paths are taken from {workspace}).
- Read a file before editing it; Edit's old_string must match the file exactly, whitespace included.
- Prefer Read, Grep and Glob over cat, grep and find in Bash.
- When the task is done, call Finish with your final answer."""
T2_EXAMPLE = """I'll start by looking for the Python files in the workspace.

<tool_call>
{"name": "Glob", "arguments": {"pattern": "**/*.py"}}
</tool_call>"""
T2_FORMAT_ERROR = """{problem}

Call tools with <tool_call></tool_call> tags around a JSON object, for example:
{example}"""

# Claude Code tool messages.
T2_EMPTY_FILE = "<system-reminder>Warning: the file exists but the contents are empty.</system-reminder>"
T2_SHORT_FILE = (
    "<system-reminder>Warning: the file exists but is shorter than the provided offset ({offset})."
    " The file has {count} lines.</system-reminder>"
)
T2_MORE_LINES = "\n... ({remaining} more lines; use offset and limit to read them)"
T2_IS_DIR = "EISDIR: illegal operation on a directory, read '{path}'. Use Glob or Bash `ls` to list a directory."
T2_NO_FILE = "File does not exist: {path}"
T2_CREATED = "File created successfully at: {path}"
T2_UPDATED = "The file {path} has been updated. Here's the result of running `cat -n` on a snippet of the edited file:\n{snippet}"
T2_REPLACED_ALL = "The file {path} has been updated. All {count} occurrences of the string were successfully replaced."
T2_NOT_FOUND = "String to replace not found in file.\nString: {old}"
T2_NOT_UNIQUE = (
    "Found {count} matches of the string to replace, but replace_all is false. To replace all"
    " occurrences, set replace_all to true. To replace only one occurrence, please provide more"
    " context to uniquely identify the instance.\nString: {old}"
)
T2_SAME = "No changes to make: old_string and new_string are exactly the same."
T2_EXISTS = "Cannot create new file - file already exists."
T2_NO_MATCHES = {"files_with_matches": "No files found", "content": "No matches found", "count": "No matches found"}
T2_NO_GLOB = "No files found"
T2_GLOB_TRUNCATED = "(Results are truncated. Consider using a more specific path or pattern.)"
T2_FINISHED = "Task finished."

# Grep and Glob run inside the sandbox (time limits apply to a catastrophic pattern). They get
# their arguments as one JSON argv, print display paths, and exit 1 when nothing matched.
GREP_PROGRAM = r'''
import fnmatch, json, os, re, sys
a = json.loads(sys.argv[1])
root = a["root"]
base = os.path.normpath(os.path.join(root, a["path"]))
try:
    rx = re.compile(a["pattern"], re.IGNORECASE if a["ignore_case"] else 0)
except (re.error, OverflowError, RecursionError, ValueError) as e:
    sys.stderr.write("invalid regular expression: %s\n" % e)
    sys.exit(2)
def expand(g):
    m = re.search(r"\{([^{}]*)\}", g)
    if not m:
        return [g]
    return [x for alt in m.group(1).split(",") for x in expand(g[:m.start()] + alt + g[m.end():])]
globs = expand(a["glob"]) if a["glob"] else []
def wanted(rel):
    name = rel.rsplit("/", 1)[-1]
    return not globs or any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(rel, g) for g in globs)
def files():
    if not os.path.isdir(base):
        yield base
        return
    for d, dirs, names in os.walk(base):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        for n in sorted(names):
            p = os.path.join(d, n)
            if not n.startswith(".") and not os.path.islink(p) and os.path.isfile(p):
                yield p
rows, found, size, cut = [], 0, 0, False
for p in files():
    rel = os.path.relpath(p, root)
    if not wanted(rel):
        continue
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError:
        continue
    if b"\0" in data[:8192]:
        continue
    lines = data.decode("utf-8", "replace").split("\n")
    hits = [(i, l) for i, l in enumerate(lines, 1) if rx.search(l)]
    if not hits:
        continue
    found += 1
    shown = a["display"] + "/" + rel
    if a["mode"] == "content":
        new = ["%s:%d:%s" % (shown, i, l[:500]) for i, l in hits]
    elif a["mode"] == "count":
        new = ["%s:%d" % (shown, len(hits))]
    else:
        new = [shown]
    for r in new:
        size += len(r) + 1
        if size > a["max_chars"]:
            cut = True
            break
        rows.append(r)
    if cut:
        break
if not found:
    sys.exit(1)
if a["mode"] == "files_with_matches":
    rows.insert(0, "Found %d file%s" % (found, "" if found == 1 else "s"))
if cut:
    rows.append("... (output truncated; narrow the pattern, path or glob)")
print("\n".join(rows))
'''
GLOB_PROGRAM = r'''
import glob, json, os, sys
a = json.loads(sys.argv[1])
root = os.path.realpath(a["root"])
base = os.path.join(root, a["path"])
rows = set()
for p in glob.glob(os.path.join(glob.escape(base), a["pattern"]), recursive=True):
    real = os.path.realpath(p)
    rel = os.path.normpath(os.path.relpath(p, root))
    if rel.startswith("..") or not (real == root or real.startswith(root + os.sep)):
        continue
    if os.path.isfile(p):
        rows.add(rel)
if not rows:
    sys.exit(1)
shown = [a["display"] + "/" + r for r in sorted(rows)]
print("\n".join(shown[: a["limit"]]))
if len(shown) > a["limit"]:
    print(a["truncated"])
'''


def run_program(sandbox: Sandbox, program: str, arguments: dict[str, Any]) -> ExecResult:
    """Runs a Python ``program`` inside the sandbox with ``arguments`` as one JSON argv."""
    argument = json.dumps(arguments, ensure_ascii=False)
    return sandbox.exec(f"python3 -I -c {shlex.quote(program)} {shlex.quote(argument)}")


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_TOOL_CALL_OPEN = "<tool_call>"


def tagged_bodies(text: str) -> tuple[list[str], int]:
    """Returns the bodies of ``<tool_call>`` blocks (an unterminated last one included) and
    where the first block starts (-1 when none)."""
    bodies: list[str] = []
    end = 0
    for match in _TOOL_CALL.finditer(text):
        bodies.append(match.group(1))
        end = match.end()
    rest = text.find(_TOOL_CALL_OPEN, end)
    if rest != -1:  # generation stopped before the closing tag
        bodies.append(text[rest + len(_TOOL_CALL_OPEN):])
    return bodies, text.find(_TOOL_CALL_OPEN)


def tag_safe_json(value: Any) -> str:
    """Returns ``value`` as JSON that cannot close an XML-like tag (``</`` is written ``<\\/``)."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


@register
class FineGrainedTaggedTools(SchemaToolInterface):
    """T2: Read, Write, Edit, Bash, Grep, Glob and Finish in ``<tool_call>`` tags."""

    level, name = 2, "fine_grained_tagged"
    description = "Read/Write/Edit/Bash/Grep/Glob/Finish in <tool_call> tags, several per response (Claude Code tools, Hermes syntax)"
    submit_tool = "Finish"
    tool_specs = T2_SPECS
    handlers: ClassVar[dict[str, str]] = {
        "Read": "_read", "Write": "_write", "Edit": "_edit", "Bash": "_bash",
        "Grep": "_grep", "Glob": "_glob", "Finish": "_finish",
    }

    def usage(self) -> str:
        """Returns the Hermes / Qwen tool-use system text with every tool's schema."""
        tools = "\n".join(json.dumps(spec.to_openai(), ensure_ascii=False) for spec in self.specs())
        return T2_USAGE.format(tools=tools, max_calls=T2_MAX_CALLS, workspace=WORKSPACE_MOUNT)

    def example(self) -> str:
        """Returns a sentence and one ``<tool_call>`` block."""
        return T2_EXAMPLE

    def _format_error(self, problem: str) -> ParsedOutput:
        return ParsedOutput(error=T2_FORMAT_ERROR.format(problem=problem, example=T2_EXAMPLE),
                            error_kind="format")

    def parse(self, text: str) -> ParsedOutput:
        """Returns the calls of every ``<tool_call>`` block in order, or an error."""
        bodies, start = tagged_bodies(text)
        if not bodies:
            return self._format_error("No tool call found in your response.")
        if len(bodies) > T2_MAX_CALLS:
            return self._format_error(
                f"Found {len(bodies)} tool calls; make at most {T2_MAX_CALLS} calls per response."
            )
        calls = []
        for index, body in enumerate(bodies, start=1):
            try:
                value = json.loads(body)
            except (ValueError, RecursionError) as exc:
                reason = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
                return self._format_error(f"Tool call #{index} is not valid JSON ({reason[:200]}).")
            call = call_from_json(value)
            if isinstance(call, str):
                return self._format_error(f"Tool call #{index} is malformed: {call}.")
            problem = self.check_call(call)
            if problem is not None:
                return ParsedOutput(error=problem, error_kind="tool")
            calls.append(call)
        return ParsedOutput(calls=tuple(calls), thought=text[:start].strip())

    # ---- tools ----
    def _read(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        relative = resolve_path(arguments["file_path"], sandbox)
        shown = display_path(relative)
        if is_dir(sandbox, relative):
            raise ToolError(T2_IS_DIR.format(path=shown))
        if not sandbox.exists(relative):
            raise ToolError(T2_NO_FILE.format(path=shown))
        lines = split_lines(read_text(sandbox, relative))
        if not lines:
            return ToolOutput(tool="Read", output=T2_EMPTY_FILE)
        offset = max(1, arguments.get("offset", 1))
        limit = arguments.get("limit", T2_READ_LIMIT)
        if offset > len(lines):
            return ToolOutput(tool="Read", output=T2_SHORT_FILE.format(offset=offset, count=len(lines)))
        chosen = [line[:T2_LINE_CHARS] for line in lines[offset - 1: offset - 1 + limit]]
        text = number_lines(chosen, offset)
        remaining = len(lines) - (offset - 1 + len(chosen))
        if remaining > 0 and "limit" not in arguments:
            text += T2_MORE_LINES.format(remaining=remaining)
        return ToolOutput(tool="Read", output=text)

    def _write(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        relative = resolve_path(arguments["file_path"], sandbox)
        shown = display_path(relative)
        existed = sandbox.exists(relative)
        sandbox.write_file(relative, arguments["content"])
        if not existed:
            output = T2_CREATED.format(path=shown)
        else:
            output = T2_UPDATED.format(path=shown, snippet=edit_snippet(arguments["content"], 0, 8))
        return ToolOutput(tool="Write", output=output, changed_paths=(relative,))

    def _edit(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        relative = resolve_path(arguments["file_path"], sandbox)
        shown = display_path(relative)
        old, new = arguments["old_string"], arguments["new_string"]
        if old == new:
            raise ToolError(T2_SAME)
        if not old:  # Claude Code: an empty old_string creates a new file
            if sandbox.exists(relative) and read_text(sandbox, relative):
                raise ToolError(T2_EXISTS)
            sandbox.write_file(relative, new)
            return ToolOutput(tool="Edit", output=T2_CREATED.format(path=shown), changed_paths=(relative,))
        if not sandbox.exists(relative):
            raise ToolError(T2_NO_FILE.format(path=shown))
        text = read_text(sandbox, relative)
        count = text.count(old)
        if count == 0:
            raise ToolError(T2_NOT_FOUND.format(old=old))
        if count > 1 and not arguments.get("replace_all", False):
            raise ToolError(T2_NOT_UNIQUE.format(count=count, old=old))
        if arguments.get("replace_all", False):
            sandbox.write_file(relative, text.replace(old, new))
            return ToolOutput(tool="Edit", output=T2_REPLACED_ALL.format(path=shown, count=count),
                              changed_paths=(relative,))
        first_line = text[: text.find(old)].count("\n")
        updated = text.replace(old, new, 1)
        sandbox.write_file(relative, updated)
        snippet = edit_snippet(updated, first_line, new.count("\n") + 1)
        return ToolOutput(tool="Edit", output=T2_UPDATED.format(path=shown, snippet=snippet),
                          changed_paths=(relative,))

    def _bash(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        timeout_ms = arguments.get("timeout")
        timeout = None if timeout_ms is None else timeout_ms / 1000.0
        return shell_output("Bash", sandbox.exec(arguments["command"], timeout=timeout))

    def _search_base(self, arguments: dict[str, Any], sandbox: Sandbox) -> str:
        relative = resolve_path(arguments.get("path") or ".", sandbox)
        if not sandbox.exists(relative):
            raise ToolError(f"Path does not exist: {display_path(relative)}")
        return relative

    def _grep(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        relative = self._search_base(arguments, sandbox)
        mode = arguments.get("output_mode", "files_with_matches")
        result = run_program(sandbox, GREP_PROGRAM, {
            "root": inside_root(sandbox), "path": relative, "pattern": arguments["pattern"],
            "glob": arguments.get("glob"), "mode": mode, "ignore_case": arguments.get("-i", False),
            "display": WORKSPACE_MOUNT, "max_chars": T2_SEARCH_CHARS,
        })
        return self._program_output("Grep", result, T2_NO_MATCHES[mode])

    def _glob(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        pattern = arguments["pattern"]
        if pattern.startswith("/"):  # an absolute pattern must lie under /workspace
            if not pattern.startswith(WORKSPACE_MOUNT + "/"):
                raise ToolError(f"pattern '{pattern}' is outside the workspace")
            pattern = pattern[len(WORKSPACE_MOUNT) + 1:]
        if not pattern:
            raise ToolError("the glob pattern is empty")
        relative = self._search_base(arguments, sandbox)
        result = run_program(sandbox, GLOB_PROGRAM, {
            "root": inside_root(sandbox), "path": relative, "pattern": pattern,
            "display": WORKSPACE_MOUNT, "limit": T2_GLOB_RESULTS, "truncated": T2_GLOB_TRUNCATED,
        })
        return self._program_output("Glob", result, T2_NO_GLOB)

    @staticmethod
    def _program_output(tool: str, result: ExecResult, nothing: str) -> ToolOutput:
        if result.exit_code == 1 and not result.timed_out:
            return ToolOutput(tool=tool, output=nothing, duration_s=result.duration_s)
        if not result.ok:
            message = (result.stderr or result.stdout).strip() or f"{tool} failed (exit code {result.exit_code})"
            return replace(error_output(tool, message), timed_out=result.timed_out,
                           duration_s=result.duration_s)
        return ToolOutput(tool=tool, output=result.stdout.rstrip("\n"), duration_s=result.duration_s,
                          truncated=result.truncated)

    def _finish(self, arguments: dict[str, Any], sandbox: Sandbox) -> ToolOutput:
        return ToolOutput(tool="Finish", output=T2_FINISHED, submitted=arguments["result"])

    def render(self, action: Action, thought: str = "") -> str:
        """Returns a sentence and one ``<tool_call>`` block performing ``action``."""
        if action.kind == "write_file":
            call = {"name": "Write", "arguments": {
                "file_path": display_path(str(action.path)), "content": action.content}}
        elif action.kind == "edit_file":
            call = {"name": "Edit", "arguments": {
                "file_path": display_path(str(action.path)), "old_string": action.old,
                "new_string": action.new}}
        elif action.kind == "run":
            call = {"name": "Bash", "arguments": {"command": action.command}}
        else:
            call = {"name": "Finish", "arguments": {"result": action.answer or ""}}
        prefix = f"{thought.strip()}\n\n" if thought.strip() else ""
        return f"{prefix}<tool_call>\n{tag_safe_json(call)}\n</tool_call>"

