"""Diagnosis: the root causes of failed episodes, with the evidence behind each.

``OfflineDiagnoser`` reads trajectory signals: unparseable output (by tool interface),
unknown tools, bad arguments, never submitting, a submitted but wrong result, the same
action repeated, an error ignored, the context exceeded, timeouts, a wrong file written,
protected tests edited. A failure may have several causes. The LLM diagnoser
(``rescue/llm.py``) answers the same ``Diagnosis`` through an OpenAI-compatible endpoint.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory

# Root causes, each with the family that makes causes related (an edit targets 2-3 related ones).
ROOT_CAUSES: dict[str, tuple[str, str]] = {
    "unparseable_output": ("format", "the output could not be parsed as a call in the interface's syntax"),
    "unknown_tool": ("format", "a call named a tool the interface does not offer"),
    "bad_arguments": ("format", "a call's arguments did not match the tool's schema"),
    "never_submitted": ("flow", "the episode ran out of turns without a submit"),
    "same_action_repeated": ("flow", "the same call three or more times in a row"),
    "context_exceeded": ("flow", "the prompt outgrew the context window"),
    "error_ignored": ("errors", "a command failed and the policy went on as if it had worked"),
    "timeouts": ("errors", "a command hit the time limit"),
    "submitted_wrong": ("outcome", "it submitted, and the verifier failed the result"),
    "wrong_file_edited": ("outcome", "a file the verifier checks was never touched by any call"),
    "protected_tests_edited": ("outcome", "a call wrote a protected test file"),
}
REPEAT_RUN = 3
EXCERPT_CHARS = 240
_PATH_IN_CHECK = re.compile(r"\(([^(),<>]+?)(?:,|\))")


@dataclass
class Failure:
    """One failed episode: its task, root causes and an excerpt per cause."""

    task_id: str
    harness: str
    causes: list[str]
    evidence: dict[str, str] = field(default_factory=dict)


@dataclass
class Diagnosis:
    """The failures of one parent's rollouts and the tasks it solved."""

    failures: list[Failure] = field(default_factory=list)
    solved: list[str] = field(default_factory=list)
    dropped: int = 0  # LLM answers that could not be used (counted, never raised)
    notes: list[str] = field(default_factory=list)  # why they could not

    def tasks_by_cause(self) -> dict[str, list[str]]:
        """Returns cause -> distinct failed task ids, most supported first."""
        by: dict[str, list[str]] = defaultdict(list)
        for failure in self.failures:
            for cause in failure.causes:
                if failure.task_id not in by[cause]:
                    by[cause].append(failure.task_id)
        return dict(sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])))

    def supported(self, min_tasks: int = 2) -> dict[str, list[str]]:
        """Returns the causes backed by at least ``min_tasks`` failed tasks."""
        return {c: ts for c, ts in self.tasks_by_cause().items() if len(ts) >= min_tasks}

    def evidence(self, cause: str, limit: int = 3) -> list[str]:
        """Returns up to ``limit`` distinct excerpts for ``cause``."""
        seen: list[str] = []
        for failure in self.failures:
            text = failure.evidence.get(cause)
            if text and text not in seen:
                seen.append(text)
            if len(seen) >= limit:
                break
        return seen

    def co_occurrence(self, a: str, b: str) -> int:
        """Returns on how many failures causes ``a`` and ``b`` appear together."""
        return sum(1 for f in self.failures if a in f.causes and b in f.causes)

    def to_dict(self) -> dict[str, Any]:
        return {"by_cause": self.tasks_by_cause(), "solved": self.solved, "dropped": self.dropped, "notes": self.notes,
                "failures": [f.__dict__ for f in self.failures]}


