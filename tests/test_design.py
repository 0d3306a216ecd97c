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
    galois_field,
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
    return mixed_space([levels] * n_factors)


def mixed_space(counts):
    return HarnessSpace(
        [Factor(f"f{i}", "ABCDEFGHIJKLMNOP"[i], tuple(Level(str(j)) for j in range(s))) for i, s in enumerate(counts)]
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


@pytest.mark.parametrize("q", [4, 8, 9, 16, 25, 27])
def test_galois_fields_obey_the_field_axioms(q):
    add, mul = galois_field(q)
    elements = range(q)
    assert all(sorted(add[a]) == list(elements) for a in elements)  # + is a group (Latin square)
    assert all(sorted(mul[a, 1:]) == list(range(1, q)) for a in range(1, q))  # no zero divisors
    assert (add == add.T).all() and (mul == mul.T).all() and (mul[1] == np.arange(q)).all()
    for a, b, c in itertools.product(elements, repeat=3):
        assert mul[a, add[b, c]] == add[mul[a, b], mul[a, c]]  # distributive
        assert add[add[a, b], c] == add[a, add[b, c]] and mul[mul[a, b], c] == mul[a, mul[b, c]]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([4, 8, 9]), st.data())
def test_rao_hamming_has_strength_two_for_prime_powers(q, data):
    n_factors = data.draw(st.integers(2, q + 1))
    array = rao_hamming_array(q, n_factors)
    assert array.shape == (q * q, n_factors)  # Bose: q^2 runs for up to q+1 factors
    assert brute_force_strength2(array.tolist(), [q] * n_factors)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([2, 3, 4, 5, 8, 9]), min_size=2, max_size=5).filter(lambda c: len(set(c)) > 1))
def test_mixed_prime_power_spaces_build_a_verified_design(counts):
    design = orthogonal(mixed_space(counts))
    rows = [c.levels for c in design.configs]
    assert brute_force_strength2(rows, counts) and len(set(rows)) == len(rows)
    assert design.report.checks()["strength"] >= 2
    # never more runs than the product of one array per level count
    per_count = {s: len(orthogonal_array([s] * counts.count(s))) for s in set(counts)}
    assert len(rows) <= int(np.prod(list(per_count.values())))


def test_a_fourth_level_on_one_factor_and_collapsible_mixes():
    # the recipe "add a factor level" on the default space: OA(9, 3^4) x 4 levels
    counts = [3, 3, 3, 3, 4]
    array = orthogonal_array(counts)
    assert array.shape == (36, 5) and brute_force_strength2(array.tolist(), counts)
    # counts that divide one prime power: that array with its levels collapsed, 16 runs not 2 x 16
    assert orthogonal_array([2, 4, 4]).shape == (16, 3)
    assert orthogonal_array([2, 2, 4, 8]).shape == (64, 4)
    assert orthogonal_array([4] * 5).shape == (16, 5)  # GF(4), Bose


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([2, 3, 5, 7]), st.integers(2, 8))
def test_every_supported_space_builds_a_verified_design(s, n_factors):
    design = orthogonal(make_space(n_factors, s))
    rows = [c.levels for c in design.configs]
    assert brute_force_strength2(rows, [s] * n_factors)
    assert len(rows) >= 1 + n_factors * (s - 1)  # Rao bound


def test_unsupported_spaces_get_an_error_naming_what_is_supported():
    with pytest.raises(ValueError, match=r"6 levels per factor is not a prime power; supported strength-2"):
        orthogonal(mixed_space([2, 6, 3]))
    with pytest.raises(ValueError, match="10 levels per factor is not a prime power"):
        orthogonal(make_space(3, 10))
    with pytest.raises(ValueError, match="is not a prime power"):
        galois_field(12)
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
