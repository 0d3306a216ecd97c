"""Training designs over a harness space: orthogonal arrays, the paper's baselines, held-out splits.

Every design is verified when it is built (``verify_design``) by brute-force counting, never
by trusting a construction's bookkeeping; the report travels with the design.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from harnessrl.space import HarnessConfig, HarnessSpace

DESIGN_KINDS: tuple[str, ...] = ("orthogonal", "first-order", "random", "full", "single")


# --- verification ------------------------------------------------------------------------------


def is_orthogonal(array: np.ndarray, level_counts: Sequence[int], strength: int) -> bool:
    """Returns whether every ``strength``-subset of columns shows every level combination
    equally often (the definition of an orthogonal array of that strength)."""
    array = np.asarray(array)
    n_runs, n_cols = array.shape
    if strength <= 0:
        return True
    if strength > n_cols:
        return False
    for cols in itertools.combinations(range(n_cols), strength):
        cells = int(np.prod([level_counts[c] for c in cols]))
        if n_runs % cells:
            return False
        counts = Counter(tuple(int(v) for v in row) for row in array[:, cols])
        expected = n_runs // cells
        if len(counts) != cells or any(c != expected for c in counts.values()):
            return False
    return True


def achieved_strength(array: np.ndarray, level_counts: Sequence[int]) -> int:
    """Returns the largest t such that the array is an orthogonal array of strength t (0 if none)."""
    n_cols = np.asarray(array).shape[1]
    strength = 0
    for t in range(1, n_cols + 1):
        if not is_orthogonal(array, level_counts, t):
            break
        strength = t
    return strength


def rao_bound(level_counts: Sequence[int]) -> int:
    """Returns the Rao bound for strength 2: N >= 1 + sum(s_i - 1) (11 for 3^5)."""
    return 1 + sum(s - 1 for s in level_counts)


@dataclass(frozen=True)
class DesignReport:
    """The verification report of a design."""

    n_runs: int
    strength: int
    target_strength: int
    rao_bound: int
    level_counts_per_factor: dict[str, dict[int, int]]
    balanced: bool
    min_hamming: int
    mean_hamming: float
    nearest_neighbour_hist: dict[int, int]

    @property
    def meets_rao_bound(self) -> bool:
        return self.n_runs >= self.rao_bound

    def checks(self) -> dict[str, Any]:
        """Returns the headline checks as a JSON-ready dict."""
        return {
            "strength": self.strength,
            "target_strength": self.target_strength,
            "rao_bound": self.rao_bound,
            "meets_rao_bound": self.meets_rao_bound,
            "balanced": self.balanced,
            "min_hamming": self.min_hamming,
            "mean_hamming": round(self.mean_hamming, 4),
            "nearest_neighbour_hist": {str(k): v for k, v in self.nearest_neighbour_hist.items()},
        }


def hamming_matrix(configs: Sequence[HarnessConfig]) -> np.ndarray:
    """Returns the pairwise Hamming distance matrix of configurations."""
    array = np.array([c.levels for c in configs], dtype=np.int64)
    if len(array) == 0:
        return np.zeros((0, 0), dtype=np.int64)
    return (array[:, None, :] != array[None, :, :]).sum(axis=2)


def verify_design(
    space: HarnessSpace, configs: Sequence[HarnessConfig], target_strength: int = 0
) -> DesignReport:
    """Returns the verification report; raises ``ValueError`` when ``target_strength`` is missed,
    a configuration is outside the space, or a configuration repeats."""
    if not configs:
        raise ValueError("a design needs at least one configuration")
    for c in configs:
        if c not in space:
            raise ValueError(f"configuration {c} is not in {space}")
    if len(set(configs)) != len(configs):
        raise ValueError("a design must not repeat a configuration")
    array = np.array([c.levels for c in configs], dtype=np.int64)
    counts = space.level_counts
    strength = achieved_strength(array, counts)
    if strength < target_strength:
        raise ValueError(
            f"design has strength {strength}, below the required {target_strength}: "
            "a construction produced an array that is not orthogonal"
        )
    per_factor = {
        f.letter: {lvl: int((array[:, i] == lvl).sum()) for lvl in range(f.n_levels)}
        for i, f in enumerate(space.factors)
    }
    balanced = all(len(set(v.values())) == 1 for v in per_factor.values())
    dist = hamming_matrix(configs)
    n = len(configs)
    if n > 1:
        upper = dist[np.triu_indices(n, k=1)]
        masked = dist + np.eye(n, dtype=np.int64) * (len(counts) + 1)
        nearest = masked.min(axis=1)
        min_h, mean_h = int(upper.min()), float(upper.mean())
        hist = {int(d): int(c) for d, c in sorted(Counter(nearest.tolist()).items())}
    else:
        min_h, mean_h, hist = 0, 0.0, {}
    return DesignReport(
        n_runs=n,
        strength=strength,
        target_strength=target_strength,
        rao_bound=rao_bound(counts),
        level_counts_per_factor=per_factor,
        balanced=balanced,
        min_hamming=min_h,
        mean_hamming=mean_h,
        nearest_neighbour_hist=hist,
    )


# --- designs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeldOut:
    """An in-space test set: configurations outside the training design, with each one's
    Hamming distance to the nearest training configuration."""

    configs: tuple[HarnessConfig, ...]
    distance_to_train: tuple[int, ...]
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "configs": [c.code for c in self.configs],
            "distance_to_train": list(self.distance_to_train),
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Design:
    """A set of training configurations of a space, with how it was built and its report."""

    space: HarnessSpace
    kind: str
    configs: tuple[HarnessConfig, ...]
    report: DesignReport
    params: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.configs)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.configs)

    def __contains__(self, config: object) -> bool:
        return config in set(self.configs)

    @property
    def codes(self) -> list[str]:
        return [c.code for c in self.configs]

    def held_out(self, n: int = 18, seed: int = 0) -> HeldOut:
        """Returns ``n`` configurations drawn (seeded) from the complement of this design."""
        return held_out_configs(self.space, self.configs, n=n, seed=seed)

    def to_dict(self, held_out: HeldOut | None = None) -> dict[str, Any]:
        """Returns a JSON-ready dict with ``configs``, ``held_out`` and ``checks``."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "space": [
                {"name": f.name, "letter": f.letter, "levels": [lv.name for lv in f.levels]}
                for f in self.space.factors
            ],
            "params": self.params,
            "configs": self.codes,
            "checks": self.report.checks(),
            "level_counts_per_factor": {
                k: {str(lv): c for lv, c in v.items()}
                for k, v in self.report.level_counts_per_factor.items()
            },
        }
        if held_out is not None:
            out["held_out"] = [c.code for c in held_out.configs]
            out["held_out_distance_to_train"] = list(held_out.distance_to_train)
            out["held_out_seed"] = held_out.seed
        return out


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, int(n**0.5) + 1))


