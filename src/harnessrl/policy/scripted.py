"""Scripted policies: the oracle (gold solution through any harness), random text, replay.

They implement the same token-in/token-out ``Policy`` protocol as model policies: they
write text, tokenize it with their tokenizer, end it with the stop token, and report
log-probabilities of 0.0 (the text is chosen with certainty).
"""

from __future__ import annotations

import random
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from harnessrl.harness.chat import ByteTokenizer, ChatTokenizer
from harnessrl.policy.base import EpisodeView, Generation, GenerationRequest, Policy, RequestContext
from harnessrl.tasks.model import Action

if TYPE_CHECKING:
    from harnessrl.trajectory import Trajectory


def _generation(tokenizer: ChatTokenizer, text: str, max_new_tokens: int) -> Generation:
    ids = tokenizer.completion_ids(text)
    if len(ids) > max_new_tokens:
        ids = ids[:max_new_tokens]
        return Generation(ids, [0.0] * len(ids), "length")
    return Generation(ids, [0.0] * len(ids), "stop")


def plan_text(actions: Sequence[Action]) -> str:
    """Returns a numbered plan describing the abstract actions."""
    lines = ["Plan:"]
    for i, action in enumerate(actions, start=1):
        if action.kind == "write_file":
            lines.append(f"{i}. Write {action.path}.")
        elif action.kind == "edit_file":
            lines.append(f"{i}. Edit {action.path}.")
        elif action.kind == "delete_file":
            lines.append(f"{i}. Delete {action.path}.")
        elif action.kind == "run":
            lines.append(f"{i}. Run: {str(action.command).splitlines()[0][:80]}")
        else:
            lines.append(f"{i}. Submit the result.")
    return "\n".join(lines)


def describe_action(action: Action) -> str:
    """Returns a one-line thought that says what the action does and why (a demonstration
    teaches more when its reasoning names the file, command or answer it acts on)."""
    if action.kind == "write_file":
        return f"I will write the file {action.path} with the required content."
    if action.kind == "edit_file":
        return f"I will edit {action.path}, replacing the exact text that has to change."
    if action.kind == "delete_file":
        return f"I will delete the file {action.path}, which must not remain."
    if action.kind == "run":
        first = str(action.command).strip().splitlines()[0] if str(action.command).strip() else ""
        return f"I will run `{first[:100]}` in the workspace."
    if action.answer:
        return f"The work is done; I submit the answer {action.answer.strip()[:100]}."
    return "The work is done and checked; I submit."


class OraclePolicy(Policy):
    """Replays each task's gold solution in the syntax of the episode's harness (it reads the
    request's ``EpisodeView``: task, harness, state).

    Under a plan-first workflow it first writes a plan; after a review it submits again.
    A gold solution without a submit gets one appended.
    """

    name = "oracle"

    def __init__(self, tokenizer: ChatTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        # episode -> index of its next gold action (weak: finished episodes drop out)
        self._cursor: weakref.WeakKeyDictionary[EpisodeView, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _text(self, episode: EpisodeView) -> str:
        gold = list(episode.task.gold)
        if not gold or gold[-1].kind != "submit":
            gold.append(Action.submit(""))
        tools, state = episode.harness.tools, episode.state
        if episode.harness.workflow.wants_plan(state):
            return plan_text(gold)
        with self._lock:
            cursor = self._cursor.get(episode, 0)
            self._cursor[episode] = cursor + 1
        # Asked again after the final submit (a W2 review): submit again.
        action = gold[min(cursor, len(gold) - 1)]
        return tools.render(action, thought=describe_action(action))

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            episode = request.context
            if not isinstance(episode, EpisodeView):
                out.append(Generation([], [], "error", error="the oracle needs the episode as context"))
                continue
            out.append(_generation(self.tokenizer, self._text(episode), request.params.max_new_tokens))
        return out


class RandomPolicy(Policy):
    """Emits random fragments of plausible and implausible agent text (seeded); for tests."""

    name = "random"
    FRAGMENTS = (
        "```bash\nls -la\n```", "```bash\ncat README.md\n```", "I will look around.",
        '{"name": "bash", "arguments": {"command": "pwd"}}', "<tool_call>{\"name\": \"Glob\"",
        "<tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"echo hi\"}}</tool_call>",
        "```\nrm -rf /\n```", "submit", "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
        '{"name": "submit", "arguments": {"answer": "42"}}', "}}}{{{", "\x00\x01",
    )

    def __init__(self, seed: int = 0, tokenizer: ChatTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self.rng = random.Random(seed)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            text = " ".join(self.rng.choice(self.FRAGMENTS) for _ in range(self.rng.randint(1, 3)))
            out.append(_generation(self.tokenizer, text, request.params.max_new_tokens))
        return out


class ReplayPolicy(Policy):
    """Replays the sampled ids of a saved trajectory, turn by turn."""

    name = "replay"

    def __init__(self, trajectory: Trajectory, tokenizer: ChatTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self.turns = list(trajectory.turns)
        self.position = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for _ in requests:
            if self.position >= len(self.turns):
                out.append(Generation([], [], "error", error="replay exhausted"))
                continue
            turn = self.turns[self.position]
            self.position += 1
            out.append(Generation(list(turn.completion_ids), list(turn.completion_logprobs), turn.finish_reason))
        return out


SCRIPTED_POLICIES = {"oracle": OraclePolicy, "random": RandomPolicy}


class CallbackPolicy(Policy):
    """Writes, for each request, the text ``respond(request.context)`` returns (tokenized,
    ended with the stop token, log-probabilities 0.0): a scripted policy for the server,
    whose context is a ``ConversationView`` (``serve.context.ServeContext``)."""

    name = "callback"

    def __init__(self, respond: Callable[[RequestContext | None], str], tokenizer: ChatTokenizer | None = None, name: str | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self.respond = respond
        if name is not None:
            self.name = name

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [
            _generation(self.tokenizer, self.respond(request.context), request.params.max_new_tokens)
            for request in requests
        ]