class Diagnoser(Protocol):
    """Assigns root causes to the failed trajectories of a parent."""

    def diagnose(self, trajectories: Sequence[Trajectory], tasks: Mapping[str, Task]) -> Diagnosis: ...


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """Returns ``text`` on one line, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def call_excerpt(text: str) -> str:
    """Returns the part of a policy output that was meant as the call (from its first brace,
    tag or fence), on one line."""
    starts = [i for i in (text.find("{"), text.find("<tool_call>"), text.find("```")) if i >= 0]
    return excerpt(text[min(starts):] if starts else text, 160)


def _call_texts(trajectory: Trajectory) -> list[str]:
    return [str(v) for turn in trajectory.turns for call in turn.calls for v in call.get("arguments", {}).values()]


def signals(trajectory: Trajectory, task: Task | None = None) -> dict[str, str]:
    """Returns cause -> evidence excerpt for one failed trajectory."""
    found: dict[str, str] = {}
    for turn in trajectory.turns:
        if turn.error == "format" and "unparseable_output" not in found:
            found["unparseable_output"] = f"wrote {call_excerpt(turn.text)!r}; harness said: {excerpt(turn.observation, 160)}"
        if turn.error == "tool" and not turn.outcomes:
            cause = "unknown_tool" if "Unknown tool" in turn.observation else "bad_arguments"
            found.setdefault(cause, f"wrote {call_excerpt(turn.text)!r}; harness said: {excerpt(turn.observation, 160)}")
        for outcome in turn.outcomes:
            if outcome.get("exit_code") == 124 or "timed out" in turn.observation.lower():
                found.setdefault("timeouts", f"turn {turn.index}: {excerpt(turn.text, 120)}")
    if trajectory.status == "max_turns" and not trajectory.metrics.get("submits"):
        last = trajectory.turns[-1].text if trajectory.turns else ""
        found["never_submitted"] = f"{len(trajectory.turns)} turns, no submit; last output: {call_excerpt(last)!r}"
    if trajectory.status == "context_exceeded":
        found["context_exceeded"] = f"after {len(trajectory.turns)} turns"
    calls = [repr(t.calls) for t in trajectory.turns if t.calls]
    for i in range(len(calls) - REPEAT_RUN + 1):
        if len(set(calls[i:i + REPEAT_RUN])) == 1:
            found["same_action_repeated"] = f"{REPEAT_RUN}x {excerpt(calls[i], 160)}"
            break
    for i, turn in enumerate(trajectory.turns[:-1]):
        failed = [o for o in turn.outcomes if o.get("failed") and not o.get("blocked") and not o.get("submitted")]
        if failed and trajectory.turns[i + 1].calls:
            found.setdefault("error_ignored", f"ran {call_excerpt(turn.text)!r} -> {excerpt(turn.observation, 160)}; "
                                              "then went on")
    if trajectory.status == "submitted" and not trajectory.passed:
        failed_checks = [v for v in trajectory.verdict if not v.get("passed")]
        detail = "; ".join(f"{v['name']}: {v.get('detail', '')}" for v in failed_checks[:2])
        found["submitted_wrong"] = excerpt(f"answer {trajectory.answer!r}; {detail}", 200)
    touched = " ".join(_call_texts(trajectory))
    for check in trajectory.verdict:
        match = _PATH_IN_CHECK.search(str(check.get("name", "")))
        if not check.get("passed") and match and "." in match.group(1) and match.group(1).strip() not in touched:
            found.setdefault("wrong_file_edited", f"{check['name']} failed and no call named {match.group(1).strip()}")
    if task is not None:
        for path in task.protected_files:
            if path in touched:
                found.setdefault("protected_tests_edited", f"a call named the protected file {path}")
    return found


class OfflineDiagnoser:
    """Root causes from trajectory signals (``signals``); a failure with none is ``unknown``."""

    name = "offline"

    def diagnose(self, trajectories: Sequence[Trajectory], tasks: Mapping[str, Task]) -> Diagnosis:
        diagnosis = Diagnosis()
        solved = {t.task_id for t in trajectories if t.passed}
        diagnosis.solved = sorted(solved)
        for trajectory in trajectories:
            if trajectory.passed:
                continue
            evidence = signals(trajectory, tasks.get(trajectory.task_id))
            causes = list(evidence) or ["unknown"]
            diagnosis.failures.append(Failure(trajectory.task_id, trajectory.config, causes, evidence))
        return diagnosis
