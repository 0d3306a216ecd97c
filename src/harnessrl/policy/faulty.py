"""A scripted faulty policy: the oracle with diagnosable faults on some tasks, which it drops
when the harness tells it what it does wrong. It lets tests measure whether harness edits
(sibling harnesses) rescue a policy, without a model.

Each task gets one fault from a stable hash of its id:

- ``syntax``: under the JSON function-call interface (``shell_editor_json``) it writes
  ``{"tool": ..., "args": ...}`` instead of ``{"name": ..., "arguments": ...}``, until the
  system message, the task message or a harness reminder quotes that mistake (``"tool":``).
- ``never_submit`` (tasks that expect an answer): it does the work but keeps listing files
  instead of submitting, until a harness reminder mentions submitting.
- ``ignore_error`` (other tasks): its main step first runs a command that fails; unless a
  harness reminder about the failure follows, it moves on without that step.
- ``none``: the oracle.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harnessrl.harness.base import SPAN_REMINDER, SPAN_SYSTEM, SPAN_TASK
from harnessrl.harness.chat import ByteTokenizer, ChatTokenizer
from harnessrl.policy.base import EpisodeView, Generation, GenerationRequest, Policy
from harnessrl.policy.scripted import _generation, describe_action, plan_text
from harnessrl.tasks.model import Action

if TYPE_CHECKING:
    from harnessrl.tasks.model import Task

FAULTS: tuple[str, ...] = ("syntax", "never_submit", "ignore_error", "none")
WRONG_KEY = '"tool":'  # the syntax fault's tell; a harness that quotes it has shown the mistake
FAILING_STEP = Action.run("bash ./prepare-step.sh")  # fails: no such file
LOOKING_AROUND = Action.run("ls")


def fault_of(task: Task) -> str:
    """Returns the fault the policy has on ``task`` (stable across runs and machines)."""
    slot = int(hashlib.sha256(task.id.encode("utf-8")).hexdigest(), 16) % 4
    if task.expects_answer:
        return ("never_submit", "never_submit", "syntax", "none")[slot]
    return ("ignore_error", "ignore_error", "syntax", "none")[slot]


def _main_step(gold: Sequence[Action]) -> int:
    """Returns the index of the gold action that does the work (the longest non-submit one)."""
    sizes = [len(a.command or a.content or a.new or "") if a.kind != "submit" else -1 for a in gold]
    return max(range(len(gold)), key=lambda i: sizes[i])


def _harness_text(episode: EpisodeView, spans: tuple[str, ...]) -> list[tuple[int, str]]:
    return [(m.turn, m.content) for m in episode.history if m.span in spans]


@dataclass
class _Progress:
    cursor: int = 0
    failed_turn: int | None = None  # the turn of the failing step (ignore_error)
    decided: bool = False


class FaultyPolicy(Policy):
    """The oracle with one fault per task (``fault_of``) that harness guidance can fix."""

    name = "faulty"

    def __init__(self, tokenizer: ChatTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self._progress: weakref.WeakKeyDictionary[EpisodeView, _Progress] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _action(self, episode: EpisodeView, fault: str, gold: list[Action], progress: _Progress) -> Action:
        if fault == "ignore_error":
            step = _main_step(gold)
            if progress.cursor == step and progress.failed_turn is None:
                progress.failed_turn = episode.state.turn
                return FAILING_STEP
            if progress.cursor == step and not progress.decided:
                progress.decided = True
                told = any(turn == progress.failed_turn and ("fail" in text.lower() or "error" in text.lower())
                           for turn, text in _harness_text(episode, (SPAN_REMINDER,)))
                if not told:
                    progress.cursor += 1  # goes on as if the step had worked
        action = gold[min(progress.cursor, len(gold) - 1)]
        told_to_submit = any("submit" in text.lower() for _, text in _harness_text(episode, (SPAN_REMINDER,)))
        if fault == "never_submit" and action.kind == "submit" and not told_to_submit:
            return LOOKING_AROUND
        progress.cursor += 1
        return action

    def _text(self, episode: EpisodeView) -> str:
        gold = list(episode.task.gold)
        if not gold or gold[-1].kind != "submit":
            gold.append(Action.submit(""))
        if episode.harness.workflow.wants_plan(episode.state):
            return plan_text(gold)
        fault = fault_of(episode.task)
        tools = episode.harness.tools
        mangle = fault == "syntax" and tools.name == "shell_editor_json" and not any(
            WRONG_KEY in text for _, text in _harness_text(episode, (SPAN_SYSTEM, SPAN_TASK, SPAN_REMINDER)))
        with self._lock:
            progress = self._progress.setdefault(episode, _Progress())
            if mangle:  # the same action again, in the wrong syntax
                action = gold[min(progress.cursor, len(gold) - 1)]
            else:
                action = self._action(episode, fault, gold, progress)
        text = tools.render(action, thought=describe_action(action))
        if mangle:
            text = text.replace('"name":', WRONG_KEY, 1).replace('"arguments":', '"args":', 1)
        return text

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            episode = request.context
            if not isinstance(episode, EpisodeView):
                out.append(Generation([], [], "error", error="the faulty policy needs the episode as context"))
                continue
            out.append(_generation(self.tokenizer, self._text(episode), request.params.max_new_tokens))
        return out
