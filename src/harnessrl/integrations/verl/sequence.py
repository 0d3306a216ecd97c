"""One episode's turns -> the single token sequence verl trains on (prompt, response, masks).

verl's trainer takes one sequence per sample: the first prompt, then a response in which the
policy's sampled tokens have mask 1 and everything the harness added between turns
(observations, reminders, chat format) has mask 0. That is exact only when each turn's prompt
starts with the previous prompt followed by the previous completion, token for token: an
append-only context. Contexts that rewrite earlier turns (C1 masks old observations, C2
compacts history) break that, so they are refused before an episode starts
(``require_append_only``) and checked again on the tokens (``episode_sequence``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harnessrl.harness.context import FullHistory
from harnessrl.harness.harness import Harness
from harnessrl.trajectory import Turn


class NotAppendOnly(ValueError):
    """A harness whose context rewrites earlier turns, asked to produce one sequence."""


def require_append_only(harness: Harness) -> None:
    """Raises ``NotAppendOnly`` unless ``harness`` shows the policy its full append-only history."""
    if not isinstance(harness.context, FullHistory):
        raise NotAppendOnly(
            f"harness {harness.code!r} uses context policy {type(harness.context).__name__} "
            f"({harness.context.description}), which rewrites earlier turns; verl trains one "
            "token sequence per agent-loop call, so only append-only (C0) harnesses can run "
            "there. Build the dataset with append_only='keep-c0' or pick C0 configurations."
        )


@dataclass
class EpisodeSequence:
    """The sequence of one episode in verl's terms: ``response_mask`` is 1 on policy tokens,
    ``response_logprobs`` holds the rollout log-probability of each policy token (0.0 elsewhere)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]

    @property
    def policy_tokens(self) -> int:
        return sum(self.response_mask)


def episode_sequence(turns: Sequence[Turn]) -> EpisodeSequence:
    """Returns the single sequence of an episode's turns; raises ``NotAppendOnly`` when a turn's
    prompt does not extend the previous prompt and completion (training on it would misalign
    tokens and log-probabilities)."""
    if not turns:
        raise ValueError("an episode without turns has no sequence (it ended before the first prompt)")
    prompt = list(turns[0].prompt_ids)
    sequence = list(prompt)
    mask: list[int] = []
    logprobs: list[float] = []
    for turn in turns:
        head = turn.prompt_ids[: len(sequence)]
        if len(turn.prompt_ids) < len(sequence) or list(head) != sequence:
            raise NotAppendOnly(
                f"turn {turn.index}'s prompt does not start with the earlier prompt and completions "
                "(the context was rewritten); this episode cannot be one verl sequence"
            )
        added = list(turn.prompt_ids[len(sequence):])
        completion = list(turn.completion_ids)
        sampled = list(turn.completion_logprobs)
        if len(sampled) != len(completion):
            raise ValueError(f"turn {turn.index} has {len(completion)} ids but {len(sampled)} log-probabilities")
        sequence += added + completion
        mask += [0] * len(added) + [1] * len(completion)
        logprobs += [0.0] * len(added) + sampled
    return EpisodeSequence(prompt, sequence[len(prompt):], mask, logprobs)
