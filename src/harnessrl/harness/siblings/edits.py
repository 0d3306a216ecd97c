"""The edit contract of sibling harnesses: the ``Edit`` base class, the registry of edit kinds,
and the field checks that turn a malformed edit into an error naming the field and the fix.

An edit kind is a small frozen dataclass with a ``kind`` name, its own fields, an optional
``check`` of their values, and ``apply``, which records what the edit adds on a
``SiblingParts`` (below; ``harness/siblings/build.py`` turns the parts into wrapped components).
Users add a kind the way they add a factor level: subclass ``Edit`` and ``register_edit``.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args, get_origin, get_type_hints

if TYPE_CHECKING:
    from harnessrl.harness.harness import Harness


class PatchError(ValueError):
    """A patch that cannot be used. The message names where (file, edit), the field, what is
    wrong and how to fix it."""


@dataclass
class SiblingParts:
    """What a sibling's edits add to its base, gathered before the components are wrapped
    (``harness/siblings/build.py``). Each edit kind appends itself where it belongs; a kind a
    user adds can act through ``finishers`` (called with the built harness)."""

    levels: dict[str, int] = field(default_factory=dict)
    addenda: list[Edit] = field(default_factory=list)  # SystemAddendum
    skills: list[Edit] = field(default_factory=list)  # Skill
    tool_hints: list[Edit] = field(default_factory=list)  # ToolHint
    guards: list[Edit] = field(default_factory=list)  # GuardRule
    recoveries: list[Edit] = field(default_factory=list)  # RecoveryRule
    hooks: list[Edit] = field(default_factory=list)  # Hook
    limits: dict[str, int] = field(default_factory=dict)
    finishers: list[Callable[[Harness], None]] = field(default_factory=list)


class EditFieldError(Exception):
    """Raised by field checks; ``Patch.from_dict`` adds the file and the edit position."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(f"field '{field}': {problem}. Fix: {fix}")
        self.field, self.problem, self.fix = field, problem, fix


@dataclass(frozen=True, kw_only=True)
class Edit:
    """One typed change to a base harness, with a one-line rationale and the root causes
    (diagnosis labels such as ``never_submitted``) it targets."""

    kind: ClassVar[str] = ""
    description: ClassVar[str] = ""
    rationale: str = ""
    root_causes: tuple[str, ...] = ()

    def check(self) -> None:
        """Raises ``EditFieldError`` for a value the field types allow but the kind does not."""

    def apply(self, parts: SiblingParts) -> None:
        """Records what this edit adds to the sibling being built."""
        raise NotImplementedError

    def content(self) -> dict[str, Any]:
        """Returns the fields that change behaviour (no rationale, no root causes): what the
        content hash covers."""
        out = self.to_dict()
        out.pop("rationale", None)
        out.pop("root_causes", None)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Returns ``{"kind": ..., field: value}`` without fields left at their defaults."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            default = f.default if f.default is not MISSING else (
                f.default_factory() if f.default_factory is not MISSING else MISSING)
            if value == default and f.name not in _required(type(self)):
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Edit:
        """Returns the edit of ``data`` (``kind`` already resolved to ``cls``); raises
        ``EditFieldError`` naming the first bad field."""
        hints = get_type_hints(cls)
        known = {f.name for f in fields(cls)}
        for name in data:
            if name == "kind":
                continue
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"the fields of {cls.kind} are {', '.join(sorted(known))}"
                raise EditFieldError(name, f"{cls.kind} has no such field", hint)
        for name in _required(cls):
            if name not in data:
                raise EditFieldError(name, "is required", f"add `{name}: <{_type_text(hints[name])}>`")
        values = {name: coerce(name, data[name], hints[name]) for name in data if name != "kind"}
        edit = cls(**values)
        edit.check()
        return edit


_EDIT_KINDS: dict[str, type[Edit]] = {}


def register_edit(cls: type[Edit]) -> type[Edit]:
    """Registers an edit kind by its ``kind`` name (usable as a decorator)."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__}: an edit kind needs a non-empty `kind` name")
    existing = _EDIT_KINDS.get(cls.kind)
    if existing is not None and existing is not cls:
        raise ValueError(f"edit kind {cls.kind!r} is already registered by {existing.__name__}")
    _EDIT_KINDS[cls.kind] = cls
    return cls


def edit_kinds() -> dict[str, type[Edit]]:
    """Returns the registered edit kinds by name (the built-in ones included)."""
    return dict(_EDIT_KINDS)


def edit_class(kind: Any) -> type[Edit]:
    """Returns the edit class of ``kind``; raises ``EditFieldError`` listing the known kinds."""
    known = edit_kinds()
    if not isinstance(kind, str) or kind not in known:
        close = difflib.get_close_matches(str(kind), sorted(known), n=1)
        fix = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(sorted(known))}"
        raise EditFieldError("kind", f"unknown edit kind {kind!r}", fix)
    return known[kind]


def _required(cls: type[Edit]) -> list[str]:
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def _type_text(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return " | ".join(str(a) for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in get_args(hint) if a is not type(None)) + " or null"
    if origin is tuple:
        return f"list of {_type_text(get_args(hint)[0])}"
    return getattr(hint, "__name__", str(hint))


def coerce(name: str, value: Any, hint: Any) -> Any:
    """Returns ``value`` as the field type ``hint`` (str, int, bool, float, Literal, tuple of
    str, optional); raises ``EditFieldError`` with the expected type otherwise."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return coerce(name, value, options[0])
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise EditFieldError(name, f"must be one of {', '.join(map(str, allowed))}, got {value!r}",
                                 f"set `{name}: {allowed[0]}` (or another of {', '.join(map(str, allowed))})")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise EditFieldError(name, f"must be a list of strings, got {value!r}"[:200], f"write `{name}: [\"...\"]`")
        return tuple(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise EditFieldError(name, f"must be true or false, got {value!r}", f"set `{name}: true` or `{name}: false`")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise EditFieldError(name, f"must be an integer, got {value!r}", f"set `{name}` to a whole number")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise EditFieldError(name, f"must be text, got {type(value).__name__}", f"quote the value of `{name}`")
        return value
    return value
