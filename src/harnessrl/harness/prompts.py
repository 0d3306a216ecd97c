"""Factor S, the system prompt: three realizations, their text in ``templates/S*_*.txt``.

S0 minimal: a one-line role; task, suggested workflow and the call syntax go in the first
user message (mini-swe-agent). S1 manual: an interface manual with every tool, a strict
response format and a worked example in the system message (SWE-agent, Terminus).
S2 policy: a long product-style policy with rules, plus reminders injected
mid-conversation (Claude Code, OpenClaw).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import ClassVar

from harnessrl.harness.base import EpisodeState, PromptContext, SystemPrompt
from harnessrl.harness.registry import register

WORKSPACE_DISPLAY = "/workspace"


@cache
def template(name: str) -> str:
    """Returns the text of ``templates/<name>.txt``."""
    return resources.files("harnessrl.harness").joinpath("templates", f"{name}.txt").read_text("utf-8")


def _fill(name: str, ctx: PromptContext, **extra: object) -> str:
    workflow = ctx.workflow.instructions()
    values = {
        "instruction": ctx.task.instruction.strip(),
        "usage": ctx.tools.usage().strip(),
        "example": ctx.tools.example().strip(),
        "workflow": f"\n{workflow.strip()}\n" if workflow else "",
        "max_turns": ctx.max_turns,
        "workspace": WORKSPACE_DISPLAY,
        **extra,
    }
    # str.format would trip over braces in tool usage (JSON examples): substitute by name.
    text = template(name)
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text.strip() + "\n"


class _TemplatePrompt(SystemPrompt):
    prefix: ClassVar[str] = ""

    def system_message(self, ctx: PromptContext) -> str:
        return _fill(f"{self.prefix}_system", ctx)

    def first_user_message(self, ctx: PromptContext) -> str:
        return _fill(f"{self.prefix}_user", ctx)


@register
class MinimalPrompt(_TemplatePrompt):
    """S0: one role line; everything else in the first user message."""

    level, name, prefix = 0, "minimal", "S0"
    description = "a one-line role; task, suggested workflow and call syntax in the first user message"


@register
class ManualPrompt(_TemplatePrompt):
    """S1: the interface manual, strict response format and a worked example."""

    level, name, prefix = 1, "manual", "S1"
    description = "an interface manual: every tool, a strict response format, a worked example"


@register
class PolicyPrompt(_TemplatePrompt):
    """S2: a long product-style policy, with a reminder every ``every`` turns."""

    level, name, prefix = 2, "policy", "S2"
    description = "a long product-style policy with rules and mid-conversation reminders"
    every: ClassVar[int] = 4

    def reminder(self, state: EpisodeState) -> str | None:
        if state.turn == 0 or (state.turn + 1) % self.every:
            return None
        text = template("S2_reminder").replace("{turn}", str(state.turn + 1))
        return text.replace("{max_turns}", str(state.max_turns)).strip()
