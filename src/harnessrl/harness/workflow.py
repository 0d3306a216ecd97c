"""Factor W, the workflow: the control loop around the policy's actions.

W0 ReAct: act until the policy submits. W1 plan then act: the first turn must be a plan,
which stays in context (pinned) and is referred back to. W2 verify and retry: a failed
command triggers a recovery reminder, and the first submit triggers a review (what changed
and a checklist); only a second submit ends the episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from harnessrl.harness.base import EpisodeState, SubmitDecision, ToolOutput, Workflow, encodable
from harnessrl.harness.registry import register

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox


@register
class ReAct(Workflow):
    """W0: a free act-observe loop; the first submit ends the episode."""

    level, name = 0, "react"
    description = "free act-observe loop until the agent submits"


@register
class PlanThenAct(Workflow):
    """W1: the first response is a plan (no action); the plan is pinned and recalled."""

    level, name = 1, "plan_act"
    description = "an explicit plan first, then act"
    recall_every: ClassVar[int] = 3

    def instructions(self) -> str:
        return (
            "Workflow: your FIRST response must be a short numbered plan of the steps you will "
            "take, with no action in it. Then carry out the plan one action per response, "
            "and submit when every step is done."
        )

    def wants_plan(self, state: EpisodeState) -> bool:
        return state.plan is None

    def after_step(self, state: EpisodeState, outputs: Sequence[ToolOutput]) -> list[str]:
        if state.plan and state.turn > 1 and state.turn % self.recall_every == 0:
            return [f"Reminder of your plan:\n{state.plan[:600]}\nContinue with the next unfinished step."]
        return []


@register
class VerifyAndRetry(Workflow):
    """W2: recovery reminders after failures; a review before the second, final submit."""

    level, name = 2, "verify_submit"
    description = "a review of the work before a second, final submit"

    def instructions(self) -> str:
        return (
            "Workflow: after every command, check whether it worked. If it failed, find out why "
            "and try something different. When you submit, you will be asked to review your "
            "work; submit a second time to finish."
        )

    def after_step(self, state: EpisodeState, outputs: Sequence[ToolOutput]) -> list[str]:
        failed = [o for o in outputs if o.failed]
        if not failed:
            return []
        code = failed[-1].exit_code
        what = "timed out" if failed[-1].timed_out else (f"exited with code {code}" if code else "failed")
        return [
            f"The last action {what}. Read the error above, work out the cause, and try a "
            "different approach instead of repeating the same command."
        ]

    def on_submit(self, state: EpisodeState, sandbox: Sandbox) -> SubmitDecision:
        if state.submits >= 2:
            return SubmitDecision(done=True)
        changed = sorted(set(state.changed_paths))
        try:
            listing = ", ".join(sandbox.list_dir(".")[:30]) or "(empty)"
        except Exception:  # the review must never fail the episode
            listing = "(unavailable)"
        answer = state.answer if state.answer else "(no answer text)"
        return SubmitDecision(
            done=False,
            message=encodable(
                "Review before finishing.\n"
                f"Files you changed with file tools: {', '.join(changed) if changed else 'none recorded'}\n"
                f"Workspace now contains: {listing}\n"
                f"Your submitted answer: {answer[:300]}\n"
                "Checklist:\n"
                "1. Does every output file have exactly the name and format the task asks for?\n"
                "2. Did every command you relied on succeed?\n"
                "3. Is the answer exactly what was asked, with no extra words?\n"
                "If something is wrong, fix it now. Otherwise submit again to finish."
            ),
        )
