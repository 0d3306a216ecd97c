"""Pass@k (unbiased, Chen et al. 2021), Avg@k, bootstrap confidence intervals and paired tests."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb, sqrt
from statistics import NormalDist

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Returns the unbiased estimate of pass@k from n samples with c correct:
    1 - C(n - c, k) / C(n, k) (Chen et al. 2021, eq. 1)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def avg_at_k(correct_per_task: Sequence[Sequence[bool]]) -> float:
    """Returns Avg@k: the mean success rate over each task's k runs, averaged over tasks."""
    if not correct_per_task:
        return 0.0
    return float(np.mean([np.mean(runs) if runs else 0.0 for runs in correct_per_task]))


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Returns the (alpha/2, 1 - alpha/2) percentile bootstrap interval of the mean."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    means = rng.choice(data, size=(n_boot, data.size), replace=True).mean(axis=1)
    return (float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2)))


def bootstrap_ci_mean_of_means(
    groups: Sequence[Sequence[float]], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Returns the percentile bootstrap interval of the unweighted mean of group means (e.g.
    the paper's overall = mean of in-space and out-of-space), resampling within each group
    independently. With one group it is ``bootstrap_ci`` of that group."""
    data = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not data:
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    means = np.mean([rng.choice(g, size=(n_boot, g.size), replace=True).mean(axis=1) for g in data], axis=0)
    return (float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2)))


def score_runs(correct_per_task: Sequence[Sequence[bool]], k: int, seed: int = 0) -> dict[str, object]:
    """Returns the headline numbers of a set of (task, harness) units, each with its runs:
    Pass@1 (the mean over runs, i.e. Avg@n), pass@k (unbiased; None when a unit has fewer
    than k runs), Avg@k, and a 95% percentile bootstrap interval for each, resampling units."""
    runs = [list(r) for r in correct_per_task if len(r)]
    per_unit_1 = [pass_at_k(len(r), sum(r), 1) for r in runs]
    out: dict[str, object] = {
        "tasks": len(runs),
        "pass_at_1": float(np.mean(per_unit_1)) if runs else 0.0,
        "pass_at_1_ci": list(bootstrap_ci(per_unit_1, seed=seed)),
    }
    if runs and all(len(r) >= k for r in runs):
        per_unit_k = [pass_at_k(len(r), sum(r), k) for r in runs]
        out["pass_at_k"] = float(np.mean(per_unit_k))
        out["pass_at_k_ci"] = list(bootstrap_ci(per_unit_k, seed=seed))
    else:
        out["pass_at_k"], out["pass_at_k_ci"] = None, None
    # Avg@k: each unit's success rate over its first k runs (Harness-S: Avg@3).
    per_unit_avg = [float(np.mean(r[:k])) for r in runs]
    out["avg_at_k"] = float(np.mean(per_unit_avg)) if runs else 0.0
    out["avg_at_k_ci"] = list(bootstrap_ci(per_unit_avg, seed=seed))
    return out


def paired_bootstrap_ci(
    differences: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Returns the percentile bootstrap interval of the mean of paired differences (arm minus
    reference on the same units), resampling units: the interval of a gain measured on the
    same tasks x configurations, narrower than the difference of two independent intervals
    whenever the two arms succeed on the same units."""
    return bootstrap_ci(differences, n_boot=n_boot, alpha=alpha, seed=seed)


def sign_test(wins: int, losses: int) -> float:
    """Returns the two-sided exact sign test p-value of ``wins`` units better and ``losses``
    units worse (ties dropped): 2 P(X <= min(wins, losses)) for X ~ Binomial(wins + losses, 1/2),
    capped at 1. With binary outcomes per unit this is the exact McNemar test."""
    if wins < 0 or losses < 0:
        raise ValueError(f"need wins, losses >= 0, got {wins}, {losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def resolvable_difference(differences: Sequence[float], power: float = 0.8, alpha: float = 0.05) -> float | None:
    """Returns the smallest true mean difference that this many paired units, with the spread
    of differences observed, detect with probability ``power`` in a two-sided test at level
    ``alpha``: (z(1 - alpha/2) + z(power)) * sd / sqrt(n), the normal approximation of the
    paired test (2.80 sd / sqrt(n) at the defaults). What a comparison that did not resolve
    could have resolved; None with fewer than 2 units or no unit that differs (no spread to
    scale from)."""
    data = np.asarray(differences, dtype=float)
    if data.size < 2 or not np.any(data):
        return None
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return float(z * data.std(ddof=1) / sqrt(data.size))


def paired_comparison(arm: dict[object, float], reference: dict[object, float], seed: int = 0) -> dict[str, object]:
    """Returns the paired comparison of two arms' per-unit scores (unit -> Pass@1 of that
    unit), on the units both have: the mean difference, its paired bootstrap interval, the
    units won, lost and tied, the sign-test p-value, and the difference these units resolve
    (``resolvable_difference``)."""
    units = sorted(set(arm) & set(reference), key=repr)
    diffs = [arm[u] - reference[u] for u in units]
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return {
        "units": len(units),
        "difference": float(np.mean(diffs)) if diffs else None,
        "difference_ci": list(paired_bootstrap_ci(diffs, seed=seed)) if diffs else None,
        "wins": int(wins), "losses": int(losses), "ties": len(units) - int(wins) - int(losses),
        "sign_test_p": sign_test(int(wins), int(losses)),
        "resolvable": resolvable_difference(diffs),
    }
