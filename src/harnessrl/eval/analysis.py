"""Per-factor analysis of in-space results: marginals per level, pairwise level tables, and
success against Hamming distance to the nearest training configuration.

Every number is Pass@1 over the in-space episodes that have the level (or the pair of
levels, or the distance); episodes through harnesses outside the space are left out.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from harnessrl.space import HarnessConfig, HarnessSpace
from harnessrl.trajectory import Trajectory


def _in_space(trajectories: Iterable[Trajectory], space: HarnessSpace) -> list[tuple[HarnessConfig, bool]]:
    out = []
    for t in trajectories:
        if t.out_of_space:
            continue
        try:
            config = space.parse(t.config)
        except ValueError:
            continue
        out.append((config, bool(t.passed)))
    return out


def _cell(values: Sequence[bool]) -> dict[str, Any]:
    return {"pass_at_1": (sum(values) / len(values)) if values else None, "episodes": len(values)}


def factor_marginals(trajectories: Iterable[Trajectory], space: HarnessSpace) -> dict[str, dict[str, Any]]:
    """Returns {factor letter: {level: {"pass_at_1", "episodes"}}} over in-space episodes."""
    cells: dict[tuple[str, int], list[bool]] = defaultdict(list)
    for config, passed in _in_space(trajectories, space):
        for letter, level in zip(config.letters, config.levels, strict=True):
            cells[(letter, level)].append(passed)
    return {
        f.letter: {str(level): _cell(cells[(f.letter, level)]) for level in range(f.n_levels)}
        for f in space.factors
    }


def pairwise_interactions(trajectories: Iterable[Trajectory], space: HarnessSpace) -> dict[str, dict[str, Any]]:
    """Returns {"A-B": {"a,b": {"pass_at_1", "episodes"}}} for every pair of factors, with the
    interaction of each cell: its Pass@1 minus what the two marginals predict additively
    (cell - marginal(A=a) - marginal(B=b) + overall); None where a cell is empty."""
    data = _in_space(trajectories, space)
    overall = (sum(p for _, p in data) / len(data)) if data else None
    singles: dict[tuple[int, int], list[bool]] = defaultdict(list)
    for config, passed in data:
        for i, level in enumerate(config.levels):
            singles[(i, level)].append(passed)
    out: dict[str, dict[str, Any]] = {}
    for (i, a), (j, b) in itertools.combinations(enumerate(space.factors), 2):
        cells: dict[tuple[int, int], list[bool]] = defaultdict(list)
        for config, passed in data:
            cells[(config.levels[i], config.levels[j])].append(passed)
        table: dict[str, Any] = {}
        for la in range(a.n_levels):
            for lb in range(b.n_levels):
                cell = _cell(cells[(la, lb)])
                ma, mb = _cell(singles[(i, la)])["pass_at_1"], _cell(singles[(j, lb)])["pass_at_1"]
                parts = (cell["pass_at_1"], ma, mb, overall)
                cell["interaction"] = None if any(p is None for p in parts) else (
                    cell["pass_at_1"] - ma - mb + overall  # type: ignore[operator]
                )
                table[f"{la},{lb}"] = cell
        out[f"{a.letter}-{b.letter}"] = table
    return out


def distance_curve(
    trajectories: Iterable[Trajectory], space: HarnessSpace, training: Sequence[HarnessConfig]
) -> dict[str, dict[str, Any]]:
    """Returns {distance: {"pass_at_1", "episodes", "configs"}} where distance is the Hamming
    distance of an episode's configuration to the nearest training configuration (0 = trained on)."""
    if not training:
        return {}
    cells: dict[int, list[bool]] = defaultdict(list)
    configs: dict[int, set[str]] = defaultdict(set)
    for config, passed in _in_space(trajectories, space):
        d = min(config.hamming(t) for t in training)
        cells[d].append(passed)
        configs[d].add(config.code)
    return {str(d): {**_cell(cells[d]), "configs": len(configs[d])} for d in sorted(cells)}


def factor_analysis(
    trajectories: Sequence[Trajectory], space: HarnessSpace, training: Sequence[HarnessConfig]
) -> dict[str, Any]:
    """Returns marginals, pairwise interactions and the distance curve in one dict."""
    return {
        "marginals": factor_marginals(trajectories, space),
        "interactions": pairwise_interactions(trajectories, space),
        "distance": distance_curve(trajectories, space, training),
    }
