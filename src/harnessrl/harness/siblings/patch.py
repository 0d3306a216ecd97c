"""Patches and siblings as data: a ``Patch`` is a validated list of edits; a ``Sibling`` is a
base harness plus a patch, with its lineage (parent, round). Both round-trip through YAML; a
sibling has a content hash over its base and the behaviour-changing fields of its edits.

A sibling file (one per sibling in a pool folder, ``siblings/<id>.yaml``)::

    id: r1-02
    base: S0-T1-O1-C0-W0
    parent: H0
    round: 1
    patch:
      rationale: the policy never submits after finishing
      edits:
        - kind: hook
          at: after_step
          text: If the task is done, submit now.
          rationale: remind to submit
          root_causes: [never_submitted]
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harnessrl.harness.siblings.edits import Edit, EditFieldError, PatchError, edit_class

SIBLINGS_FOLDER = "siblings"  # a pool folder's sibling files: siblings/<id>.yaml
SIBLING_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
BASE_ID = "H0"  # the id of the base harness itself in a pool (an empty patch)
_SIBLING_FIELDS = ("id", "base", "parent", "round", "patch")


@dataclass(frozen=True)
class Patch:
    """A validated list of edits and the reason for them."""

    edits: tuple[Edit, ...] = ()
    rationale: str = ""

    @property
    def root_causes(self) -> tuple[str, ...]:
        """Returns the root causes the edits target, each once, in order."""
        return tuple(dict.fromkeys(cause for edit in self.edits for cause in edit.root_causes))

    def extended(self, edits: Iterable[Edit], rationale: str = "") -> Patch:
        """Returns this patch with ``edits`` appended (a child's patch from its parent's)."""
        reason = "; ".join(r for r in (self.rationale, rationale) if r)
        return Patch((*self.edits, *edits), reason)

    def to_dict(self) -> dict[str, Any]:
        return {"rationale": self.rationale, "edits": [edit.to_dict() for edit in self.edits]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "patch") -> Patch:
        """Returns the patch of ``data``; raises ``PatchError`` naming the source, the edit,
        the field and the fix."""
        if not isinstance(data, dict):
            raise PatchError(f"{source}: a patch must be a mapping with `edits:` (a list), got {type(data).__name__}")
        unknown = set(data) - {"edits", "rationale"}
        if unknown:
            raise PatchError(f"{source}: unknown patch field(s) {', '.join(sorted(unknown))}. Fix: a patch has only "
                             "`rationale` and `edits`")
        items = data.get("edits") or []
        if not isinstance(items, list):
            raise PatchError(f"{source}: `edits` must be a list of edits. Fix: write `edits:` then `- kind: ...` items")
        edits = []
        for index, item in enumerate(items, start=1):
            kind = item.get("kind") if isinstance(item, dict) else None
            where = f"{source}: edit {index}" + (f" ({kind})" if isinstance(kind, str) else "")
            if not isinstance(item, dict):
                raise PatchError(f"{where}: an edit must be a mapping with `kind:`, got {item!r:.80}. Fix: write `- kind: <kind>`")
            try:
                edits.append(edit_class(kind).from_dict(item))
            except EditFieldError as exc:
                raise PatchError(f"{where}: {exc}") from None
        rationale = data.get("rationale") or ""
        if not isinstance(rationale, str):
            raise PatchError(f"{source}: `rationale` must be text. Fix: quote it")
        return cls(tuple(edits), rationale)


@dataclass(frozen=True)
class Sibling:
    """A base harness (an in-space code or an out-of-space name) plus a patch; ``parent`` is
    the id it was derived from and ``round`` the evolution round that made it (0: H0 and
    siblings taken from the space)."""

    id: str
    base: str
    patch: Patch = field(default_factory=Patch)
    parent: str | None = None
    round: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not SIBLING_ID.fullmatch(self.id):
            raise PatchError(f"sibling id {self.id!r}: use letters, digits, '.', '_' or '-' (at most 64, no spaces)")

    @property
    def root_causes(self) -> tuple[str, ...]:
        return self.patch.root_causes

    @property
    def content_hash(self) -> str:
        """Returns 16 hex digits of SHA-256 over the base and the edits' behaviour-changing
        fields: equal hashes mean equal harnesses (ids, rationale and lineage are not hashed)."""
        content = {"base": self.base, "edits": [edit.content() for edit in self.patch.edits]}
        blob = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    def identity(self) -> dict[str, str]:
        """Returns what every trajectory under this sibling records: id, hash and base."""
        return {"id": self.id, "hash": self.content_hash, "base": self.base}

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "base": self.base, "parent": self.parent, "round": self.round,
                "patch": self.patch.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, source: str = "sibling") -> Sibling:
        """Returns the sibling of ``data``; raises ``PatchError`` naming the source and fix."""
        if not isinstance(data, dict):
            raise PatchError(f"{source}: a sibling must be a mapping with id, base and patch")
        unknown = set(data) - set(_SIBLING_FIELDS)
        if unknown:
            raise PatchError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}. Fix: a sibling has "
                             f"{', '.join(_SIBLING_FIELDS)}")
        for name in ("id", "base"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise PatchError(f"{source}: field '{name}' is missing or not text. Fix: add `{name}: <text>`")
        round_ = data.get("round", 0)
        if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
            raise PatchError(f"{source}: field 'round' must be a whole number >= 0, got {round_!r}")
        parent = data.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise PatchError(f"{source}: field 'parent' must be a sibling id or null")
        return cls(data["id"], data["base"], Patch.from_dict(data.get("patch") or {}, source), parent, round_)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=100)

    @classmethod
    def from_yaml(cls, text: str, source: str = "sibling") -> Sibling:
        return cls.from_dict(parse_yaml(text, source), source)


def parse_yaml(text: str, source: str) -> Any:
    """Returns the YAML document in ``text``; a syntax error names the source and the line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PatchError(f"{source}:{where}: not valid YAML ({problem}). Fix: check the indentation and quoting there") from None


def load_sibling(path: str | Path) -> Sibling:
    """Returns the sibling in a YAML file; errors name the file, the edit, the field and the fix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such sibling file")
    return Sibling.from_yaml(path.read_text(encoding="utf-8"), source=str(path))


def save_sibling(sibling: Sibling, path: str | Path) -> Path:
    """Writes the sibling as YAML; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sibling.to_yaml(), encoding="utf-8")
    return path


def sibling_file(pool_dir: str | Path, sibling_id: str) -> Path:
    """Returns where a pool folder keeps the file of ``sibling_id``."""
    return Path(pool_dir) / SIBLINGS_FOLDER / f"{sibling_id}.yaml"


def sibling_ids(pool_dir: str | Path) -> list[str]:
    """Returns the ids of the sibling files in a pool folder, sorted."""
    folder = Path(pool_dir) / SIBLINGS_FOLDER
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def with_edits(base: str, edits: Sequence[Edit], sibling_id: str, rationale: str = "", parent: str | None = None,
               round_: int = 0) -> Sibling:
    """Returns a sibling of ``base`` with ``edits`` (a convenience for code that makes siblings)."""
    return Sibling(sibling_id, base, Patch(tuple(edits), rationale), parent, round_)
