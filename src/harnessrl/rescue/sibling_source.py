"""Where a group harness's siblings come from, parsed once: `SiblingSource` from a spec
(``TrainConfig.siblings``, an experiment arm's ``siblings``): ``space`` (its Hamming-1
neighbours in the harness space), ``space:R`` (distance <= R), ``design`` (the run's other
training configurations, e.g. the other rows of the OA(18): 3 or more factors away, where a
warm-started model's all-fail groups were seen to pass), ``pool:DIR`` (the members of a sibling
pool built on it, as ``DIR#ID``), or several joined by ``+``. Config validation, training,
evaluation and the experiment files all read the same parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harnessrl.rescue.pool import Pool


@dataclass(frozen=True)
class SiblingSource:
    """A parsed sibling spec: the space's neighbours up to ``radius`` (0: none), whether the
    run's other training configurations count (``design``), and the pool folders whose members
    count as siblings of their H0."""

    radius: int = 0
    pools: tuple[str, ...] = field(default_factory=tuple)
    design: bool = False

    @classmethod
    def parse(cls, spec: str) -> SiblingSource:
        """Returns the source of ``spec``; a part that is not ``space``, ``space:R`` (R >= 1),
        ``design`` or ``pool:DIR`` is a ValueError naming it."""
        radius, pools, design = 0, [], False
        for part in spec.split("+"):
            kind, _, value = part.partition(":")
            if kind == "space" and (not value or (value.isdigit() and int(value) >= 1)):
                radius = max(radius, int(value) if value else 1)
            elif kind == "pool" and value:
                pools.append(value)
            elif part == "design":
                design = True
            else:
                raise ValueError(f"siblings: {part!r} is not 'space', 'space:R' (R >= 1), 'design' or 'pool:DIR'; "
                                 f"join several with '+', e.g. 'space+pool:pools/h0'")
        return cls(radius, tuple(pools), design)

    def load_pools(self) -> list[Pool]:
        from harnessrl.rescue.pool import Pool

        return [Pool.load(folder) for folder in self.pools]

    def siblings_of(self, h0: str, pools: Sequence[Pool] = (), design: Sequence[str] = ()) -> list[str]:
        """Returns the sibling names of group harness ``h0``: its neighbours in the space (by
        distance), then (with ``design``) the configurations in ``design`` (the run's training
        configurations) not already named, then the members (``DIR#ID``) of every pool in
        ``pools`` built on it."""
        names = space_neighbours(h0, self.radius)
        if self.design:
            names += [code for code in design if code != h0 and code not in names]
        return names + [name for pool in pools for name in pool_siblings(pool, h0)]


def space_neighbours(h0: str, radius: int) -> list[str]:
    """Returns the codes of ``h0``'s neighbours in the default space up to ``radius`` (0: none)."""
    if not radius:
        return []
    from harnessrl.harness.registry import default_space

    space = default_space()
    return [c.code for c in space.neighbours(space.parse(h0), radius)]


def pool_siblings(pool: Pool, h0: str | None = None) -> list[str]:
    """Returns the members of ``pool`` other than its H0 as ``DIR#ID`` names (none when ``h0``
    is given and the pool is built on another harness)."""
    from harnessrl.harness.siblings.patch import BASE_ID

    if h0 is not None and pool.base != h0:
        return []
    return [pool.member_name(i) for i in pool.ids if i != BASE_ID]
