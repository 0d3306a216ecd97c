"""The sibling pool: a folder holding H0 and its siblings, their lineage and validation records.

Layout (``format: 1``)::

    DIR/pool.yaml              the index: base, source, frozen, and per member its id, parent,
                               round, root causes and content hash
    DIR/siblings/<id>.yaml     one sibling file per member (``harness.siblings.patch``)
    DIR/validation/<id>.json   what a member fixed and broke against its parent and H0

A pool is written while it is built (``from_space``, ``from_design``, evolution) and frozen
at the end; a frozen pool refuses new members. ``Pool.load(DIR)`` reads it back; members
iterate as ``(sibling id, Harness)``, and everywhere a harness set is accepted ``pool:DIR``
means every member and ``DIR#ID`` one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harnessrl.design import Design, make_design
from harnessrl.harness.harness import SIBLING_SEPARATOR, Harness, HarnessLimits
from harnessrl.harness.registry import default_space
from harnessrl.harness.siblings import (
    BASE_ID,
    Patch,
    PatchError,
    SetLevel,
    Sibling,
    build,
    load_sibling,
    save_sibling,
    sibling_file,
)
from harnessrl.harness.siblings.patch import parse_yaml
from harnessrl.space import HarnessConfig

INDEX_FILE = "pool.yaml"
VALIDATION_FOLDER = "validation"
POOL_FORMAT = 1
POOL_PREFIX = "pool:"


@dataclass
class ValidationRecord:
    """One member's validation: the tasks it ran, which it passed, and the differences to its
    parent and to H0 (fixed: they failed, it passed; broken: they passed, it failed)."""

    sibling: str
    parent: str | None
    tasks: list[str]
    passed: dict[str, bool]
    parent_passed: dict[str, bool] = field(default_factory=dict)
    h0_passed: dict[str, bool] = field(default_factory=dict)
    targets: list[str] = field(default_factory=list)  # the parent's failures it was made to fix
    valid: bool = True
    reason: str = ""

    def _diff(self, reference: dict[str, bool], fixed: bool) -> list[str]:
        return [t for t in self.tasks if t in reference and self.passed.get(t, False) == fixed and reference[t] != fixed]

    @property
    def solved(self) -> list[str]:
        return [t for t in self.tasks if self.passed.get(t)]

    @property
    def fixed_vs_parent(self) -> list[str]:
        return self._diff(self.parent_passed, True)

    @property
    def broken_vs_parent(self) -> list[str]:
        return self._diff(self.parent_passed, False)

    @property
    def fixed_vs_h0(self) -> list[str]:
        return self._diff(self.h0_passed, True)

    @property
    def broken_vs_h0(self) -> list[str]:
        return self._diff(self.h0_passed, False)

    @property
    def target_fixed(self) -> list[str]:
        return [t for t in self.targets if self.passed.get(t)]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(solved=self.solved, fixed_vs_parent=self.fixed_vs_parent, broken_vs_parent=self.broken_vs_parent,
                   fixed_vs_h0=self.fixed_vs_h0, broken_vs_h0=self.broken_vs_h0, target_fixed=self.target_fixed)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ValidationRecord:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


class Pool:
    """H0 and its siblings in a folder. ``members`` are in the order they joined (H0 first)."""

    def __init__(self, folder: str | Path, base: str, members: Sequence[Sibling] = (), source: str = "",
                 frozen: bool = False, meta: dict[str, Any] | None = None) -> None:
        self.folder = Path(folder)
        self.base, self.source, self.frozen = base, source, frozen
        self.members: list[Sibling] = list(members)
        self.meta = dict(meta or {})

    def __repr__(self) -> str:
        return f"Pool({str(self.folder)!r}, base={self.base!r}, members={len(self.members)})"

    def __len__(self) -> int:
        return len(self.members)

    # -- building ----------------------------------------------------------------------
    @classmethod
    def create(cls, folder: str | Path, base: str, source: str, meta: dict[str, Any] | None = None) -> Pool:
        """Starts a pool in ``folder`` with H0 (``base`` with an empty patch) as its first member;
        refuses a folder that already holds a pool."""
        folder = Path(folder)
        if (folder / INDEX_FILE).exists():
            raise FileExistsError(f"{folder}: already holds a pool ({INDEX_FILE}); choose a new --out folder")
        Harness.named(base)  # a bad base fails here, naming the fix
        pool = cls(folder, base, source=source, meta=meta)
        pool.add(Sibling(BASE_ID, base))
        return pool

    def add(self, sibling: Sibling) -> None:
        """Adds a member (its file and the index are written at once)."""
        if self.frozen:
            raise ValueError(f"pool {self.folder} is frozen; siblings are added only while it is built")
        if sibling.id in self.ids:
            raise ValueError(f"pool {self.folder} already has a member {sibling.id!r}")
        save_sibling(sibling, sibling_file(self.folder, sibling.id))
        self.members.append(sibling)
        self.save()

    def freeze(self) -> None:
        self.frozen = True
        self.save()

    def save(self) -> Path:
        """Writes the index; returns its path."""
        self.folder.mkdir(parents=True, exist_ok=True)
        index = {
            "format": POOL_FORMAT, "base": self.base, "source": self.source, "frozen": self.frozen, "meta": self.meta,
            "members": [
                {"id": s.id, "parent": s.parent, "round": s.round, "root_causes": list(s.root_causes),
                 "hash": s.content_hash, "edits": [e.kind for e in s.patch.edits]}
                for s in self.members
            ],
        }
        path = self.folder / INDEX_FILE
        path.write_text(yaml.safe_dump(index, sort_keys=False, allow_unicode=True, width=100), encoding="utf-8")
        return path

    # -- reading -----------------------------------------------------------------------
    @classmethod
    def load(cls, folder: str | Path) -> Pool:
        """Returns the pool in ``folder``; raises naming the file and the fix when the index or
        a sibling file is malformed, or when a file no longer matches the hash in the index."""
        folder = Path(folder)
        path = folder / INDEX_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: not a sibling pool (no {INDEX_FILE}); build one with "
                                    "`harnessrl pool from-space` or `harnessrl pool evolve`")
        index = parse_yaml(path.read_text(encoding="utf-8"), str(path))
        if not isinstance(index, dict) or index.get("format") != POOL_FORMAT or not isinstance(index.get("members"), list):
            raise PatchError(f"{path}: not a format-{POOL_FORMAT} pool index (format, base, members)")
        members = []
        for entry in index["members"]:
            sibling = load_sibling(sibling_file(folder, str(entry.get("id"))))
            if entry.get("hash") and entry["hash"] != sibling.content_hash:
                raise PatchError(
                    f"{sibling_file(folder, sibling.id)}: content hash {sibling.content_hash} differs from "
                    f"{entry['hash']} in {path}: the file was edited after the pool was built. Fix: restore it, "
                    "or build a new pool")
            members.append(sibling)
        return cls(folder, str(index.get("base")), members, str(index.get("source", "")), bool(index.get("frozen")),
                   index.get("meta") or {})

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.members]

    @property
    def h0(self) -> Sibling:
        return self.sibling(BASE_ID)

    def sibling(self, sibling_id: str) -> Sibling:
        for sibling in self.members:
            if sibling.id == sibling_id:
                return sibling
        raise KeyError(f"pool {self.folder} has no member {sibling_id!r}; members: {', '.join(self.ids)}")

    def member_name(self, sibling_id: str) -> str:
        """Returns the harness name of a member, ``DIR#ID``."""
        return f"{self.folder}{SIBLING_SEPARATOR}{sibling_id}"

    def harness(self, sibling_id: str, limits: HarnessLimits | None = None) -> Harness:
        """Returns the harness of one member, named ``DIR#ID``."""
        return build(self.sibling(sibling_id), limits, code=self.member_name(sibling_id))

    def harnesses(self, limits: HarnessLimits | None = None) -> Iterator[tuple[str, Harness]]:
        """Yields ``(sibling id, Harness)`` for every member, H0 first."""
        for sibling in self.members:
            yield sibling.id, self.harness(sibling.id, limits)

    # -- validation records ------------------------------------------------------------
    def validation_path(self, sibling_id: str) -> Path:
        return self.folder / VALIDATION_FOLDER / f"{sibling_id}.json"

    def save_validation(self, record: ValidationRecord) -> Path:
        path = self.validation_path(record.sibling)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record.to_dict(), indent=2), encoding="utf-8")
        return path

    def validation(self, sibling_id: str) -> ValidationRecord | None:
        """Returns a member's validation record, or None when it has none (H0, space siblings)."""
        path = self.validation_path(sibling_id)
        if not path.is_file():
            return None
        return ValidationRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))


