"""Wrapped components of sibling harnesses: each wraps the base harness's component and adds
what the edits recorded, delegating everything else unchanged.

``SiblingPrompt`` (addenda in the system message, skills in the first user message),
``SiblingTools`` (tool notes in the usage text and the tool descriptions),
``SiblingObservation`` (a shorter output limit), ``SiblingWorkflow`` (recovery hints and
step hooks after a step, pre-submit hooks at the first submit) and ``SiblingHooks`` (start
hooks, guard rules). Per-episode facts come from ``EpisodeState``: one harness object serves
many episodes at once, so the wrappers keep no episode state of their own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from harnessrl.harness.base import (
    CallVerdict,
    EpisodeHooks,
    EpisodeState,
    ObservationFormat,
    ParsedOutput,
    PromptContext,
    SubmitDecision,
    SystemPrompt,
    ToolCall,
    ToolInterface,
    ToolOutput,
    ToolSpec,
    Workflow,
    describe_call,
)
from harnessrl.harness.observation import head_tail

if TYPE_CHECKING:
    from harnessrl.harness.siblings.kinds import (
        GuardRule,
        Hook,
        RecoveryRule,
        Skill,
        SystemAddendum,
        ToolHint,
    )
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Action

COMMAND_OUTPUT_CHARS = 3000  # hook and check command output shown at most
BLOCKED_PREFIX = "Blocked by a harness rule, not run:"
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


class _Wrapped:
    """Copies the factor identity of the wrapped component and delegates unknown attributes
    (out-of-space components have methods of their own)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.level, self.name, self.description = inner.level, inner.name, inner.description
        self.out_of_space = inner.out_of_space

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "inner":  # not set yet (during unpickling): no recursion
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)


def section_titles(text: str) -> list[str]:
    """Returns the markdown heading titles of ``text`` in order."""
    return [m.group(2) for line in text.splitlines() if (m := _HEADING.match(line))]


def insert_after_section(text: str, section: str, addition: str) -> str | None:
    """Returns ``text`` with ``addition`` at the end of the section titled ``section`` (case
    and surrounding space ignored), or None when there is no such heading."""
    lines = text.rstrip("\n").split("\n")
    start = depth = None
    for i, line in enumerate(lines):
        match = _HEADING.match(line)
        if not match:
            continue
        if start is None and match.group(2).strip().lower() == section.strip().lower():
            start, depth = i, len(match.group(1))
        elif start is not None and depth is not None and len(match.group(1)) <= depth:
            end = i
            while end > start + 1 and not lines[end - 1].strip():
                end -= 1
            return "\n".join([*lines[:end], "", addition.strip(), "", *lines[end:]]).strip() + "\n"
    if start is None:
        return None
    return "\n".join([*lines, "", addition.strip()]).strip() + "\n"


def render_skills(skills: Sequence[Skill]) -> str:
    """Returns the skills section of the first user message."""
    lines = ["## Skills", "Procedures that help with tasks like this one:"]
    for skill in skills:
        lines.append(f"### {skill.name}")
        lines += [f"{i}. {step}" for i, step in enumerate(skill.steps, start=1)]
    return "\n".join(lines)


class SiblingPrompt(_Wrapped, SystemPrompt):
    """The base system prompt with addenda in the system message and skills after the task."""

    def __init__(self, inner: SystemPrompt, addenda: Sequence[SystemAddendum], skills: Sequence[Skill]) -> None:
        super().__init__(inner)
        self.addenda, self.skills = list(addenda), list(skills)

    def system_message(self, ctx: PromptContext) -> str:
        text = self.inner.system_message(ctx)
        for addendum in self.addenda:
            placed = None
            if addendum.position == "after_section":
                placed = insert_after_section(text, addendum.section, addendum.text)
            # A missing section is caught when the sibling is built (build.check_sections).
            text = placed if placed is not None else text.rstrip("\n") + "\n\n" + addendum.text.strip() + "\n"
        return text

    def first_user_message(self, ctx: PromptContext) -> str:
        text = self.inner.first_user_message(ctx)
        if self.skills:
            text = text.rstrip("\n") + "\n\n" + render_skills(self.skills) + "\n"
        return text

    def reminder(self, state: EpisodeState) -> str | None:
        return self.inner.reminder(state)


