"""The LLM diagnoser and editor: the same interfaces as the offline ones, answered by a model
behind any OpenAI-compatible chat endpoint (temperature 0.6, as in Harness-S).

Prompts are the template files ``rescue/prompts/diagnose.md`` and ``edit.md`` (their
placeholders are documented at the top of each). Answers must be JSON; one that does not
parse, or does not validate against the edit schema, is counted in ``dropped`` and left out,
and an endpoint that fails is counted the same way: never a crash.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from importlib import resources
from typing import Any

import httpx
import yaml

from harnessrl.harness.harness import Harness
from harnessrl.harness.siblings import Patch, PatchError, Sibling, edit_kinds
from harnessrl.rescue.diagnose import (
    ROOT_CAUSES,
    Diagnoser,
    Diagnosis,
    Failure,
    OfflineDiagnoser,
    excerpt,
)
from harnessrl.rescue.editors import Candidate, Editor, RuleEditor, cluster_causes
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory

EDITOR_TEMPERATURE = 0.6  # Harness-S, Appendix B
MAX_FAILURES_SHOWN = 20
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


@cache
def prompt_template(name: str) -> str:
    """Returns ``prompts/<name>.md`` without its leading comment."""
    text = resources.files("harnessrl.rescue").joinpath("prompts", f"{name}.md").read_text("utf-8")
    return re.sub(r"\A<!--.*?-->\s*", "", text, flags=re.S)


def fill(template: str, **values: str) -> str:
    """Substitutes ``{name}`` placeholders by name (braces of JSON examples stay)."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def json_answer(text: str) -> Any:
    """Returns the JSON object in a model's answer (bare, or in a ```json fence); raises
    ``ValueError`` when there is none."""
    for candidate in [*_FENCE.findall(text), text]:
        start, end = candidate.find("{"), candidate.rfind("}")
        if start < 0 or end <= start:
            continue
        try:
            return json.loads(candidate[start:end + 1])
        except json.JSONDecodeError:
            continue
    raise ValueError(f"no JSON object in the answer: {excerpt(text, 120)!r}")


