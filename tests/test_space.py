"""The harness space: codes, parsing errors, Hamming distance, enumeration, custom spaces."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.harness.registry import default_space
from harnessrl.space import Factor, HarnessConfig, HarnessSpace, Level


def make_space(level_counts):
    return HarnessSpace(
        [
            Factor(f"factor{i}", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i], tuple(Level(f"l{j}") for j in range(n)))
            for i, n in enumerate(level_counts)
        ]
    )


def test_default_space_is_five_factors_of_three_levels():
    space = default_space()
    assert space.letters == ("S", "T", "O", "C", "W")
    assert space.level_counts == (3, 3, 3, 3, 3)
    assert space.size == 243
    assert len(set(space.enumerate())) == 243


@given(st.lists(st.integers(0, 2), min_size=5, max_size=5))
def test_code_round_trips(levels):
    space = default_space()
    config = space.config(levels)
    assert space.parse(config.code) == config
    assert space.parse(config.code.lower()) == config
    assert hash(space.parse(config.code)) == hash(config)


def test_code_format():
    assert default_space().config([0, 1, 2, 0, 1]).code == "S0-T1-O2-C0-W1"


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("S0-T1-X2-C0-W1", "unknown factor letter 'X'"),
        ("S0-T1-O2-C0", "missing factor(s) W"),
        ("S0-T1-O3-C0-W1", "out of range 0..2"),
        ("S0-T1-O2-C0-W1-S1", "appears twice"),
        ("S0-T1-Ox-C0-W1", "bad part 'Ox'"),
        ("", "empty configuration code"),
    ],
)
def test_bad_codes_name_the_problem_and_valid_range(code, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        default_space().parse(code)


def test_out_of_range_error_names_valid_letters():
    with pytest.raises(ValueError, match="valid letters are S, T, O, C, W"):
        default_space().parse("Q0-T1-O2-C0-W1")


@given(
    st.lists(st.integers(0, 2), min_size=5, max_size=5),
    st.lists(st.integers(0, 2), min_size=5, max_size=5),
)
def test_hamming_counts_differing_factors(a, b):
    space = default_space()
    ca, cb = space.config(a), space.config(b)
    assert ca.hamming(cb) == sum(x != y for x, y in zip(a, b, strict=True))
    assert ca.hamming(cb) == cb.hamming(ca)
    assert ca.hamming(ca) == 0


def test_mixed_level_space_enumerates_and_parses():
    space = make_space([2, 4, 3])
    configs = list(space.enumerate())
    assert len(configs) == 2 * 4 * 3
    assert configs == [space.config(lv) for lv in itertools.product(range(2), range(4), range(3))]
    assert space.parse("A1-B3-C2").levels == (1, 3, 2)
    with pytest.raises(ValueError, match=r"out of range 0\.\.1"):
        space.parse("A2-B0-C0")


def test_configs_of_different_spaces_do_not_compare():
    with pytest.raises(ValueError, match="different spaces"):
        HarnessConfig(("A", "B"), (0, 0)).hamming(HarnessConfig(("S", "T"), (0, 0)))


def test_space_rejects_duplicate_letters_and_single_level_factors():
    with pytest.raises(ValueError, match="unique"):
        HarnessSpace([Factor("a", "A", (Level("x"), Level("y"))), Factor("b", "A", (Level("x"), Level("y")))])
    with pytest.raises(ValueError, match="at least 2 levels"):
        Factor("a", "A", (Level("x"),))