class SiblingTools(_Wrapped, ToolInterface):
    """The base tool interface with notes for some tools in its usage text and descriptions."""

    def __init__(self, inner: ToolInterface, hints: Sequence[ToolHint]) -> None:
        super().__init__(inner)
        self.submit_tool = inner.submit_tool
        self.hints: dict[str, list[str]] = {}
        for hint in hints:
            self.hints.setdefault(hint.tool, []).append(hint.text.strip())

    def specs(self) -> list[ToolSpec]:
        specs = self.inner.specs()
        return [
            ToolSpec(s.name, s.description + "".join(f" Note: {t}" for t in self.hints.get(s.name, [])), s.parameters)
            for s in specs
        ]

    def usage(self) -> str:
        usage = self.inner.usage()
        if not self.hints:
            return usage
        notes = [f"- `{tool}`: {text}" for tool, texts in self.hints.items() for text in texts]
        return usage.rstrip("\n") + "\n\n## Tool notes\n" + "\n".join(notes)

    def example(self) -> str:
        return self.inner.example()

    def parse(self, text: str) -> ParsedOutput:
        return self.inner.parse(text)

    def execute(self, call: ToolCall, sandbox: Sandbox) -> ToolOutput:
        return self.inner.execute(call, sandbox)

    def render(self, action: Action, thought: str = "") -> str:
        return self.inner.render(action, thought)


class SiblingObservation(_Wrapped, ObservationFormat):
    """The base observation format, with outputs past ``output_chars`` cut to head and tail."""

    def __init__(self, inner: ObservationFormat, output_chars: int) -> None:
        super().__init__(inner)
        self.output_chars = output_chars

    def format(self, output: ToolOutput) -> str:
        if len(output.output) + len(output.stderr) > self.output_chars:
            keep_out = self.output_chars if not output.stderr else self.output_chars // 2
            head, tail, elided = head_tail(output.output, keep_out)
            text = f"{head}\n[... {elided} characters elided ...]\n{tail}" if elided else head
            ehead, etail, eelided = head_tail(output.stderr, self.output_chars - keep_out)
            stderr = f"{ehead}\n[... {eelided} characters elided ...]\n{etail}" if eelided else ehead
            output = replace(output, output=text, stderr=stderr, truncated=True)
        return self.inner.format(output)

    def format_error(self, message: str, kind: str = "format") -> str:
        return self.inner.format_error(message, kind)


def run_shown(sandbox: Sandbox, command: str) -> str:
    """Runs a hook's read-only command in the episode's sandbox; returns it with its output."""
    try:
        result = sandbox.exec(command)
        output = (result.stdout + ("\n" + result.stderr if result.stderr else "")).strip()
        code = result.exit_code
    except Exception as exc:  # a hook must never end the episode
        output, code = f"(could not run: {type(exc).__name__}: {exc})", -1
    head, tail, elided = head_tail(output, COMMAND_OUTPUT_CHARS)
    shown = f"{head}\n[... {elided} characters elided ...]\n{tail}" if elided else head
    return f"$ {command}\n(exit code {code})\n{shown or '(no output)'}"


def _hook_text(hook: Hook, sandbox: Sandbox) -> str:
    parts = [hook.text.strip()] if hook.text.strip() else []
    if hook.command:
        parts.append(run_shown(sandbox, hook.command))
    return "\n".join(parts)


def recovery_matches(rule: RecoveryRule, output: ToolOutput) -> bool:
    """Returns whether a recovery rule fires on one call's output (it failed, and every given
    condition holds)."""
    if not output.failed:
        return False
    if rule.tool is not None and output.tool != rule.tool:
        return False
    if rule.exit_code is not None and output.exit_code != rule.exit_code:
        return False
    return rule.pattern is None or re.search(rule.pattern, f"{output.output}\n{output.stderr}") is not None


