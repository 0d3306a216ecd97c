"""Parent selection: up to B children whose validation sets jointly cover the most tasks,
P = argmax_{|P| <= B} |U_{H in P} V(H)| (Harness-S, Algorithm 1).

Exact by enumeration while the number of subsets is small (``EXACT_LIMIT``), else greedy
(each step takes the child adding the most uncovered tasks, which reaches at least 1 - 1/e
of the optimum). Ties go to fewer regressions, then to the earlier child.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

EXACT_LIMIT = 5000  # subsets enumerated at most before falling back to greedy


def coverage(chosen: Sequence[str], covers: Mapping[str, set[str]]) -> int:
    """Returns how many tasks the chosen children cover together."""
    return len(set().union(*(covers[c] for c in chosen))) if chosen else 0


def greedy_cover(covers: Mapping[str, set[str]], budget: int, penalty: Mapping[str, int] | None = None) -> list[str]:
    """Returns up to ``budget`` children picked greedily by added coverage; stops when none adds any."""
    penalty = penalty or {}
    order = list(covers)
    chosen: list[str] = []
    covered: set[str] = set()
    while len(chosen) < budget:
        best = max((c for c in order if c not in chosen),
                   key=lambda c: (len(covers[c] - covered), -penalty.get(c, 0), -order.index(c)), default=None)
        if best is None or not covers[best] - covered:
            break
        chosen.append(best)
        covered |= covers[best]
    return chosen


def exact_cover(covers: Mapping[str, set[str]], budget: int, penalty: Mapping[str, int] | None = None) -> list[str]:
    """Returns the smallest subset of at most ``budget`` children with the largest coverage
    (fewest regressions, then earliest, among equals)."""
    penalty = penalty or {}
    names = list(covers)
    best_key: tuple | None = None
    best: tuple[int, ...] = ()
    for size in range(0, min(budget, len(names)) + 1):
        for combo in itertools.combinations(range(len(names)), size):
            chosen = [names[i] for i in combo]
            # more coverage, then fewer children, fewer regressions, earlier children
            key = (coverage(chosen, covers), -size, -sum(penalty.get(c, 0) for c in chosen), tuple(-i for i in combo))
            if best_key is None or key > best_key:
                best_key, best = key, combo
    return [names[i] for i in best]


def select_parents(covers: Mapping[str, set[str]], budget: int, penalty: Mapping[str, int] | None = None) -> list[str]:
    """Returns the parents of the next round: exact when small enough, else greedy."""
    subsets = sum(math.comb(len(covers), k) for k in range(min(budget, len(covers)) + 1))
    if subsets <= EXACT_LIMIT:
        return exact_cover(covers, budget, penalty)
    return greedy_cover(covers, budget, penalty)
