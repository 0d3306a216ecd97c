"""Editors: from a parent's diagnosis to candidate patches, each targeting 2-3 related root
causes (each backed by at least 2 failed tasks).

``RuleEditor`` uses a library from root causes to edits, parameterized by what the failures
show (a ``tool_hint`` quotes the exact call the policy wrote that the interface could not
parse). Causes are clustered greedily: the most supported cause first, then up to two more
that share its family or co-occur with it on failed tasks. The LLM editor
(``rescue/llm.py``) answers the same ``Candidate`` list.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from harnessrl.harness.harness import Harness
from harnessrl.harness.registry import default_space
from harnessrl.harness.siblings import (
    Edit,
    GuardRule,
    Hook,
    Limits,
    RecoveryRule,
    SetLevel,
    Sibling,
    Skill,
    SystemAddendum,
    ToolHint,
)
from harnessrl.rescue.diagnose import ROOT_CAUSES, Diagnosis

MIN_SUPPORT = 2  # failed tasks behind a targeted cause (the paper: at least 2)
MAX_TARGETS = 3


@dataclass
class Candidate:
    """A proposed patch on top of a parent: the new edits, the causes they target and why."""

    edits: list[Edit]
    targets: list[str]
    rationale: str
    source: str = "rule"


class Editor(Protocol):
    """Proposes up to ``n`` candidates for a parent from its diagnosis."""

    def propose(self, parent: Sibling, harness: Harness, diagnosis: Diagnosis, n: int, rng: random.Random) -> list[Candidate]: ...


def cluster_causes(diagnosis: Diagnosis, min_support: int = MIN_SUPPORT) -> list[list[str]]:
    """Returns groups of 1-3 related supported causes, most supported first."""
    supported = diagnosis.supported(min_support)
    free = [c for c in supported if c in ROOT_CAUSES]
    clusters = []
    while free:
        seed = free.pop(0)
        family = ROOT_CAUSES[seed][0]
        related = sorted(
            (c for c in free if ROOT_CAUSES[c][0] == family or diagnosis.co_occurrence(seed, c) >= min_support),
            key=lambda c: (-diagnosis.co_occurrence(seed, c), -len(supported[c]), c),
        )[: MAX_TARGETS - 1]
        for c in related:
            free.remove(c)
        clusters.append([seed, *related])
    return clusters


# ---- the library: cause -> edit makers (first: the primary edit; later: variants) -------------

EditMaker = Callable[[Harness, list[str], list[str]], list[Edit]]  # (parent, evidence, targets) -> edits


def _main_tool(harness: Harness) -> str:
    names = [s.name for s in harness.tools.specs() if s.name != harness.tools.submit_tool]
    return names[0] if names else harness.tools.submit_tool


def _syntax_hint(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    quoted = evidence[0].split("; harness said:")[0] if evidence else "an unparseable call"
    example = harness.tools.example().strip()
    text = (f"Your earlier output {quoted[:300]} was not understood. Write every call exactly in this "
            f"syntax, with the same keys:\n{example[:600]}")
    return [ToolHint(tool=_main_tool(harness), text=text, rationale="quote the unparsed call and the right syntax",
                     root_causes=tuple(targets))]


def _other_interface(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    if harness.out_of_space:
        return []
    n = default_space().factor("T").n_levels
    level = (harness.tools.level + 1) % n
    return [SetLevel(factor="T", level=level, rationale="a tool syntax the policy writes", root_causes=tuple(targets))]


def _tool_names(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    names = ", ".join(s.name for s in harness.tools.specs())
    return [SystemAddendum(text=f"The only tools are: {names}. Any other tool name is rejected.",
                           rationale="name the tools", root_causes=tuple(targets))]


def _argument_hint(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    said = evidence[0].split("harness said:")[-1].strip() if evidence else "bad arguments"
    return [ToolHint(tool=_main_tool(harness), text=f"Arguments must match the schema exactly (an earlier call got: {said[:300]}).",
                     rationale="quote the argument error", root_causes=tuple(targets))]


def _submit_reminder(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    submit = harness.tools.submit_tool
    return [Hook(at="after_step", every=2, rationale="remind to submit", root_causes=tuple(targets),
                 text=f"When the task is done, submit now with `{submit}` (include the answer if the task asks "
                      "for one); do not keep inspecting.")]


def _submit_rule(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [SystemAddendum(text="Finish as soon as the result is in place: submit right away, you cannot earn more by "
                                "looking around.", rationale="submit early", root_causes=tuple(targets))]


def _repeat_guard(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [GuardRule(effect="hint", repeats=3, root_causes=tuple(targets), rationale="break repetition loops",
                      message="You ran this exact call three times in a row. If the work is done, submit; "
                              "otherwise try a different step.")]


def _recovery_hint(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [RecoveryRule(rationale="surface failures", root_causes=tuple(targets),
                         hint="The last command failed (see the error above). Work out why and redo that step "
                              "correctly before moving on.")]


def _timeout_hint(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [RecoveryRule(pattern="(?i)timed out", rationale="avoid long commands", root_causes=tuple(targets),
                         hint="That command timed out. Use a faster or more selective command.")]


def _check_before_submit(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [Hook(at="before_submit", command="ls -la", rationale="review before finishing", root_causes=tuple(targets),
                 text="Before finishing: re-read the task, check that every file it names exists with the exact "
                      "content and format asked for, and that every command you relied on succeeded.")]


def _verify_skill(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [Skill(name="verify before submitting", rationale="a verification procedure", root_causes=tuple(targets),
                  steps=("List the files the task names.", "Print each output file and compare it with the task.",
                         "Fix any difference, then submit."))]


def _file_names(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [Hook(at="start", command="ls -la", rationale="show the workspace", root_causes=tuple(targets),
                 text="Use the exact file names and paths the task gives. The workspace at the start:")]


def _protect_tests(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [GuardRule(effect="block", pattern=r"(^|/)tests?/", tool=None, rationale="tests are read-only",
                      root_causes=tuple(targets), message="Test files are read-only; change the code under test instead.")]


def _shorter_output(harness: Harness, evidence: list[str], targets: list[str]) -> list[Edit]:
    return [Limits(output_chars=1500, rationale="keep the context small", root_causes=tuple(targets))]


LIBRARY: dict[str, list[EditMaker]] = {
    "unparseable_output": [_syntax_hint, _other_interface],
    "unknown_tool": [_tool_names],
    "bad_arguments": [_argument_hint],
    "never_submitted": [_submit_reminder, _submit_rule],
    "same_action_repeated": [_repeat_guard],
    "context_exceeded": [_shorter_output],
    "error_ignored": [_recovery_hint],
    "timeouts": [_timeout_hint],
    "submitted_wrong": [_check_before_submit, _verify_skill],
    "wrong_file_edited": [_file_names],
    "protected_tests_edited": [_protect_tests],
}


@dataclass
class RuleEditor:
    """Candidates from ``LIBRARY``: one per cause cluster with the primary edits, then variants
    (a cluster's causes with their alternative edits) until ``n``, in seeded order."""

    library: dict[str, list[EditMaker]] = field(default_factory=lambda: dict(LIBRARY))
    name: str = "rule"

    def _candidate(self, harness: Harness, diagnosis: Diagnosis, causes: list[str], variant: int) -> Candidate | None:
        edits: list[Edit] = []
        used = False
        for cause in causes:
            makers = self.library.get(cause, [])
            if not makers:
                continue
            maker = makers[min(variant, len(makers) - 1)]
            used = used or variant < len(makers)
            edits += maker(harness, diagnosis.evidence(cause), causes)
        if not edits or (variant > 0 and not used):
            return None
        return Candidate(edits, list(causes), f"targets {', '.join(causes)}" + (f" (variant {variant})" if variant else ""))

    def propose(self, parent: Sibling, harness: Harness, diagnosis: Diagnosis, n: int, rng: random.Random) -> list[Candidate]:
        clusters = cluster_causes(diagnosis)
        primary = [c for causes in clusters if (c := self._candidate(harness, diagnosis, causes, 0))]
        variants = [c for causes in clusters if (c := self._candidate(harness, diagnosis, causes, 1))]
        rng.shuffle(variants)
        return (primary + variants)[:n]
