"""T1 ``shell_editor_json`` (SWE-agent / OpenHands function calling): ``bash``,
``str_replace_editor`` and ``submit``; a response holds one ``{"name": ..., "arguments": ...}``
JSON object, bare or in a ```json fence."""

from __future__ import annotations

import json
import posixpath
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.harness.base import ParsedOutput, ToolOutput, ToolSpec
from harnessrl.harness.registry import register
from harnessrl.harness.tools.arguments import call_from_json, find_json_objects, object_schema
from harnessrl.harness.tools.common import (
    ToolError,
    display_path,
    edit_snippet,
    is_dir,
    number_lines,
    read_text,
    replayable,
    resolve_path,
    shell_output,
    split_lines,
)
from harnessrl.harness.tools.schema import SchemaToolInterface
from harnessrl.sandbox import WORKSPACE_MOUNT

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Action

MAX_VIEW_CHARS = 16000  # longest file view before it is clipped (OpenHands' MAX_RESPONSE_LEN)

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
        action = replayable(action)
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
