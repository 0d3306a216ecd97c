"""``codex_exec`` (Codex CLI), a tool interface outside the space: ``exec_command`` (argv or
shell string, ``workdir``, ``timeout_ms``), ``apply_patch`` with Codex's patch grammar
(``codex_patch.py``) and ``final_answer``.

Calls are written ``<function=NAME>BODY</function>`` where BODY is the JSON arguments, except
for ``apply_patch`` whose body is the raw patch (Codex's freeform tool; ``{"input": patch}`` is
accepted too). Up to five calls per response, run in order.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.harness.base import ParsedOutput, ToolCall, ToolOutput, ToolSpec
from harnessrl.harness.registry import register
from harnessrl.harness.tools.arguments import call_from_json, object_schema, tag_safe_json
from harnessrl.harness.tools.codex_patch import (
    ADD_FILE,
    PATCH_BEGIN,
    PATCH_END,
    UPDATE_FILE,
    apply_patch,
    parse_patch,
)
from harnessrl.harness.tools.common import (
    ToolError,
    display_path,
    inside_root,
    is_dir,
    replayable,
    resolve_path,
    shell_output,
    split_lines,
)
from harnessrl.harness.tools.schema import SchemaToolInterface

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Action

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
        action = replayable(action)
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
