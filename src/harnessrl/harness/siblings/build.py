"""``build(sibling) -> Harness``: apply a sibling's edits to its base harness by wrapping the
base's components, and ``build_member("DIR#ID")`` for one member of a pool folder.

Order: ``set_level`` edits pick the base's components; every other edit records its addition
on ``SiblingParts``; the base's system prompt, tool interface, observation format and
workflow are then wrapped (``harness/siblings/components.py``) and the episode hooks set. A
user edit kind that needs more than the parts offer appends a function to ``parts.finishers``,
called with the built harness.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harnessrl.harness.base import PromptContext
from harnessrl.harness.harness import (
    OUT_OF_SPACE_PRESETS,
    SIBLING_SEPARATOR,
    Harness,
    HarnessLimits,
)
from harnessrl.harness.registry import component_class, default_space
from harnessrl.harness.siblings.components import (
    SiblingHooks,
    SiblingObservation,
    SiblingPrompt,
    SiblingTools,
    SiblingWorkflow,
    section_titles,
)
from harnessrl.harness.siblings.edits import PatchError, SiblingParts
from harnessrl.harness.siblings.patch import Sibling, load_sibling, sibling_file, sibling_ids

TURN_CEILING_FACTOR = 2  # a limits edit may at most double the run's turn limit


def _base_harness(sibling: Sibling, levels: dict[str, int], limits: HarnessLimits | None) -> Harness:
    """Returns the base harness with the ``set_level`` swaps applied."""
    if sibling.base in OUT_OF_SPACE_PRESETS:
        harness = Harness.out_of_space_harness(sibling.base, limits)
        for letter, level in levels.items():
            harness.components[letter] = component_class(letter, level)()
        return harness
    try:
        config = default_space().parse(sibling.base)
    except ValueError as exc:
        raise PatchError(
            f"sibling {sibling.id}: base {sibling.base!r} is neither a configuration code nor an out-of-space "
            f"harness ({', '.join(OUT_OF_SPACE_PRESETS)}): {exc}") from None
    return Harness.from_config(config.replace(**levels) if levels else config, limits)


def _limits(run: HarnessLimits, asked: dict[str, int]) -> HarnessLimits:
    """Returns the run's limits with a sibling's requests applied inside the run's ceilings."""
    changes = {}
    if "max_turns" in asked:
        changes["max_turns"] = min(asked["max_turns"], TURN_CEILING_FACTOR * run.max_turns)
    if "max_new_tokens" in asked:
        changes["max_new_tokens"] = min(asked["max_new_tokens"], run.max_new_tokens)
    return replace(run, **changes) if changes else run


def build(sibling: Sibling, limits: HarnessLimits | None = None, code: str | None = None) -> Harness:
    """Returns the harness of ``sibling`` under the run's ``limits``, named ``code`` (default:
    the sibling's id); raises ``PatchError`` when an edit does not apply to the base (a tool
    the interface lacks, a section the system message lacks)."""
    parts = SiblingParts()
    for edit in sibling.patch.edits:
        edit.apply(parts)
    harness = _base_harness(sibling, parts.levels, limits)
    harness.limits = _limits(harness.limits, parts.limits)
    tools = SiblingTools(harness.tools, parts.tool_hints)
    offered = {spec.name for spec in harness.tools.specs()}
    for hint in parts.tool_hints:
        if hint.tool not in offered:
            raise PatchError(
                f"sibling {sibling.id}: tool_hint names tool {hint.tool!r}, which {harness.tools.name} does not "
                f"offer. Fix: use one of {', '.join(sorted(offered))}")
    harness.system = SiblingPrompt(harness.system, parts.addenda, parts.skills)
    harness.tools = tools
    if "output_chars" in parts.limits:
        harness.observation = SiblingObservation(harness.observation, parts.limits["output_chars"])
    harness.workflow = SiblingWorkflow(harness.workflow, parts.recoveries, parts.hooks)
    harness.hooks = SiblingHooks(harness.hooks, parts.guards, parts.hooks, tools.submit_tool)
    check_sections(sibling, harness, parts)
    harness.code = code or sibling.id
    harness.sibling = sibling.identity()
    for finish in parts.finishers:
        finish(harness)
    return harness


def check_sections(sibling: Sibling, harness: Harness, parts: SiblingParts) -> None:
    """Raises ``PatchError`` when an addendum names a section the base's system message
    lacks (rendered once for a probe task)."""
    wanted = [a for a in parts.addenda if a.position == "after_section"]
    if not wanted:
        return
    from harnessrl.tasks.model import Task
    from harnessrl.tasks.verify import AnswerEquals

    probe = Task(id="probe", instruction="(probe)", verifier=AnswerEquals("probe"), gold=[])
    inner = harness.system.inner if isinstance(harness.system, SiblingPrompt) else harness.system
    text = inner.system_message(PromptContext(probe, harness.tools, harness.workflow, harness.limits.max_turns))
    titles = section_titles(text)
    for addendum in wanted:
        if addendum.section.strip().lower() not in {t.strip().lower() for t in titles}:
            raise PatchError(
                f"sibling {sibling.id}: system_addendum field 'section': {addendum.section!r} is not a section of "
                f"{inner.name}'s system message. Fix: use one of {', '.join(titles) or '(none: use position: end)'}")


def split_member(name: str) -> tuple[Path, str]:
    """Returns (pool folder, sibling id) of a ``DIR#ID`` name."""
    folder, _, sibling_id = name.rpartition(SIBLING_SEPARATOR)
    if not folder or not sibling_id:
        raise ValueError(f"{name!r}: a pool member is named DIR{SIBLING_SEPARATOR}ID (a pool folder and a sibling id)")
    return Path(folder), sibling_id


def build_member(name: str, limits: HarnessLimits | None = None) -> Harness:
    """Returns the harness of pool member ``DIR#ID``, named ``DIR#ID``."""
    folder, sibling_id = split_member(name)
    path = sibling_file(folder, sibling_id)
    if not path.is_file():
        known = sibling_ids(folder)
        if not known:
            raise FileNotFoundError(f"{folder}: not a sibling pool folder (no siblings/*.yaml)")
        raise ValueError(f"pool {folder} has no sibling {sibling_id!r}; members: {', '.join(known)}")
    return build(load_sibling(path), limits, code=name)
