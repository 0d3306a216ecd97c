"""Designs: strength checked by an independent brute-force counter, distances, baselines, held-out."""

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.design import (
    first_order,
    full,
    held_out_configs,
    l18_three_level_array,
    make_design,
    orthogonal,
    orthogonal_array,
    random_design,
    rao_hamming_array,
    single,
    verify_design,
)
from harnessrl.harness.registry import default_space
from harnessrl.space import Factor, HarnessSpace, Level


def brute_force_strength2(rows, level_counts):
    """Independent of design.py: every pair of columns shows every level pair equally often."""
    n = len(rows)
    for i, j in itertools.combinations(range(len(level_counts)), 2):
        cells = Counter((r[i], r[j]) for r in rows)
        want = n / (level_counts[i] * level_counts[j])
        for a in range(level_counts[i]):
            for b in range(level_counts[j]):
                if cells.get((a, b), 0) != want:
                    return False
    return True


def make_space(n_factors, levels):
    return HarnessSpace(
        [Factor(f"f{i}", "ABCDEFGHIJKLMNOP"[i], tuple(Level(str(j)) for j in range(levels))) for i in range(n_factors)]
    )


def test_default_design_is_oa18_with_min_hamming_three():
    design = orthogonal(default_space())
    rows = [c.levels for c in design.configs]
    assert len(rows) == 18 and len(set(rows)) == 18
    assert brute_force_strength2(rows, [3] * 5)
    # every pair of factors shows each of its 9 level pairs exactly twice
    for i, j in itertools.combinations(range(5), 2):
        assert set(Counter((r[i], r[j]) for r in rows).values()) == {2}
    distances = [sum(a != b for a, b in zip(r, s, strict=True)) for r, s in itertools.combinations(rows, 2)]
    assert min(distances) == 3
    assert abs(np.mean(distances) - 540 / 153) < 1e-9  # 3.53, fixed for any OA(18, 3^5, 2)
    checks = design.report.checks()
    assert checks["strength"] == 2 and checks["rao_bound"] == 11 and checks["min_hamming"] == 3
    assert checks["nearest_neighbour_hist"] == {"3": 18}


@pytest.mark.parametrize("n_factors", [5, 6, 7])
def test_l18_columns_have_strength_two(n_factors):
    array = orthogonal_array([3] * n_factors)
    assert array.shape == (18, n_factors)
    assert brute_force_strength2(array.tolist(), [3] * n_factors)


def test_full_l18_has_seven_strength_two_columns():
    array = l18_three_level_array()
    assert array.shape == (18, 7)
    assert brute_force_strength2(array.tolist(), [3] * 7)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 3, 5, 7]), st.data())
def test_rao_hamming_has_strength_two_for_every_prime(s, data):
    n_factors = data.draw(st.integers(2, min(s + 1, 8) if s > 2 else 7))
    array = rao_hamming_array(s, n_factors)
    assert array.shape[1] == n_factors
    assert brute_force_strength2(array.tolist(), [s] * n_factors)
    if n_factors <= s + 1:
        assert array.shape[0] == s * s  # Bose: s^2 runs for up to s+1 factors


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([2, 3, 5, 7]), st.integers(2, 8))
def test_every_supported_space_builds_a_verified_design(s, n_factors):
    design = orthogonal(make_space(n_factors, s))
    rows = [c.levels for c in design.configs]
    assert brute_force_strength2(rows, [s] * n_factors)
    assert len(rows) >= 1 + n_factors * (s - 1)  # Rao bound


def test_unsupported_spaces_get_an_error_naming_what_is_supported():
    mixed = HarnessSpace(
        [Factor("a", "A", (Level("0"), Level("1"))), Factor("b", "B", (Level("0"), Level("1"), Level("2")))]
    )
    with pytest.raises(ValueError, match=r"mixed level counts .* supported strength-2 constructions"):
        orthogonal(mixed)
    with pytest.raises(ValueError, match="not prime"):
        orthogonal(make_space(3, 4))
    with pytest.raises(ValueError, match="strength 3 is not supported"):
        orthogonal(default_space(), strength=3)


def test_verification_rejects_a_non_orthogonal_array():
    space = default_space()
    configs = list(orthogonal(space).configs)
    configs[0] = configs[0].replace(S=(configs[0]["S"] + 1) % 3)  # break one cell
    assert len(set(configs)) == len(configs)
    with pytest.raises(ValueError, match="strength 0, below the required 2"):
        verify_design(space, configs, target_strength=2)


def test_baselines():
    space = default_space()
    h0 = orthogonal(space).configs[0]
    assert single(space).configs == (h0,)
    assert single(space, "S1-T2-O0-C1-W0").configs[0].code == "S1-T2-O0-C1-W0"
    fo = first_order(space)
    assert len(fo) == 3 and h0 in fo
    for i in range(5):
        assert sorted(c.levels[i] for c in fo.configs) == [0, 1, 2]  # every level exactly once
    r1, r2 = random_design(space, 18, seed=3), random_design(space, 18, seed=3)
    assert r1.configs == r2.configs and len(set(r1.configs)) == 18
    assert random_design(space, 18, seed=4).configs != r1.configs
    assert len(full(space)) == 243 and full(space).report.strength == 5
    with pytest.raises(ValueError, match="unknown design kind"):
        make_design(space, "latin")


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["orthogonal", "first-order", "random", "single"]))
def test_held_out_never_in_training(seed, kind):
    space = default_space()
    design = make_design(space, kind, seed=seed)
    held = design.held_out(18, seed=seed)
    assert len(held.configs) == 18 and len(set(held.configs)) == 18
    assert not set(held.configs) & set(design.configs)
    for config, distance in zip(held.configs, held.distance_to_train, strict=True):
        assert distance == min(config.hamming(t) for t in design.configs) >= 1


def test_held_out_of_full_design_is_empty():
    space = default_space()
    assert held_out_configs(space, full(space).configs, 18).configs == ()


def test_design_json_has_promised_keys():
    space = default_space()
    design = orthogonal(space)
    out = design.to_dict(design.held_out())
    assert len(out["configs"]) == 18 and len(out["held_out"]) == 18
    assert {"strength", "rao_bound", "min_hamming", "mean_hamming"} <= set(out["checks"])
