"""The token-level record every trainer consumes: turns of exact prompt and sampled ids.

A trajectory is a list of turns. Each turn holds the exact prompt ids the policy saw (with
a span label per token, stored run-length encoded) and the exact ids it sampled with their
log-probabilities. Context policies that rewrite history (C1, C2) therefore never misalign
training tokens: each turn is trained on what was actually shown. Only ``policy`` tokens
are trainable.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.diskio import append_text, write_text_atomic

# What each prompt token is; only ``policy`` tokens are trained.
SPAN_SYSTEM = "system"  # the system prompt
SPAN_TASK = "task"  # the task instruction (first user message)
SPAN_POLICY = "policy"  # tokens the policy sampled
SPAN_OBSERVATION = "observation"  # tool output shown to the policy
SPAN_REMINDER = "reminder"  # harness-injected reminders, reviews, error notices
SPAN_SUMMARY = "summary"  # context digests and placeholders written by the harness
SPAN_FORMAT = "format"  # chat-template scaffolding (role headers, separators)
SPAN_KINDS: tuple[str, ...] = (
    SPAN_SYSTEM, SPAN_TASK, SPAN_POLICY, SPAN_OBSERVATION, SPAN_REMINDER, SPAN_SUMMARY, SPAN_FORMAT,
)

STATUSES: tuple[str, ...] = (
    "submitted",  # the policy submitted and the workflow accepted it
    "max_turns",  # the turn limit ended the episode
    "format_errors",  # too many consecutive unparseable outputs
    "context_exceeded",  # the prompt no longer fits the context window
    "error",  # the environment or the policy raised; ``error`` says what
)


def run_length(labels: Sequence[str]) -> list[tuple[str, int]]:
    """Returns ``labels`` as (label, count) runs."""
    return [(label, sum(1 for _ in run)) for label, run in itertools.groupby(labels)]


def expand_runs(runs: Iterable[Sequence[Any]]) -> list[str]:
    """Returns the per-token labels of run-length encoded spans."""
    return [str(label) for label, count in runs for _ in range(int(count))]


@dataclass
class Turn:
    """One policy call: exact prompt ids (with spans), sampled ids, log-probs, and what followed."""

    index: int
    prompt_ids: list[int]
    prompt_spans: list[tuple[str, int]]
    completion_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: str
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    observation: str = ""
    error: str | None = None  # "format" or "tool" when the output could not be acted on
    kind: str = "action"  # "action" or "plan"
    # One record per executed call: {"tool", "failed", "exit_code", "submitted"} (behaviour metrics)
    outcomes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if sum(n for _, n in self.prompt_spans) != len(self.prompt_ids):
            raise ValueError(f"turn {self.index}: prompt spans do not cover the prompt ids")
        if len(self.completion_logprobs) != len(self.completion_ids):
            raise ValueError(f"turn {self.index}: one log-probability per sampled token is required")

    def prompt_labels(self) -> list[str]:
        return expand_runs(self.prompt_spans)

    def training_sample(self) -> TrainingSample:
        """Returns prompt + completion with a loss mask that is 1 on sampled tokens only."""
        return TrainingSample(
            input_ids=[*self.prompt_ids, *self.completion_ids],
            loss_mask=[0] * len(self.prompt_ids) + [1] * len(self.completion_ids),
            old_logprobs=[0.0] * len(self.prompt_ids) + list(self.completion_logprobs),
            spans=[*self.prompt_labels(), *([SPAN_POLICY] * len(self.completion_ids))],
            turn_starts=[(self.index, len(self.prompt_ids))],
        )


@dataclass
class TrainingSample:
    """One sequence for the trainer: ids, loss mask (policy tokens), rollout log-probs, spans."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    spans: list[str]
    # (turn index, position of the turn's first sampled token) for every turn in the sequence
    turn_starts: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Trajectory:
    """One episode: task, harness configuration, turns, outcome and metrics.

    ``config`` is the evaluation target the episode ran under (an in-space code such as
    ``S1-T2-O0-C1-W2``, an out-of-space name, or ``ext:<agent>``); ``harness`` is the harness
    that rendered the prompts. They are equal except for external agents, where ``config`` is
    ``ext:<agent>`` and ``harness`` the agent program's name.
    """

    task_id: str
    config: str  # the evaluation target (``ext:<agent>`` for an external agent)
    harness: str  # what rendered the prompts (the agent's name for an external agent)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    passed: bool = False
    status: str = "error"
    answer: str | None = None
    error: str | None = None
    policy: str = ""
    seed: int = 0
    out_of_space: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    verdict: list[dict[str, Any]] = field(default_factory=list)
    # The sibling harness it ran under ({"id", "hash", "base"}); empty for other harnesses.
    sibling: dict[str, str] = field(default_factory=dict)

    @property
    def n_policy_tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)

    def training_samples(self, merge: bool = True) -> list[TrainingSample]:
        """Returns the sequences to train on.

        With ``merge``, consecutive turns whose prompt extends the previous prompt plus
        completion exactly (append-only context) are merged into one sequence, so a C0
        episode trains as one sequence; any rewrite (C1 masking, C2 compaction) starts a
        new sequence. Either way every trained token is a token the policy sampled.
        """
        samples: list[TrainingSample] = []
        for turn in self.turns:
            sample = turn.training_sample()
            if merge and samples:
                last = samples[-1]
                n = len(last.input_ids)
                if len(turn.prompt_ids) >= n and turn.prompt_ids[:n] == last.input_ids:
                    extra = turn.prompt_ids[n:]
                    extra_spans = turn.prompt_labels()[n:]
                    last.turn_starts.append((turn.index, len(turn.prompt_ids)))
                    last.input_ids += [*extra, *turn.completion_ids]
                    last.loss_mask += [0] * len(extra) + [1] * len(turn.completion_ids)
                    last.old_logprobs += [0.0] * len(extra) + list(turn.completion_logprobs)
                    last.spans += [*extra_spans, *([SPAN_POLICY] * len(turn.completion_ids))]
                    continue
            samples.append(sample)
        return samples

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for turn in out["turns"]:
            turn["prompt_spans"] = [list(run) for run in turn["prompt_spans"]]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        turns = [
            Turn(**{**t, "prompt_spans": [(str(a), int(b)) for a, b in t["prompt_spans"]]})
            for t in data.pop("turns", [])
        ]
        return cls(turns=turns, **data)

    def transcript(self, tokenizer: Any = None, show_spans: bool = False) -> str:
        """Returns a readable transcript: each turn's output, then what the harness answered."""
        lines = [
            f"=== task {self.task_id} | harness {self.harness} ({self.config}) | status {self.status} "
            f"| reward {self.reward:.1f} ==="
        ]
        if self.sibling:
            lines.append(
                f"=== sibling {self.sibling.get('id')} (hash {self.sibling.get('hash')}) of base {self.sibling.get('base')} ==="
            )
        if self.turns and tokenizer is not None:
            first = self.turns[0]
            if show_spans:
                ids, pos = first.prompt_ids, 0
                for span, count in first.prompt_spans:
                    lines.append(f"[{span}] {tokenizer.decode(ids[pos:pos + count])}")
                    pos += count
            else:
                lines.append(tokenizer.decode(first.prompt_ids))
        for turn in self.turns:
            lines.append(f"--- turn {turn.index} ({turn.kind}) policy:")
            lines.append(turn.text)
            if turn.observation:
                lines.append(f"--- turn {turn.index} harness:")
                lines.append(turn.observation)
        if self.answer is not None:
            lines.append(f"=== answer: {self.answer!r}")
        if self.verdict:
            lines += [f"{'PASS' if v['passed'] else 'FAIL'} {v['name']}: {v['detail']}" for v in self.verdict]
        if self.error:
            lines.append(f"=== error: {self.error}")
        return "\n".join(lines)


def save_jsonl(trajectories: Iterable[Trajectory], path: str | Path, append: bool = False) -> int:
    """Writes one trajectory per line; returns how many were written. The file is written
    through a rename (``append``: the lines are appended in one piece, cut back if it fails),
    so a full disk or a kill never leaves part of a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n" for trajectory in trajectories]
    (append_text if append else write_text_atomic)(path, "".join(lines))
    return len(lines)


def iter_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Yields the trajectories of a JSONL file; a bad line stops with its line number."""
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"{path} line {number}: not a trajectory record: {exc}") from None


def load_jsonl(path: str | Path) -> list[Trajectory]:
    """Returns all trajectories of a JSONL file."""
    return list(iter_jsonl(path))
