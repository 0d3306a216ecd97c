"""Pass@k, Avg@k and bootstrap intervals against direct computation."""

import itertools
from math import comb

import numpy as np
import pytest

from harnessrl.eval.metrics import (
    avg_at_k,
    bootstrap_ci,
    paired_comparison,
    pass_at_k,
    resolvable_difference,
    sign_test,
)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 0, 1), (5, 1, 1), (5, 2, 3), (10, 3, 5), (4, 4, 2), (8, 7, 2)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_success(n, c, k):
    runs = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    direct = sum(any(runs[i] for i in s) for s in subsets) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(direct)


def test_pass_at_1_is_the_success_rate_and_avg_at_k_the_mean():
    per_task = [[True, False, False], [True, True, True], [False, False, False]]
    def mean_pass_at(k):
        return sum(pass_at_k(len(runs), sum(runs), k) for runs in per_task) / len(per_task)

    assert mean_pass_at(1) == pytest.approx((1 / 3 + 1 + 0) / 3)
    assert mean_pass_at(3) == pytest.approx((1 + 1 + 0) / 3)
    assert avg_at_k(per_task) == pytest.approx((1 / 3 + 1 + 0) / 3)


def test_pass_at_k_rejects_impossible_arguments():
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(2, 3, 1)


def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_data():
    small = [1.0, 0.0] * 5
    large = [1.0, 0.0] * 500
    lo_s, hi_s = bootstrap_ci(small, seed=1)
    lo_l, hi_l = bootstrap_ci(large, seed=1)
    assert lo_s <= 0.5 <= hi_s and lo_l <= 0.5 <= hi_l
    assert hi_l - lo_l < hi_s - lo_s
    assert bootstrap_ci([]) == (0.0, 0.0)


@pytest.mark.parametrize(("wins", "losses"), [(0, 0), (3, 0), (9, 1), (5, 5), (2, 7), (12, 4)])
def test_sign_test_equals_the_two_sided_exact_binomial_by_enumeration(wins, losses):
    n = wins + losses
    # every outcome of n fair coin flips at least as extreme as the observed split
    extreme = sum(1 for flips in itertools.product((0, 1), repeat=n)
                  if abs(2 * sum(flips) - n) >= abs(wins - losses))
    assert sign_test(wins, losses) == pytest.approx(min(1.0, extreme / 2**n) if n else 1.0)
    assert sign_test(9, 1) == pytest.approx(2 * 11 / 1024)
    with pytest.raises(ValueError):
        sign_test(-1, 2)


def test_paired_comparison_uses_only_shared_units_and_counts_wins_losses_ties():
    arm = {("t1", "a"): 1.0, ("t2", "a"): 1.0, ("t3", "a"): 0.0, ("t4", "a"): 0.5, ("only-arm", "a"): 1.0}
    ref = {("t1", "a"): 0.0, ("t2", "a"): 1.0, ("t3", "a"): 1.0, ("t4", "a"): 0.0, ("only-ref", "a"): 0.0}
    out = paired_comparison(arm, ref)
    assert out["units"] == 4 and (out["wins"], out["losses"], out["ties"]) == (2, 1, 1)
    assert out["difference"] == pytest.approx((1 + 0 - 1 + 0.5) / 4)
    low, high = out["difference_ci"]
    assert low <= out["difference"] <= high and out["sign_test_p"] == pytest.approx(sign_test(2, 1))
    # identical arms: no difference, an interval of zero width, p = 1
    same = paired_comparison(ref, ref)
    assert same["difference"] == 0.0 and same["difference_ci"] == [0.0, 0.0] and same["sign_test_p"] == 1.0
    assert same["resolvable"] is None  # no unit differs: no spread to scale from
    assert out["resolvable"] == pytest.approx(resolvable_difference([1.0, 0.0, -1.0, 0.5]))


def test_resolvable_difference_is_what_the_paired_test_detects_at_its_power():
    """Paired binary units, 9 won and 9 lost of 192 (issue 31's single-H0 against the control):
    the smallest difference resolved is 2.80 sd / sqrt(n); simulated arms whose true difference is
    that size are told apart by the paired test about 80% of the time, half that size far less."""
    observed = [1.0] * 9 + [-1.0] * 9 + [0.0] * 174
    resolvable = resolvable_difference(observed)
    sd = (18 / 191) ** 0.5  # the differences' sample standard deviation (mean 0)
    assert resolvable == pytest.approx(2.8016 * sd / 192**0.5, rel=1e-3)
    assert resolvable_difference(observed * 4) == pytest.approx(resolvable / 2, rel=0.01)  # 4x the units
    assert resolvable_difference(observed, power=0.5) < resolvable < resolvable_difference(observed, alpha=0.01)

    rng = np.random.default_rng(7)

    def detected(effect: float) -> float:
        # Each unit differs (by +1 or -1) with the observed share; the signs' balance gives the effect.
        share = 18 / 192
        units = rng.random((4000, 192))
        wins = units < share * (1 + effect / share) / 2
        losses = (units >= share * (1 + effect / share) / 2) & (units < share)
        diffs = wins.astype(float) - losses
        z = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / 192**0.5 + 1e-12)
        return float(np.mean(np.abs(z) > 1.96))

    assert 0.74 <= detected(resolvable) <= 0.86
    assert detected(resolvable / 2) < 0.4
