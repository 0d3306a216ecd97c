"""Factor C, context management: which of the history the policy sees at each turn.

C0 full append-only history. C1 a sliding window: observations older than the last
``keep`` are replaced by a placeholder naming how many lines were omitted (SWE-agent's
last-N observations, OpenHands' observation masking). C2 compaction: once the history
passes a token budget, older turns are replaced by a digest of what was done, which files
changed and which errors occurred (deterministic by default; a ``Summarizer`` may supply a
policy-written summary instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from harnessrl.harness.base import (
    SPAN_OBSERVATION,
    SPAN_SUMMARY,
    ContextPolicy,
    EpisodeState,
    Message,
    TokenCounter,
)
from harnessrl.harness.registry import register


@register
class FullHistory(ContextPolicy):
    """C0: everything, append-only."""

    level, name = 0, "full"
    description = "full append-only history"

    def apply(
        self, messages: Sequence[Message], state: EpisodeState, count_tokens: TokenCounter, budget: int
    ) -> list[Message]:
        return list(messages)


@register
class ObservationWindow(ContextPolicy):
    """C1: keep the last ``keep`` observations; mask older ones with a placeholder."""

    level, name = 1, "window"
    description = "sliding window that masks older observations with a placeholder"
    keep: ClassVar[int] = 3

    def apply(
        self, messages: Sequence[Message], state: EpisodeState, count_tokens: TokenCounter, budget: int
    ) -> list[Message]:
        observation_positions = [
            i for i, m in enumerate(messages) if m.span == SPAN_OBSERVATION and not m.pinned
        ]
        masked = set(observation_positions[: -self.keep] if self.keep else observation_positions)
        out = []
        for i, message in enumerate(messages):
            if i in masked:
                lines = message.content.count("\n") + 1
                out.append(
                    Message(
                        message.role,
                        f"[older output omitted ({lines} lines)]",
                        SPAN_SUMMARY,
                        turn=message.turn,
                    )
                )
            else:
                out.append(message)
        return out


class Summarizer(Protocol):
    """Writes C2's digest: the dropped messages and the episode's state in, the digest text out.
    ``deterministic_digest`` is the default; ``policy.summarizer.PolicySummarizer`` lets the
    policy write it (pass it to ``Harness.with_summarizer``)."""

    def __call__(self, dropped: Sequence[Message], state: EpisodeState) -> str: ...


def deterministic_digest(dropped: Sequence[Message], state: EpisodeState) -> str:
    """Returns a digest of the dropped turns: actions taken, files changed, errors seen."""
    turns = sorted({m.turn for m in dropped if m.turn >= 0})
    lines = [f"[Summary of earlier turns {turns[0]}-{turns[-1]}]" if turns else "[Summary of earlier turns]"]
    commands = state.commands[-12:]
    if commands:
        lines.append("Actions taken so far:")
        lines += [f"- {c[:160]}" for c in commands]
    if state.changed_paths:
        lines.append("Files changed: " + ", ".join(sorted(set(state.changed_paths))[:20]))
    if state.errors:
        lines.append("Errors seen:")
        lines += [f"- {e[:160]}" for e in state.errors[-5:]]
    if state.plan:
        lines.append("Plan: " + state.plan[:400])
    return "\n".join(lines)


@register
class Compaction(ContextPolicy):
    """C2: past ``budget`` tokens, older turns become one digest message (the system message,
    pinned messages and the last ``keep_recent`` messages stay verbatim)."""

    level, name = 2, "compact"
    description = "compaction: older turns replaced by a digest past a token budget"
    keep_recent: ClassVar[int] = 4

    def __init__(self, summarizer: Summarizer | None = None, budget_fraction: float = 0.5) -> None:
        self.summarizer = summarizer or deterministic_digest
        self.budget_fraction = budget_fraction

    def apply(
        self, messages: Sequence[Message], state: EpisodeState, count_tokens: TokenCounter, budget: int
    ) -> list[Message]:
        limit = int(budget * self.budget_fraction)
        total = sum(count_tokens(m.content) if m.token_ids is None else len(m.token_ids) for m in messages)
        if total <= limit or len(messages) <= self.keep_recent + 2:
            return list(messages)
        head = [m for m in messages[:-self.keep_recent] if m.role == "system" or m.pinned]
        dropped = [m for m in messages[:-self.keep_recent] if not (m.role == "system" or m.pinned)]
        if not dropped:
            return list(messages)
        recent = list(messages[-self.keep_recent:])
        # Keep user/assistant alternation: the digest is a user message, so the recent part
        # must start with an assistant message.
        while recent and recent[0].role == "user":
            dropped.append(recent.pop(0))
        digest = Message("user", self.summarizer(dropped, state), SPAN_SUMMARY, turn=dropped[-1].turn)
        return [*head, digest, *recent]
