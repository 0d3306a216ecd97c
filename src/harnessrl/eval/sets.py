"""Evaluation sets: the one place a set spec (``held-out``, ``out-of-space``, codes, ...) becomes targets.

A target is one harness to evaluate through, with the group it is reported under:
``train`` (a configuration of the training design), ``in_space`` (any other configuration
of the 243), ``out_of_space`` (a built-in harness outside the space), ``external`` (an
external agent program, ``ext:<name>``, one of ``harnessrl.external``'s) or ``sibling`` (a member of a sibling pool: ``pool:DIR`` or ``DIR#ID``).
"""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl import external
from harnessrl.design import Design, orthogonal
from harnessrl.external import EXTERNAL_PREFIX
from harnessrl.harness.harness import OUT_OF_SPACE_PRESETS, SIBLING_SEPARATOR, out_of_space_names
from harnessrl.harness.registry import default_space
from harnessrl.rescue.pool import POOL_PREFIX, resolve_pool_spec

EVAL_SETS: tuple[str, ...] = ("train", "design", "held-out", "out-of-space", "space", "all")
GROUPS: tuple[str, ...] = ("train", "in_space", "out_of_space", "external", "sibling")


@dataclass(frozen=True)
class EvalTarget:
    """One harness to evaluate through: its name (a code, an out-of-space name or ``ext:<name>``)
    and the group it is reported under (one of ``GROUPS``)."""

    name: str
    group: str


def external_agent_names() -> list[str]:
    """Returns the external agent programs harnessrl knows (``harnessrl.external``)."""
    return external.external_agent_names()


def resolve_eval_set(spec: str, design: Design, held_out: int = 18, seed: int = 0) -> list[EvalTarget]:
    """Returns the targets of a comma-separated set spec, duplicates removed, in order.

    Parts: ``train`` / ``design`` (the design's configurations), ``held-out`` (``held_out``
    configurations outside the design, seeded), ``out-of-space`` (the built-in out-of-space
    harnesses), ``space`` (all configurations of the space), ``all`` (train + held-out +
    out-of-space), a configuration code, an out-of-space name, ``ext:<name>``, ``pool:DIR``
    (every member of a sibling pool) or ``DIR#ID`` (one member).
    Raises ``ValueError`` with the fix for anything else.
    """
    train_codes = set(design.codes)

    def in_space(code: str) -> EvalTarget:
        return EvalTarget(code, "train" if code in train_codes else "in_space")

    targets: list[EvalTarget] = []
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    for part in parts:
        if part in ("train", "design", "all"):
            targets += [EvalTarget(code, "train") for code in design.codes]
        if part in ("held-out", "all"):
            targets += [EvalTarget(c.code, "in_space") for c in design.held_out(held_out, seed).configs]
        if part in ("out-of-space", "all"):
            targets += [EvalTarget(name, "out_of_space") for name in out_of_space_names()]
        if part in EVAL_SETS:
            if part == "space":
                targets += [in_space(c.code) for c in design.space.all_configs]
            continue
        if part in OUT_OF_SPACE_PRESETS:
            targets.append(EvalTarget(part, "out_of_space"))
        elif part.startswith(POOL_PREFIX) or SIBLING_SEPARATOR in part:
            targets += [EvalTarget(name, "sibling") for name in resolve_pool_spec(part)]
        elif part.startswith(EXTERNAL_PREFIX):
            name = part[len(EXTERNAL_PREFIX):]
            known = external_agent_names()
            if name not in known:
                raise ValueError(
                    f"unknown external agent {part!r}; known: "
                    f"{', '.join(EXTERNAL_PREFIX + k for k in known) or '(none installed)'}"
                )
            targets.append(EvalTarget(part, "external"))
        else:
            try:
                code = design.space.parse(part).code
            except ValueError as exc:
                raise ValueError(
                    f"evaluation set part {part!r} is neither a set ({', '.join(EVAL_SETS)}), an "
                    f"out-of-space harness ({', '.join(out_of_space_names())}), {EXTERNAL_PREFIX}<name>, "
                    f"{POOL_PREFIX}DIR, DIR{SIBLING_SEPARATOR}ID, nor a configuration code: {exc}"
                ) from None
            targets.append(in_space(code))
    if not targets:
        raise ValueError(f"no harnesses in evaluation set {spec!r}; use codes or one of {', '.join(EVAL_SETS)}")
    seen: dict[str, EvalTarget] = {}
    for target in targets:
        seen.setdefault(target.name, target)
    return list(seen.values())


HARNESS_SETS: tuple[str, ...] = ("design", "held-out", "out-of-space", "all", "space")


def resolve_harness_set(spec: str, seed: int = 0, held_out: int = 18) -> list[str]:
    """Returns harness names for a set spec relative to the orthogonal design: ``design``
    (the 18 training configurations), ``held-out`` (the in-space test set), ``out-of-space``,
    ``all`` (design + held-out + out-of-space), ``space`` (all 243), or comma-separated codes
    and out-of-space names (see ``resolve_eval_set``)."""
    design = orthogonal(default_space())
    return [target.name for target in resolve_eval_set(spec, design, held_out=held_out, seed=seed)]
