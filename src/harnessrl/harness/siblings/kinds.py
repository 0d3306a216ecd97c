"""The built-in edit kinds of sibling harnesses, one small class each.

``set_level`` swaps one factor's level (every Hamming-1 neighbour of a base is a sibling);
``system_addendum`` adds text to the system message; ``tool_hint`` adds usage notes for one
tool where the interface documents its tools; ``skill`` shows a named procedure in the first
user message; ``guard_rule`` blocks a proposed call (the reason is its observation) or lets
it run with a hint; ``recovery_rule`` adds a hint after a failed command; ``hook`` shows text
or read-only command output at the start, before the final submit, or after every step;
``limits`` sets turn, per-turn token or observation-length limits within the run's ceilings.
Nothing an edit says runs on the host: hook and check commands run in the episode's sandbox.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from harnessrl.harness.siblings.edits import Edit, EditFieldError, SiblingParts, register_edit

MAX_TEXT_CHARS = 2000  # longest injected text of one edit
MAX_LIMIT_TURNS = 100
# Programs a start hook or a pre-submit check may run: they read the workspace, never write it.
READ_ONLY_PROGRAMS = frozenset({
    "ls", "cat", "head", "tail", "wc", "find", "grep", "pwd", "tree", "stat", "file", "du",
    "sort", "uniq", "cut", "git", "sqlite3", "pytest", "python", "python3", "echo",
})
_WRITE_MARKERS = (">", "`", "$(", ";", " -delete", " -exec", " -fprint")


def read_only_problem(command: str) -> str | None:
    """Returns why ``command`` is not a read-only inspection, or None. It is a guard against
    edits that would change the workspace, not a security boundary (the sandbox is that)."""
    if not command.strip():
        return "the command is empty"
    for marker in _WRITE_MARKERS:
        if marker in f" {command} ":
            return f"it contains {marker.strip()!r}, which can write or chain arbitrary commands"
    for segment in re.split(r"\|\||&&|\|", command):
        try:
            words = shlex.split(segment)
        except ValueError as exc:
            return f"it does not parse as a shell command ({exc})"
        if not words:
            return "it has an empty pipeline segment"
        program = words[0]
        if program not in READ_ONLY_PROGRAMS:
            return f"{program!r} is not one of the read-only programs ({', '.join(sorted(READ_ONLY_PROGRAMS))})"
        if program in ("python", "python3") and words[1:3] != ["-m", "pytest"]:
            return "python may only run `python -m pytest`"
        if program == "sqlite3" and "-readonly" not in words:
            return "sqlite3 needs -readonly"
        if program == "git" and (len(words) < 2 or words[1] not in ("status", "diff", "log", "show")):
            return "git may only run status, diff, log or show"
    return None


def _text(name: str, value: str, required: bool = True) -> None:
    if required and not value.strip():
        raise EditFieldError(name, "is empty", f"write the text to show in `{name}`")
    if len(value) > MAX_TEXT_CHARS:
        raise EditFieldError(name, f"is {len(value)} characters long", f"shorten it to at most {MAX_TEXT_CHARS}")


def _regex(name: str, value: str | None) -> None:
    if value is None:
        return
    try:
        re.compile(value)
    except re.error as exc:
        raise EditFieldError(name, f"is not a valid regular expression ({exc})", "escape special characters with \\") from None


@register_edit
@dataclass(frozen=True, kw_only=True)
class SetLevel(Edit):
    """Swaps one factor of the base to another level (``factor: T``, ``level: 2``)."""

    kind = "set_level"
    description = "swap one factor's level"
    factor: str
    level: int

    def check(self) -> None:
        from harnessrl.harness.registry import default_space

        space = default_space()
        if self.factor not in space.letters:
            raise EditFieldError("factor", f"unknown factor {self.factor!r}", f"use one of {', '.join(space.letters)}")
        n = space.factor(self.factor).n_levels
        if not 0 <= self.level < n:
            raise EditFieldError("level", f"level {self.level} of {self.factor} is out of range", f"use 0..{n - 1}")

    def apply(self, parts: SiblingParts) -> None:
        parts.levels[self.factor] = self.level


@register_edit
@dataclass(frozen=True, kw_only=True)
class SystemAddendum(Edit):
    """Adds ``text`` to the system message, at the end or after the section titled ``section``."""

    kind = "system_addendum"
    description = "text added to the system message"
    text: str
    position: Literal["end", "after_section"] = "end"
    section: str = ""

    def check(self) -> None:
        _text("text", self.text)
        if self.position == "after_section" and not self.section.strip():
            raise EditFieldError("section", "is empty but position is after_section", "name the section title, e.g. `section: LIMITS`")

    def apply(self, parts: SiblingParts) -> None:
        parts.addenda.append(self)


@register_edit
@dataclass(frozen=True, kw_only=True)
class ToolHint(Edit):
    """Extra usage notes for one tool, shown where the interface documents its tools."""

    kind = "tool_hint"
    description = "usage notes for one tool"
    tool: str
    text: str

    def check(self) -> None:
        _text("tool", self.tool)
        _text("text", self.text)

    def apply(self, parts: SiblingParts) -> None:
        parts.tool_hints.append(self)


@register_edit
@dataclass(frozen=True, kw_only=True)
class Skill(Edit):
    """A named procedure (numbered steps) shown in the first user message."""

    kind = "skill"
    description = "a named procedure in the first user message"
    name: str
    steps: tuple[str, ...]

    def check(self) -> None:
        _text("name", self.name)
        if not self.steps:
            raise EditFieldError("steps", "is empty", "list at least one step")
        _text("steps", "\n".join(self.steps))

    def apply(self, parts: SiblingParts) -> None:
        parts.skills.append(self)


@register_edit
@dataclass(frozen=True, kw_only=True)
class GuardRule(Edit):
    """A condition on a proposed call and its effect. Every condition given must hold: the
    tool name, ``pattern`` (a regex searched in each text argument: the command, the path),
    ``repeats`` (this would be the N-th identical call in a row), ``before_change`` (a submit
    while no file tool changed a file and no command has run). ``block`` answers with
    ``message`` instead of running the call; ``hint`` runs it and shows ``message`` after."""

    kind = "guard_rule"
    description = "block a proposed call with a reason, or let it run with a hint"
    effect: Literal["block", "hint"]
    message: str
    tool: str | None = None
    pattern: str | None = None
    repeats: int | None = None
    before_change: bool = False

    def check(self) -> None:
        _text("message", self.message)
        _regex("pattern", self.pattern)
        if self.repeats is not None and self.repeats < 2:
            raise EditFieldError("repeats", f"must be at least 2, got {self.repeats}", "set `repeats: 2` or more")
        if self.tool is None and self.pattern is None and self.repeats is None and not self.before_change:
            raise EditFieldError(
                "tool", "the rule has no condition and would match every call",
                "give at least one of tool, pattern, repeats or before_change: true")

    def apply(self, parts: SiblingParts) -> None:
        parts.guards.append(self)


@register_edit
@dataclass(frozen=True, kw_only=True)
class RecoveryRule(Edit):
    """After a failed call (optionally: this exit code, this tool, ``pattern`` in its output),
    shows ``hint`` after the observation."""

    kind = "recovery_rule"
    description = "a hint after a failed command"
    hint: str
    exit_code: int | None = None
    pattern: str | None = None
    tool: str | None = None

    def check(self) -> None:
        _text("hint", self.hint)
        _regex("pattern", self.pattern)

    def apply(self, parts: SiblingParts) -> None:
        parts.recoveries.append(self)


@register_edit
@dataclass(frozen=True, kw_only=True)
class Hook(Edit):
    """Declarative effects at a fixed point: ``start`` (text and/or a read-only command's
    output before the first turn), ``before_submit`` (a checklist and/or a check command's
    output at the first submit, which then has to be repeated), ``after_step`` (text after
    every ``every``-th step)."""

    kind = "hook"
    description = "text or read-only command output at start, before the final submit, or after steps"
    at: Literal["start", "before_submit", "after_step"]
    text: str = ""
    command: str | None = None
    every: int = 1

    def check(self) -> None:
        _text("text", self.text, required=self.command is None)
        if self.command is not None:
            if self.at == "after_step":
                raise EditFieldError("command", "after_step hooks show text only", "remove `command` or use at: start / before_submit")
            problem = read_only_problem(self.command)
            if problem:
                raise EditFieldError("command", f"is not read-only: {problem}", "use an inspection such as `ls -la`")
        if self.every < 1:
            raise EditFieldError("every", f"must be at least 1, got {self.every}", "set `every: 1` (every step) or more")

    def apply(self, parts: SiblingParts) -> None:
        parts.hooks.append(self)


@register_edit
@dataclass(frozen=True, kw_only=True)
class Limits(Edit):
    """Turn, per-turn token and observation-length limits. The run's limits are ceilings:
    ``max_new_tokens`` never exceeds the run's, ``max_turns`` at most doubles it."""

    kind = "limits"
    description = "turn, per-turn token or observation-length limits within the run's ceilings"
    max_turns: int | None = None
    max_new_tokens: int | None = None
    output_chars: int | None = None

    def check(self) -> None:
        if self.max_turns is None and self.max_new_tokens is None and self.output_chars is None:
            raise EditFieldError("max_turns", "no limit is set", "set max_turns, max_new_tokens or output_chars")
        if self.max_turns is not None and not 1 <= self.max_turns <= MAX_LIMIT_TURNS:
            raise EditFieldError("max_turns", f"{self.max_turns} is out of range", f"use 1..{MAX_LIMIT_TURNS}")
        if self.max_new_tokens is not None and self.max_new_tokens < 16:
            raise EditFieldError("max_new_tokens", f"{self.max_new_tokens} is too small", "use at least 16")
        if self.output_chars is not None and not 200 <= self.output_chars <= 50_000:
            raise EditFieldError("output_chars", f"{self.output_chars} is out of range", "use 200..50000")

    def apply(self, parts: SiblingParts) -> None:
        for name in ("max_turns", "max_new_tokens", "output_chars"):
            value = getattr(self, name)
            if value is not None:
                parts.limits[name] = value