def prime_power(q: int) -> tuple[int, int] | None:
    """Returns (p, n) with q = p^n for a prime p, or None when q is not a prime power."""
    for p in range(2, q + 1):
        if q % p == 0:  # p is q's smallest prime factor
            n = 0
            while q % p == 0:
                q, n = q // p, n + 1
            return (p, n) if q == 1 else None
    return None


def _poly_mod(a: list[int], f: list[int], p: int) -> list[int]:
    """Returns a mod f over GF(p) (coefficients lowest first; f monic)."""
    a = list(a)
    while len(a) >= len(f):
        lead = a[-1]
        if lead:
            shift = len(a) - len(f)
            for i, c in enumerate(f):
                a[shift + i] = (a[shift + i] - lead * c) % p
        a.pop()
    return a


def _irreducible(p: int, n: int) -> list[int]:
    """Returns the first monic irreducible polynomial of degree n over GF(p) (coefficients
    lowest first), found by trial division by every monic polynomial of degree 1..n/2."""
    for tail in itertools.product(range(p), repeat=n):
        f = [*tail, 1]
        if f[0] == 0:
            continue  # divisible by x
        divisors = (
            [*low, 1] for degree in range(1, n // 2 + 1) for low in itertools.product(range(p), repeat=degree)
        )
        if all(any(_poly_mod(f, d, p)) for d in divisors):
            return f
    raise AssertionError(f"no irreducible polynomial of degree {n} over GF({p})")  # pragma: no cover


@lru_cache(maxsize=32)
def galois_field(q: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns the (addition, multiplication) tables of GF(q) for a prime power q = p^n.

    Element e in 0..q-1 is the polynomial over GF(p) whose coefficients are e's base-p digits
    (lowest first); products are reduced modulo the first monic irreducible polynomial of
    degree n. For a prime q the tables are addition and multiplication mod q."""
    found = prime_power(q)
    if found is None:
        raise ValueError(f"GF({q}) does not exist: {q} is not a prime power")
    p, n = found
    digits = [[(e // p**i) % p for i in range(n)] for e in range(q)]
    value = {tuple(d): e for e, d in enumerate(digits)}
    add = np.array([[value[tuple((x + y) % p for x, y in zip(a, b, strict=True))] for b in digits] for a in digits])
    f = _irreducible(p, n)
    mul = np.zeros((q, q), dtype=np.int64)
    for i, a in enumerate(digits):
        for j, b in enumerate(digits):
            product = [0] * (2 * n - 1)
            for x, u in enumerate(a):
                for y, v in enumerate(b):
                    product[x + y] = (product[x + y] + u * v) % p
            reduced = _poly_mod(product, f, p) if n > 1 else product
            mul[i, j] = value[tuple(reduced + [0] * (n - len(reduced)))]
    add = add.astype(np.int64)
    for table in (add, mul):
        table.setflags(write=False)  # shared by every caller (cached)
    return add, mul


def _runs_exponent(s: int, n_factors: int) -> int:
    """Returns the smallest m >= 2 with (s^m - 1)/(s - 1) >= n_factors."""
    m = 2
    while (s**m - 1) // (s - 1) < n_factors:
        m += 1
    return m


def rao_hamming_array(s: int, n_factors: int | None = None, m: int | None = None) -> np.ndarray:
    """Returns an OA(s^m, n_factors, s, 2) for a prime power ``s`` (Rao–Hamming; m=2 is
    Bose's s^2-run array with up to s+1 factors). Default m: the smallest that fits
    ``n_factors``; default ``n_factors``: all (s^m - 1)/(s - 1) columns.

    Rows are all x in GF(s)^m; a column is a vector a (first non-zero coordinate 1);
    the entry is a·x in GF(s) (mod s for a prime). Any two columns are linearly independent,
    so every pair of levels appears s^(m-2) times.
    """
    if prime_power(s) is None:
        raise ValueError(f"Rao–Hamming needs a prime power number of levels, got {s}")
    if m is None:
        m = _runs_exponent(s, n_factors or 2)
    columns = [
        a for a in itertools.product(range(s), repeat=m)
        if any(a) and a[next(i for i, v in enumerate(a) if v)] == 1
    ]
    if n_factors is None:
        n_factors = len(columns)
    if n_factors > len(columns):
        raise ValueError(f"Rao–Hamming with s={s}, m={m} has only {len(columns)} columns")
    # Unit vectors first, so the first m columns are the full factorial's own columns.
    columns.sort(key=lambda a: (sum(1 for v in a if v) != 1, a))
    rows = np.array(list(itertools.product(range(s), repeat=m)), dtype=np.int64)
    if _is_prime(s):
        cols = np.array(columns[:n_factors], dtype=np.int64).T  # m x n_factors
        return (rows @ cols) % s
    add, mul = galois_field(s)
    out = np.zeros((len(rows), n_factors), dtype=np.int64)
    for j, a in enumerate(columns[:n_factors]):
        for i, coefficient in enumerate(a):
            out[:, j] = add[out[:, j], mul[coefficient, rows[:, i]]]
    return out


@lru_cache(maxsize=1)
def _difference_scheme_6x6_mod3() -> np.ndarray:
    """Returns a difference scheme D(6, 6; 3): a 6x6 matrix over Z3 whose columns pairwise
    differ by every element of Z3 exactly twice. Found by a small deterministic search."""

    def compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
        diff = Counter((x - y) % 3 for x, y in zip(a, b, strict=True))
        return all(diff[v] == 2 for v in range(3))

    pool = [c for c in itertools.product(range(3), repeat=6) if c[0] == 0 and any(c)]

    def search(chosen: list[tuple[int, ...]], start: int) -> list[tuple[int, ...]] | None:
        if len(chosen) == 6:
            return chosen
        for i in range(start, len(pool)):
            if all(compatible(pool[i], c) for c in chosen):
                found = search([*chosen, pool[i]], i + 1)
                if found:
                    return found
        return None

    found = search([(0,) * 6], 0)
    if found is None:  # pragma: no cover - the search space is known to contain one
        raise RuntimeError("no difference scheme D(6,6;3) found")
    return np.array(found, dtype=np.int64).T


def l18_three_level_array() -> np.ndarray:
    """Returns an OA(18, 7, 3, 2): the seven 3-level columns of the L18.

    Develop the difference scheme D(6,6;3) over Z3 (rows D_r + g, g in Z3) for six columns,
    then add a seventh column that labels the pair {2i, 2i+1} a row of D belongs to; each
    label meets every (g-shifted) value of a D-column twice.
    """
    scheme = _difference_scheme_6x6_mod3()
    rows = []
    for g in range(3):
        for r, base in enumerate(scheme):
            rows.append([*((base + g) % 3).tolist(), r // 2])
    return np.array(rows, dtype=np.int64)


def _best_columns(array: np.ndarray, n_factors: int) -> np.ndarray:
    """Returns the ``n_factors`` columns of ``array`` that maximise the minimum pairwise
    Hamming distance between rows (ties: the lexicographically first column set)."""
    best_cols, best_key = None, None
    for cols in itertools.combinations(range(array.shape[1]), n_factors):
        sub = array[:, cols]
        dist = (sub[:, None, :] != sub[None, :, :]).sum(axis=2)
        upper = dist[np.triu_indices(len(sub), k=1)]
        key = (int(upper.min()), -int((upper == upper.min()).sum()))
        if best_key is None or key > best_key:
            best_cols, best_key = cols, key
    assert best_cols is not None
    return array[:, best_cols]


_SUPPORTED = (
    "supported strength-2 constructions: level counts that are prime powers (2, 3, 4, 5, 7, 8, 9, ...): "
    "all factors with s levels by Rao–Hamming over GF(s) (s^2 runs for up to s+1 factors, s^m runs "
    "beyond; 3 levels with 5 to 7 factors in 18 runs), mixed counts that all divide one prime power "
    "by collapsing its levels, other mixes as the product of one array per level count; for other "
    "spaces use kind 'random' or 'full'"
)


def orthogonal_array(level_counts: Sequence[int], strength: int = 2) -> np.ndarray:
    """Returns a strength-2 orthogonal array for these level counts (column i has
    ``level_counts[i]`` levels), or raises ``ValueError`` naming what is supported.

    Every level count must be a prime power. With one count s for every factor:
    - s = 3 with 5 to 7 factors: 18 runs (the L18's 3-level columns; the paper's design);
    - otherwise Rao–Hamming over GF(s) in s^m runs (s^2 for up to s+1 factors).
    Among the candidate column sets, the one with the largest minimum Hamming distance is used.
    With mixed counts, the fewer-run of two constructions: (a) when every count divides one
    prime power q, the array for q levels with each column's levels collapsed onto its count
    (level v -> v mod s: every level keeps q/s of q's, so every pair of columns stays
    balanced); (b) the product of one array per level count (rows: every pair of their rows;
    a pair of columns from one part is balanced there, from two parts by independence). For
    four 3-level factors and one 4-level factor that is 9 x 4 = 36 runs.
    """
    counts = list(level_counts)
    k = len(counts)
    if strength != 2:
        raise ValueError(f"strength {strength} is not supported; {_SUPPORTED}")
    odd = sorted({s for s in counts if prime_power(s) is None})
    if odd:
        raise ValueError(f"{', '.join(map(str, odd))} levels per factor is not a prime power; {_SUPPORTED}")
    if len(set(counts)) == 1:
        return _uniform_array(counts[0], k)
    candidates = [_product_array(counts)]
    q = next((q for q in range(max(counts), max(counts) ** 3 + 1)
              if prime_power(q) and all(q % s == 0 for s in counts)), None)
    if q is not None:
        collapsed = _uniform_array(q, k) % np.array(counts, dtype=np.int64)
        if len({tuple(row) for row in collapsed.tolist()}) == len(collapsed):  # a design repeats no row
            candidates.append(collapsed)
    return min(candidates, key=len)


def _uniform_array(s: int, k: int) -> np.ndarray:
    """An OA(N, k, s, 2) for a prime power s (see ``orthogonal_array``)."""
    if k == 1:
        return np.arange(s, dtype=np.int64)[:, None]
    if s == 3 and 5 <= k <= 7:
        return _best_columns(l18_three_level_array(), k)
    candidates = rao_hamming_array(s, m=_runs_exponent(s, k))
    if math.comb(candidates.shape[1], k) <= _MAX_COLUMN_SETS:
        return _best_columns(candidates, k)
    return candidates[:, :k]


def _product_array(counts: Sequence[int]) -> np.ndarray:
    """The product of one uniform array per distinct level count, columns in ``counts`` order."""
    parts = {s: _uniform_array(s, counts.count(s)) for s in dict.fromkeys(counts)}
    rows = [np.concatenate(combo) for combo in itertools.product(*parts.values())]
    product = np.array(rows, dtype=np.int64)
    # the product's columns come grouped by count; put each back at its factor's position
    offsets, order = {}, []
    start = 0
    for s, part in parts.items():
        offsets[s] = start
        start += part.shape[1]
    seen: Counter[int] = Counter()
    for s in counts:
        order.append(offsets[s] + seen[s])
        seen[s] += 1
    return product[:, order]


# Above this many candidate column sets, take the first k columns instead of searching.
_MAX_COLUMN_SETS = 2000


def _configs(space: HarnessSpace, array: np.ndarray) -> tuple[HarnessConfig, ...]:
    return tuple(space.config([int(v) for v in row]) for row in array)


def orthogonal(space: HarnessSpace, strength: int = 2) -> Design:
    """Returns the verified strength-``strength`` orthogonal design of ``space``
    (for the default space: OA(18, 3^5, 2) with minimum pairwise Hamming distance 3)."""
    array = orthogonal_array(space.level_counts, strength)
    configs = _configs(space, array)
    report = verify_design(space, configs, target_strength=strength)
    return Design(space, "orthogonal", configs, report, {"strength": strength})


def single(space: HarnessSpace, base: HarnessConfig | str | None = None) -> Design:
    """Returns the one-configuration design of the base harness H0 (default: the first row of
    the orthogonal design, or the all-zeros configuration when none is supported)."""
    config = _base_config(space, base)
    return Design(space, "single", (config,), verify_design(space, [config]), {"base": config.code})


def _base_config(space: HarnessSpace, base: HarnessConfig | str | None) -> HarnessConfig:
    if isinstance(base, str):
        return space.parse(base)
    if base is not None:
        if base not in space:
            raise ValueError(f"base configuration {base} is not in {space}")
        return base
    try:
        return _configs(space, orthogonal_array(space.level_counts)[:1])[0]
    except ValueError:
        return space.config([0] * len(space.factors))


def first_order(space: HarnessSpace, base: HarnessConfig | str | None = None) -> Design:
    """Returns max(s) configurations covering every level of every factor (exactly once when
    all factors have s levels): row i sets each factor to (base level + i) mod s_f, so the
    set contains the base harness H0."""
    base_config = _base_config(space, base)
    n = max(space.level_counts)
    configs = tuple(
        space.config([(b + i) % s for b, s in zip(base_config.levels, space.level_counts, strict=True)])
        for i in range(n)
    )
    return Design(space, "first-order", configs, verify_design(space, configs), {"base": base_config.code})


def random_design(space: HarnessSpace, n: int, seed: int = 0) -> Design:
    """Returns ``n`` distinct configurations drawn uniformly (seeded) from the whole space."""
    if not 1 <= n <= space.size:
        raise ValueError(f"random design size n={n} is out of range 1..{space.size}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
    picks = rng.choice(space.size, size=n, replace=False)
    everything = space.all_configs
    configs = tuple(everything[int(i)] for i in picks)
    return Design(space, "random", configs, verify_design(space, configs), {"n": n, "seed": seed})


def full(space: HarnessSpace) -> Design:
    """Returns every configuration of the space (243 for the default)."""
    configs = space.all_configs
    report = verify_design(space, configs, target_strength=min(2, len(space.factors)))
    return Design(space, "full", configs, report)


def held_out_configs(
    space: HarnessSpace, training: Sequence[HarnessConfig], n: int = 18, seed: int = 0
) -> HeldOut:
    """Returns ``n`` configurations drawn (seeded) from the complement of ``training``, each
    with its Hamming distance to the nearest training configuration. ``n`` is capped at the
    size of the complement."""
    if n < 0:
        raise ValueError(f"held-out size must be >= 0, got {n}")
    train = set(training)
    complement = [c for c in space.all_configs if c not in train]
    n = min(n, len(complement))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x4E1D]))
    picks = sorted(int(i) for i in rng.choice(len(complement), size=n, replace=False)) if n else []
    chosen = tuple(complement[i] for i in picks)
    distances = tuple(min(c.hamming(t) for t in training) for c in chosen)
    return HeldOut(chosen, distances, seed)


def make_design(
    space: HarnessSpace,
    kind: str = "orthogonal",
    n: int | None = None,
    seed: int = 0,
    base: HarnessConfig | str | None = None,
) -> Design:
    """Returns a design by name: orthogonal, first-order, random (needs n; default 18), full, single."""
    kind = kind.replace("_", "-")
    if kind == "orthogonal":
        return orthogonal(space)
    if kind == "first-order":
        return first_order(space, base)
    if kind == "random":
        return random_design(space, n if n is not None else 18, seed)
    if kind == "full":
        return full(space)
    if kind == "single":
        return single(space, base)
    raise ValueError(f"unknown design kind {kind!r}; choose one of {', '.join(DESIGN_KINDS)}")
