"""Which weights a rollout came from: the rollout policy's ``weight_version`` stamped on every
trajectory, and the check before an update that none of them is stale."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harnessrl.policy.base import WeightSyncedPolicy
from harnessrl.trajectory import Trajectory

WEIGHT_VERSION_KEY = "weight_version"


class StaleRolloutError(RuntimeError):
    """An update was about to train on trajectories sampled with older weights."""


def stamp_weight_version(
    trajectories: Sequence[Trajectory], policy: WeightSyncedPolicy, version: int
) -> Sequence[Trajectory]:
    """Returns ``trajectories``, each stamped with ``version``, the policy's weight version when
    their rollout began; raises ``StaleRolloutError`` when the weights changed since (the
    rollouts would mix two policies)."""
    if policy.weight_version != version:
        raise StaleRolloutError(f"the rollout weights changed from version {version} to "
                                f"{policy.weight_version} during a rollout")
    for trajectory in trajectories:
        trajectory.metrics[WEIGHT_VERSION_KEY] = version
    return trajectories


def check_current(trajectories: Sequence[Trajectory], policy: WeightSyncedPolicy) -> None:
    """Raises ``StaleRolloutError`` unless every trajectory was sampled with the policy's
    current weights."""
    stale: dict[Any, int] = {}
    for trajectory in trajectories:
        version = trajectory.metrics.get(WEIGHT_VERSION_KEY)
        if version != policy.weight_version:
            stale[version] = stale.get(version, 0) + 1
    if stale:
        raise StaleRolloutError(
            f"{sum(stale.values())} trajectories were sampled with weight versions {sorted(stale, key=str)}, "
            f"not the current {policy.weight_version}: the update would train on stale rollouts"
        )
