"""Gold replay through a client's own tools: a scripted policy for `harnessrl serve`.

When an external agent (mini-swe-agent, Claude Code, Codex, opencode, ...) talks to
`harnessrl serve`, every request reaches the policy with a ``ServeContext`` (API, session,
normalized messages and tools). `GoldReplayPolicy` maps the session to a task and answers
with the task's gold solution, one step per request, in the client's own action syntax:

* a request with tools: a call of the client's shell tool (found by name, its command
  argument found from the tool's JSON schema) in the server's ``<tool_call>`` syntax, running
  the gold action's shell form; after the last action, a final text answer (the task's
  answer, if it has one) and no call, which ends a tool-calling agent's turn;
* a request without tools whose prompt asks for a fenced shell block (mini-swe-agent's text
  format): a ``THOUGHT:`` line and one fenced block in the fence the prompt names, and at the
  end the submit command the prompt names (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``),
  with the answer on the lines after it;
* any other request without tools (titles, summaries, topic checks): a short plain text.

The step is the number of earlier assistant turns that acted (a tool call, or a fenced
block), so the policy keeps no state and a retried request gets the same answer.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harnessrl.harness.chat import ByteTokenizer, ChatTokenizer
from harnessrl.policy.base import (
    ConversationView,
    Generation,
    GenerationRequest,
    Policy,
    RequestContext,
)
from harnessrl.policy.scripted import _generation, describe_action
from harnessrl.tasks.model import Action, Task

SHELL_TOOL_NAMES = ("bash", "shell", "exec_command", "shell_command", "local_shell",
                    "run_shell_command", "execute_command", "run_command", "exec", "terminal")
"""Names of shell tools, in order of preference (compared case-insensitively)."""

MINI_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_FENCE = re.compile(r"```([A-Za-z0-9_]+)\s*\n")
_TOOL_CALL = "<tool_call>"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def session_key(task_id: str) -> str:
    """Returns ``task_id`` with every character that is not URL-path safe replaced by ``_``."""
    return _UNSAFE.sub("_", task_id)


def session_name(task_id: str, run: int = 0) -> str:
    """Returns the session (a URL path segment) of run ``run`` of a task: ``<key>@<run>``."""
    return f"{session_key(task_id)}@{int(run)}"


def session_task_key(session: str) -> str:
    """Returns the task key of a session name ``<key>`` or ``<key>@<run>``."""
    return session.rsplit("@", 1)[0] if "@" in session else session


def _shell_tool(tools: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    by_name = {str(tool.get("name", "")).lower(): tool for tool in tools}
    for name in SHELL_TOOL_NAMES:
        if name in by_name:
            return by_name[name]
    return None


def shell_arguments(tool: Mapping[str, Any], command: str, description: str) -> dict[str, Any]:
    """Returns arguments that run ``command`` with ``tool``, read from its JSON schema: the
    command goes to ``command`` / ``cmd`` / ``script`` (as a string, or as ``["bash", "-lc",
    command]`` where the schema wants an array); other required string fields get
    ``description``."""
    schema = tool.get("parameters") or {}
    properties: Mapping[str, Any] = schema.get("properties") or {}
    key = next((k for k in ("command", "cmd", "script", "commands") if k in properties), "command")
    wants_array = (properties.get(key) or {}).get("type") == "array"
    arguments: dict[str, Any] = {key: ["bash", "-lc", command] if wants_array else command}
    for name in schema.get("required") or ():
        if name in arguments:
            continue
        kind = (properties.get(name) or {}).get("type")
        if kind == "string":
            arguments[name] = description[:80]
        elif kind in ("integer", "number") and "timeout" in name:
            arguments[name] = 120_000 if name.endswith("ms") else 120
        elif kind == "boolean":
            arguments[name] = False
    return arguments


def _safe_block(command: str, fence_breaker: str) -> str:
    """Returns ``command``, or an equivalent ``base64 -d | bash`` when its text would end the
    block it is written in (a ``` line inside a heredoc)."""
    if fence_breaker not in command:
        return command
    encoded = base64.b64encode(command.encode("utf-8")).decode("ascii")
    return f"printf %s {encoded} | base64 -d | bash"


def _text_of(messages: Sequence[Mapping[str, Any]], roles: tuple[str, ...]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages if m.get("role") in roles)


class GoldReplayPolicy(Policy):
    """Answers `harnessrl serve` requests with the gold solution of the session's task.

    ``tasks`` is a sequence of tasks, or a function from a session's task key (`session_key`
    of the task id) to a task. A request whose session names no known task gets an error
    generation, which the server reports. Sessions are named with `session_name`.
    """

    name = "gold-replay"

    def __init__(self, tasks: Sequence[Task] | Callable[[str], Task | None],
                 tokenizer: ChatTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        if callable(tasks):
            self._lookup = tasks
        else:
            by_key = {session_key(task.id): task for task in tasks}
            self._lookup = by_key.get

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            text, error = self.reply(request.context)
            if error:
                out.append(Generation([], [], "error", error=error))
            else:
                out.append(_generation(self.tokenizer, text, request.params.max_new_tokens))
        return out

    def reply(self, context: RequestContext | None) -> tuple[str, str | None]:
        """Returns (completion text, None), or ("", error) when the request cannot be answered."""
        if not isinstance(context, ConversationView):
            return "", "the gold replay policy needs a ServeContext (serve the policy with harnessrl serve)"
        messages, session = context.messages, context.session
        task = self._lookup(session_task_key(session)) if session else None
        if task is None:
            return "", f"the gold replay policy knows no task for session {session!r}"
        actions = [a for a in task.gold if a.kind != "submit"]
        answer = next((a.answer or "" for a in task.gold if a.kind == "submit"), "")
        tools = list(context.tools or ())
        if tools:
            return self._tool_reply(tools, messages, actions, answer)
        prompt = _text_of(messages, ("system", "user"))
        fence = _FENCE.search(prompt)
        if fence is not None and MINI_SUBMIT in prompt:
            return self._text_reply(fence.group(1), messages, actions, answer), None
        # A side request (title, summary, topic check): short plain text, no action.
        return f"harnessrl task {task.id}", None

    @staticmethod
    def _tool_reply(tools: list[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]],
                    actions: list[Action], answer: str) -> tuple[str, str | None]:
        from harnessrl.harness.tools.tool_call import tool_call_text

        tool = _shell_tool(tools)
        if tool is None:
            names = ", ".join(str(t.get("name")) for t in tools)
            return "", f"the gold replay policy found no shell tool among the client's tools ({names})"
        step = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        if step >= len(actions):
            return (answer.strip() or "Done: the task is complete."), None
        action = actions[step]
        thought = describe_action(action)
        return f"{thought}\n{tool_call_text(str(tool['name']), shell_arguments(tool, action.as_shell(), thought))}", None

    @staticmethod
    def _text_reply(fence: str, messages: Sequence[Mapping[str, Any]], actions: list[Action],
                    answer: str) -> str:
        step = sum(1 for m in messages if m.get("role") == "assistant" and "```" in str(m.get("content") or ""))
        if step >= len(actions):
            command = f"echo {MINI_SUBMIT}"
            if answer.strip():
                command += f" && printf '%s\\n' {shlex.quote(answer.strip())}"
            thought = "THOUGHT: The work is done and checked; I submit."
        else:
            action = actions[step]
            command = _safe_block(action.as_shell(), "```")
            thought = f"THOUGHT: {describe_action(action)}"
        return f"{thought}\n\n```{fence}\n{command}\n```"