def neighbour_sibling(base: HarnessConfig, config: HarnessConfig, round_: int = 0) -> Sibling:
    """Returns ``config`` as a sibling of ``base``: one ``set_level`` per differing factor,
    with the configuration's code as its id."""
    edits = tuple(
        SetLevel(factor=letter, level=level, rationale=f"{letter}{base[letter]} -> {letter}{level}")
        for letter, level in zip(config.letters, config.levels, strict=True) if base[letter] != level
    )
    return Sibling(config.code, base.code, Patch(edits, f"the configuration {config.code} of the space"), BASE_ID, round_)


def space_neighbours(base: str, radius: int = 1) -> list[Sibling]:
    """Returns every configuration at Hamming distance 1..radius of ``base`` as a sibling
    (radius 1 in the default space: 5 factors x 2 other levels = 10)."""
    space = default_space()
    center = space.parse(base)
    return [neighbour_sibling(center, c) for c in space.neighbours(center, radius)]


def design_siblings(base: str, design: Design) -> list[Sibling]:
    """Returns the rows of ``design`` other than ``base`` as siblings of ``base``."""
    center = design.space.parse(base)
    return [neighbour_sibling(center, c) for c in design.configs if c != center]


def from_space(folder: str | Path, base: str, radius: int = 1, design: str | None = None) -> Pool:
    """Builds and freezes a pool of H0 = ``base`` and its space neighbours within ``radius``,
    or (with ``design``, a design kind) the rows of that design."""
    if not _in_space(base):
        raise ValueError(f"from-space pools need an in-space base code such as S0-T1-O1-C0-W0, got {base!r}")
    code = default_space().parse(base).code
    if design:
        siblings = design_siblings(code, make_design(default_space(), design, base=code))
        source = f"from-space design {design}"
    else:
        siblings = space_neighbours(code, radius)
        source = f"from-space radius {radius}"
    pool = Pool.create(folder, code, source)
    for sibling in siblings:
        pool.add(sibling)
    pool.freeze()
    return pool


def _in_space(code: str) -> bool:
    try:
        default_space().parse(code)
    except ValueError:
        return False
    return True


def resolve_pool_spec(spec: str) -> list[str]:
    """Returns the harness names of ``pool:DIR`` (every member) or ``DIR#ID`` (one member,
    checked to exist)."""
    if spec.startswith(POOL_PREFIX):
        pool = Pool.load(spec[len(POOL_PREFIX):])
        return [pool.member_name(i) for i in pool.ids]
    folder, _, sibling_id = spec.rpartition(SIBLING_SEPARATOR)
    pool = Pool.load(folder)
    if sibling_id not in pool.ids:
        raise ValueError(f"pool {folder} has no member {sibling_id!r}; members: {', '.join(pool.ids)}")
    return [pool.member_name(sibling_id)]
