"""Behaviour metrics from trajectories: what the policy did, not only whether it passed.

Harness Scaling reports six behaviours, of which state tracking, workflow compliance and
error recovery move most and observation reading least (the Harness Scaling paper). Each metric here
is a ratio ``count / opportunities`` pooled over episodes, defined on what a trajectory
records (turn kinds, parsed calls, per-call outcomes, observations); ``docs/evaluation.md``
gives the exact definitions. A metric with no opportunity in a set is ``None``, not 0.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from harnessrl.trajectory import Trajectory, Turn

BEHAVIOURS: tuple[str, ...] = (
    "state_tracking", "workflow_compliance", "error_recovery", "observation_use",
    "format_error_rate", "tool_error_rate",
)
# Lower is better for these two; the other four are rates of good behaviour.
LOWER_IS_BETTER: frozenset[str] = frozenset({"format_error_rate", "tool_error_rate"})

# A "content token" of an observation: an identifier, path, number or word of 3+ characters.
_TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{2,}")
_PLAN_WITH_ACTION_PREFIX = "Plan noted. Actions in the planning response are not executed"
# A plan names steps: a numbered or bulleted line, or the word "plan".
_PLAN_STEP = re.compile(r"(^\s*(\d+[.)]|[-*•])\s+\S)|\bplan\b", re.IGNORECASE | re.MULTILINE)


@lru_cache(maxsize=512)
def workflow_level(harness_name: str) -> int | None:
    """Returns the workflow level (0 ReAct, 1 plan-then-act, 2 review-then-resubmit) of a
    harness by name, or None when the name is not a harness of this install."""
    from harnessrl.harness.harness import Harness

    try:
        return int(Harness.named(harness_name).workflow.level)
    except (ValueError, KeyError):
        return None


def _call_key(call: dict[str, Any]) -> str:
    return json.dumps([call.get("name"), call.get("arguments")], sort_keys=True, default=str)


def _action_turns(trajectory: Trajectory) -> list[Turn]:
    return [t for t in trajectory.turns if t.kind == "action"]


def _turn_failed(turn: Turn) -> bool:
    return turn.error is not None or any(o.get("failed") for o in turn.outcomes)


def _content_tokens(text: str) -> set[str]:
    return set(_TOKEN.findall(text))


def episode_counts(trajectory: Trajectory) -> dict[str, tuple[int, int]]:
    """Returns (count, opportunities) of each behaviour for one episode (see module docstring)."""
    actions = _action_turns(trajectory)
    counts: dict[str, tuple[int, int]] = {}

    # Format / tool errors: action turns whose output could not be parsed (format) or named
    # an unknown tool, had bad arguments, or a call the tool refused (tool).
    counts["format_error_rate"] = (sum(t.error == "format" for t in actions), len(actions))
    counts["tool_error_rate"] = (sum(t.error == "tool" for t in actions), len(actions))

    # State tracking: executed calls (submits excluded) that do not repeat an identical call
    # that already succeeded earlier in the episode.
    succeeded: set[str] = set()
    fresh = executed = 0
    for turn in actions:
        for call, outcome in zip(turn.calls, turn.outcomes, strict=False):
            if outcome.get("submitted"):
                continue
            key = _call_key(call)
            executed += 1
            fresh += key not in succeeded
            if not outcome.get("failed"):
                succeeded.add(key)
    counts["state_tracking"] = (fresh, executed)

    # Error recovery: after an action turn with a failed command (a call that failed when
    # run: non-zero exit, timeout, refused), the next action turn issues different calls and
    # all of them succeed.
    recovered = chances = 0
    for before, after in itertools.pairwise(actions):
        if not any(o.get("failed") for o in before.outcomes):
            continue
        chances += 1
        changed = [_call_key(c) for c in after.calls] != [_call_key(c) for c in before.calls]
        recovered += bool(changed and after.calls and not _turn_failed(after))
    counts["error_recovery"] = (recovered, chances)

    # Observation use: an action turn that follows a non-empty observation and mentions a
    # content token of that observation which the policy had not written before.
    used = chances = 0
    written: set[str] = set()
    previous_observation = ""
    for turn in trajectory.turns:
        if turn.kind == "action" and previous_observation:
            new = _content_tokens(previous_observation) - written
            if new:
                chances += 1
                used += bool(new & _content_tokens(turn.text))
        written |= _content_tokens(turn.text)
        previous_observation = turn.observation if turn.calls else ""
    counts["observation_use"] = (used, chances)

    # Workflow compliance: W1 asks for a plan (steps, no action) first; W2 asks for a second
    # submit after the review. W0 asks for nothing (no opportunity).
    level = workflow_level(trajectory.config)
    if level == 1 and trajectory.turns:
        first = trajectory.turns[0]
        ok = (first.kind == "plan" and bool(_PLAN_STEP.search(first.text))
              and not first.observation.startswith(_PLAN_WITH_ACTION_PREFIX))
        counts["workflow_compliance"] = (int(ok), 1)
    elif level == 2 and int(trajectory.metrics.get("submits", 0)) >= 1:
        counts["workflow_compliance"] = (int(int(trajectory.metrics.get("submits", 0)) >= 2), 1)
    else:
        counts["workflow_compliance"] = (0, 0)
    return counts


def behaviour_metrics(trajectories: Iterable[Trajectory]) -> dict[str, dict[str, Any]]:
    """Returns each behaviour as {"rate", "count", "opportunities"} pooled over episodes;
    ``rate`` is None when there was no opportunity."""
    totals = {name: [0, 0] for name in BEHAVIOURS}
    for trajectory in trajectories:
        for name, (count, chances) in episode_counts(trajectory).items():
            totals[name][0] += count
            totals[name][1] += chances
    return {
        name: {"rate": (count / chances) if chances else None, "count": count, "opportunities": chances}
        for name, (count, chances) in totals.items()
    }


def rates(metrics: dict[str, dict[str, Any]], names: Sequence[str] = BEHAVIOURS) -> dict[str, float | None]:
    """Returns just the rates of ``metrics``."""
    return {name: metrics.get(name, {}).get("rate") for name in names}