class SiblingWorkflow(_Wrapped, Workflow):
    """The base workflow plus recovery hints and step hooks after a step, and pre-submit hooks
    at the first submit (which shows them and waits for a second submit)."""

    def __init__(self, inner: Workflow, recoveries: Sequence[RecoveryRule], hooks: Sequence[Hook]) -> None:
        super().__init__(inner)
        self.recoveries = list(recoveries)
        self.step_hooks = [h for h in hooks if h.at == "after_step"]
        self.submit_hooks = [h for h in hooks if h.at == "before_submit"]

    def instructions(self) -> str:
        return self.inner.instructions()

    def wants_plan(self, state: EpisodeState) -> bool:
        return self.inner.wants_plan(state)

    def after_step(self, state: EpisodeState, outputs: Sequence[ToolOutput]) -> list[str]:
        reminders = list(self.inner.after_step(state, outputs))
        for rule in self.recoveries:
            if any(recovery_matches(rule, o) for o in outputs):
                reminders.append(rule.hint.strip())
        for hook in self.step_hooks:
            if (state.turn + 1) % hook.every == 0:
                reminders.append(hook.text.strip())
        return reminders

    def on_submit(self, state: EpisodeState, sandbox: Sandbox) -> SubmitDecision:
        decision = self.inner.on_submit(state, sandbox)
        if not self.submit_hooks or state.submits != 1:
            return decision
        shown = [_hook_text(hook, sandbox) for hook in self.submit_hooks]
        if decision.message:
            shown.append(decision.message)
        shown.append("Submit again to finish.")
        return SubmitDecision(done=False, message="\n\n".join(shown))


def _text_arguments(call: ToolCall) -> list[str]:
    return [v for v in call.arguments.values() if isinstance(v, str)] if isinstance(call.arguments, dict) else []


def guard_matches(rule: GuardRule, call: ToolCall, state: EpisodeState, submit_tool: str) -> bool:
    """Returns whether every condition of a guard rule holds for a proposed call."""
    if rule.tool is not None and call.name != rule.tool:
        return False
    if rule.pattern is not None and not any(re.search(rule.pattern, text) for text in _text_arguments(call)):
        return False
    if rule.repeats is not None:
        line = describe_call(call)
        previous = state.commands[-(rule.repeats - 1):]
        if len(previous) < rule.repeats - 1 or any(p != line for p in previous):
            return False
    if rule.before_change:
        if call.name != submit_tool or state.changed_paths:
            return False
        if any(not c.startswith(f"{submit_tool} ") for c in state.commands):
            return False
    return True


class SiblingHooks(EpisodeHooks):
    """Start hooks and guard rules (the first blocking rule wins; hints add up)."""

    def __init__(self, inner: EpisodeHooks, guards: Sequence[GuardRule], hooks: Sequence[Hook], submit_tool: str) -> None:
        self.inner = inner
        self.guards = list(guards)
        self.start_hooks = [h for h in hooks if h.at == "start"]
        self.submit_tool = submit_tool

    def at_start(self, state: EpisodeState, sandbox: Sandbox) -> list[str]:
        return [*self.inner.at_start(state, sandbox), *(_hook_text(h, sandbox) for h in self.start_hooks)]

    def before_call(self, call: ToolCall, state: EpisodeState) -> CallVerdict:
        verdict = self.inner.before_call(call, state)
        blocked, hints = verdict.blocked, list(verdict.hints)
        for rule in self.guards:
            if not guard_matches(rule, call, state, self.submit_tool):
                continue
            if rule.effect == "block" and blocked is None:
                blocked = f"{BLOCKED_PREFIX} {rule.message.strip()}"
            elif rule.effect == "hint":
                hints.append(rule.message.strip())
        return CallVerdict(blocked, tuple(hints))
