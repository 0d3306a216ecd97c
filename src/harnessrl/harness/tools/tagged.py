"""T2 ``fine_grained_tagged`` (the Claude Code tool set in Hermes / Qwen syntax): ``Read``,
``Write``, ``Edit``, ``Bash``, ``Grep``, ``Glob``, ``Finish``; up to five
``<tool_call>{json}</tool_call>`` blocks per response, run in order. Grep and Glob run as small
Python programs inside the sandbox."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.harness.base import ParsedOutput, ToolOutput, ToolSpec
from harnessrl.harness.registry import register
from harnessrl.harness.tools.arguments import call_from_json, object_schema
from harnessrl.harness.tools.common import (
    ToolError,
    display_path,
    edit_snippet,
    error_output,
    inside_root,
    is_dir,
    number_lines,
    read_text,
    replayable,
    resolve_path,
    shell_output,
    split_lines,
)
from harnessrl.harness.tools.schema import SchemaToolInterface
from harnessrl.harness.tools.tool_call import tagged_bodies, tool_call_text, tools_instructions
from harnessrl.sandbox import WORKSPACE_MOUNT

if TYPE_CHECKING:
    from harnessrl.sandbox import ExecResult, Sandbox
    from harnessrl.tasks.model import Action

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

T2_USAGE_NOTES = """

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
        notes = T2_USAGE_NOTES.format(max_calls=T2_MAX_CALLS, workspace=WORKSPACE_MOUNT)
        return tools_instructions(self.specs()) + notes

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
        action = replayable(action)
        arguments: dict[str, Any]
        if action.kind == "write_file":
            name, arguments = "Write", {"file_path": display_path(str(action.path)), "content": action.content}
        elif action.kind == "edit_file":
            name, arguments = "Edit", {
                "file_path": display_path(str(action.path)), "old_string": action.old,
                "new_string": action.new}
        elif action.kind == "run":
            name, arguments = "Bash", {"command": action.command}
        else:
            name, arguments = "Finish", {"result": action.answer or ""}
        prefix = f"{thought.strip()}\n\n" if thought.strip() else ""
        return prefix + tool_call_text(name, arguments)