@dataclass
class ChatClient:
    """A minimal OpenAI-compatible chat client: one user message in, the answer text out."""

    url: str
    model: str
    temperature: float = EDITOR_TEMPERATURE
    max_tokens: int = 1024
    timeout_s: float = 120.0

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        return (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"

    def ask(self, prompt: str, seed: int | None = None) -> str:
        """Returns the model's answer; raises ``ValueError`` for a failed or malformed response."""
        body: dict[str, Any] = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                                "temperature": self.temperature, "max_tokens": self.max_tokens}
        if seed is not None:
            body["seed"] = seed
        try:
            response = httpx.post(self.endpoint, json=body, timeout=self.timeout_s)
            response.raise_for_status()
            return str(response.json()["choices"][0]["message"]["content"] or "")
        except (httpx.HTTPError, KeyError, IndexError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{self.endpoint}: {type(exc).__name__}: {exc}") from None


def _failure_block(trajectory: Trajectory) -> str:
    lines = [f"- task {trajectory.task_id} (status {trajectory.status}, {len(trajectory.turns)} turns)"]
    for turn in trajectory.turns[-3:]:
        lines.append(f"  output: {excerpt(turn.text, 200)}")
        if turn.observation:
            lines.append(f"  harness: {excerpt(turn.observation, 200)}")
    return "\n".join(lines)


@dataclass
class LLMDiagnoser:
    """Root causes assigned by a model; failures it leaves unlabelled keep the offline causes."""

    client: ChatClient
    fallback: Diagnoser = field(default_factory=OfflineDiagnoser)
    name: str = "llm"
    dropped: int = 0

    def diagnose(self, trajectories: Sequence[Trajectory], tasks: Mapping[str, Task]) -> Diagnosis:
        diagnosis = self.fallback.diagnose(trajectories, tasks)
        failed = [t for t in trajectories if not t.passed][:MAX_FAILURES_SHOWN]
        if not failed:
            return diagnosis
        causes = "\n".join(f"{name}: {description}" for name, (_, description) in ROOT_CAUSES.items())
        prompt = fill(prompt_template("diagnose"), causes=causes, failures="\n".join(map(_failure_block, failed)))
        try:
            answer = json_answer(self.client.ask(prompt))
            labels = {str(item["task"]): [c for c in item["causes"] if c in ROOT_CAUSES]
                      for item in answer["failures"]}
        except (ValueError, KeyError, TypeError) as exc:
            self.dropped += 1
            diagnosis.dropped += 1
            diagnosis.notes.append(f"LLM diagnosis dropped: {exc}"[:300])
            return diagnosis
        relabelled: list[Failure] = []
        for failure in diagnosis.failures:
            named = labels.get(failure.task_id)
            if named:
                evidence = {c: failure.evidence.get(c, "") for c in named}
                relabelled.append(Failure(failure.task_id, failure.harness, named, evidence))
            else:
                relabelled.append(failure)
        diagnosis.failures = relabelled
        return diagnosis


def kinds_text() -> str:
    """Returns the edit kinds and their fields, for the editor prompt."""
    lines = []
    for kind, cls in sorted(edit_kinds().items()):
        names = [f.name for f in fields(cls) if f.name not in ("rationale", "root_causes")]
        lines.append(f"- {kind}: {cls.description}; fields: {', '.join(names)}")
    return "\n".join(lines)


def diagnosis_text(diagnosis: Diagnosis) -> str:
    lines = []
    for cause, tasks in diagnosis.supported().items():
        lines.append(f"- {cause}: {len(tasks)} tasks ({', '.join(tasks[:5])})")
        lines += [f"    evidence: {e}" for e in diagnosis.evidence(cause, 2)]
    return "\n".join(lines) or "(no cause is backed by two failed tasks)"


@dataclass
class LLMEditor:
    """One model call per candidate; the answer is a JSON patch validated against the schema."""

    client: ChatClient
    name: str = "llm"
    answers: int = 0
    dropped: int = 0
    problems: list[str] = field(default_factory=list)

    def propose(self, parent: Sibling, harness: Harness, diagnosis: Diagnosis, n: int, rng: random.Random) -> list[Candidate]:
        clusters = cluster_causes(diagnosis)
        if not clusters:
            return []
        current = yaml.safe_dump({"base": parent.base, "patch": parent.patch.to_dict()}, sort_keys=False)
        candidates = []
        for index in range(n):
            targets = clusters[index % len(clusters)]
            prompt = fill(prompt_template("edit"), harness=current, diagnosis=diagnosis_text(diagnosis),
                          kinds=kinds_text(), targets=", ".join(targets))
            self.answers += 1
            try:
                patch = Patch.from_dict(json_answer(self.client.ask(prompt, seed=rng.randrange(2**31))), "LLM answer")
                if not patch.edits:
                    raise ValueError("the patch has no edits")
            except (ValueError, PatchError) as exc:
                self.dropped += 1
                self.problems.append(str(exc)[:300])
                continue
            candidates.append(Candidate(list(patch.edits), list(targets), patch.rationale or "LLM edit", source="llm"))
        return candidates


def _client(url: str | None, model: str | None, who: str) -> ChatClient:
    if not url or not model:
        raise ValueError(f"the LLM {who} needs --editor-url URL and --editor-model NAME (an OpenAI-compatible endpoint)")
    return ChatClient(url, model)


def make_diagnoser(kind: str, url: str | None = None, model: str | None = None) -> Diagnoser:
    """Returns the ``offline`` or ``llm`` diagnoser."""
    return LLMDiagnoser(_client(url, model, "diagnoser")) if kind == "llm" else OfflineDiagnoser()


def make_editor(kind: str, url: str | None = None, model: str | None = None) -> Editor:
    """Returns the ``rule`` or ``llm`` editor."""
    return LLMEditor(_client(url, model, "editor")) if kind == "llm" else RuleEditor()
