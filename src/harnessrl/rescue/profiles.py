"""Behaviour profiles and LLM voters: the evidence and the votes of profile routing (Harness-S).

At every anchor a writer model reads each sibling's paired validation runs against H0 and
writes its profile P_i = {prefer, avoid}, each a list of {when: a task condition, behavior: how
the sibling's runs differ from H0's}. Before a task runs, every voter ranks the siblings from
their profiles; ``router.ProfileRouter`` sums the rank weights (1, 3/4, 1/2, 1/4) and takes the
Top-K. Both talk to any OpenAI-compatible endpoint (``rescue.llm.ChatClient``; a served local
model included). Prompts are the template files ``prompts/profile.md`` and ``prompts/vote.md``.
A malformed answer is counted and dropped: a sibling keeps an empty profile, a vote is left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from harnessrl.rescue.diagnose import excerpt
from harnessrl.rescue.llm import ChatClient, fill, json_answer, prompt_template
from harnessrl.rescue.router import TaskInfo, Voter
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory

MAX_PAIRS_SHOWN = 12
MAX_ENTRIES = 8


def client_from_spec(spec: str, temperature: float = 0.6) -> ChatClient:
    """Returns a chat client for ``MODEL@URL`` (the endpoint's base URL, ``/v1`` optional)."""
    model, sep, url = spec.partition("@")
    if not sep or not model or not url:
        raise ValueError(f"endpoint {spec!r}: expected MODEL@URL, e.g. embedded@http://127.0.0.1:8000")
    return ChatClient(url, model, temperature=temperature)


def require_reachable(client: ChatClient, timeout_s: float = 10.0) -> None:
    """Raises ``ValueError`` naming the fix when the endpoint does not answer ``GET /v1/models``
    (a run must not route on a voter that is not there: every vote would be dropped)."""
    base = client.endpoint.removesuffix("/chat/completions")
    try:
        httpx.get(f"{base}/models", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as exc:
        raise ValueError(f"profile routing endpoint {base} does not answer ({type(exc).__name__}: {exc}); start "
                         "it first (e.g. `harnessrl serve --port 8000 &`) or use router: validation") from None


def _entries(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list")
    out = []
    for item in value[:MAX_ENTRIES]:
        if not isinstance(item, dict) or not isinstance(item.get("when"), str) or not isinstance(item.get("behavior"), str):
            raise ValueError(f"{where} entries need string fields 'when' and 'behavior'")
        out.append({"when": item["when"][:300], "behavior": item["behavior"][:300]})
    return out


def parse_profile(text: str) -> dict[str, list[dict[str, str]]]:
    """Returns the profile in a model's answer; raises ``ValueError`` when it is malformed."""
    answer = json_answer(text)
    return {"prefer": _entries(answer.get("prefer", []), "prefer"), "avoid": _entries(answer.get("avoid", []), "avoid")}


def _outcome(trajectory: Trajectory) -> str:
    last = trajectory.turns[-1].text if trajectory.turns else ""
    return f"{'passed' if trajectory.passed else 'failed'} ({trajectory.status}): {excerpt(last, 160)}"


@dataclass
class ProfileWriter:
    """Writes each sibling's behaviour profile from its paired runs against H0."""

    client: ChatClient
    answers: int = 0
    dropped: int = 0

    def profile(self, sibling: str, h0: str, pairs: Sequence[tuple[Task, Trajectory, Trajectory]]) -> dict[str, Any]:
        """Returns one sibling's profile (empty when the answer was malformed: counted)."""
        lines = [f"- {excerpt(task.instruction, 160)} [family {task.family}]\n  under {h0}: {_outcome(base)}\n"
                 f"  under {sibling}: {_outcome(mine)}" for task, base, mine in pairs[:MAX_PAIRS_SHOWN]]
        prompt = fill(prompt_template("profile"), sibling=sibling, h0=h0, pairs="\n".join(lines))
        self.answers += 1
        try:
            return parse_profile(self.client.ask(prompt))
        except ValueError:
            self.dropped += 1
            return {"prefer": [], "avoid": []}

    def profiles(
        self, h0: str, runs: Mapping[str, Mapping[str, Trajectory]], tasks: Sequence[Task]
    ) -> dict[str, dict[str, Any]]:
        """Returns the profile of every harness in ``runs`` other than ``h0`` (runs: harness ->
        task id -> trajectory, from the paired validation)."""
        base = runs.get(h0, {})
        out = {}
        for sibling, mine in runs.items():
            if sibling == h0:
                continue
            pairs = [(t, base[t.id], mine[t.id]) for t in tasks if t.id in base and t.id in mine]
            out[sibling] = self.profile(sibling, h0, pairs)
        return out


def llm_voter(client: ChatClient, seed: int | None = None) -> Voter:
    """Returns a voter that asks ``client`` to rank the siblings (``seed`` makes voters of one
    endpoint differ); it raises ``ValueError`` for a malformed answer, which the router counts."""

    def vote(task: TaskInfo, profiles: Mapping[str, Mapping[str, Any]]) -> list[str]:
        siblings = "\n".join(f"- {name}: {json.dumps(profile, ensure_ascii=False)}" for name, profile in profiles.items())
        prompt = fill(prompt_template("vote"), task=f"{excerpt(task.instruction, 400)} [family {task.family}]",
                      siblings=siblings)
        answer = json_answer(client.ask(prompt, seed=seed))
        ranking = answer.get("ranking")
        if not isinstance(ranking, list) or not all(isinstance(name, str) for name in ranking):
            raise ValueError("the answer has no 'ranking' list of names")
        return ranking

    return vote
