"""T0 ``shell_block`` (mini-swe-agent): one shell tool; a response is a THOUGHT and exactly one
fenced shell block; ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` submits and whatever the
same command prints after that line is the answer."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from harnessrl.harness.base import ParsedOutput, ToolCall, ToolOutput, ToolSpec
from harnessrl.harness.registry import register
from harnessrl.harness.tools.arguments import object_schema
from harnessrl.harness.tools.common import (
    ansi_c_quote,
    breaks_fence,
    fenced_blocks,
    heredoc_write_command,
    python_edit_command,
    python_write_command,
    replayable,
    shell_output,
)
from harnessrl.harness.tools.schema import SchemaToolInterface
from harnessrl.sandbox import WORKSPACE_MOUNT

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Action

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
        action = replayable(action)
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
