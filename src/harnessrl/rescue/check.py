"""Protocol compliance of siblings: the patch applies to its base and the oracle (the gold
solution through the sibling) still passes a sample of tasks, ending with an accepted
submit. A guard that blocks gold actions, or a hook that breaks the flow, makes a sibling
invalid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from harnessrl.harness.harness import Harness
from harnessrl.harness.limits import SCRIPTED_LIMITS
from harnessrl.harness.siblings import PatchError, Sibling, build
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rescue.runs import run_grid
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


@dataclass
class Compliance:
    """Whether one sibling is usable: ``problems`` says why not (empty: compliant)."""

    sibling: str
    problems: list[str] = field(default_factory=list)
    oracle_passed: int = 0
    oracle_tasks: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def check_siblings(siblings: Sequence[Sibling], tasks: Sequence[Task], settings: RolloutSettings | None = None) -> list[Compliance]:
    """Returns the compliance of each sibling: it builds, and the oracle passes every task."""
    settings = settings or RolloutSettings(limits=SCRIPTED_LIMITS)
    settings = replace(settings, limits=SCRIPTED_LIMITS, temperature=0.0)  # the oracle, with room for its text
    results = {s.id: Compliance(s.id) for s in siblings}
    harnesses: list[tuple[str, Harness]] = []
    for sibling in siblings:
        try:
            harnesses.append((sibling.id, build(sibling, settings.limits)))
        except (PatchError, ValueError, KeyError) as exc:
            results[sibling.id].problems.append(f"does not build: {exc}")
    by_sibling = run_grid(OraclePolicy(), harnesses, tasks, settings)
    for sibling_id, trajectories in by_sibling.items():
        result = results[sibling_id]
        result.oracle_tasks = len(trajectories)
        result.oracle_passed = sum(_complies(t) for t in trajectories)
        for t in trajectories:
            if not _complies(t):
                blocked = sum(1 for turn in t.turns for o in turn.outcomes if o.get("blocked"))
                why = f"{blocked} gold action(s) blocked by a guard rule" if blocked else f"status {t.status}"
                result.problems.append(f"the oracle fails task {t.task_id} ({why}{'; ' + t.error if t.error else ''})")
    return [results[s.id] for s in siblings]


def _complies(trajectory: Trajectory) -> bool:
    # A workspace task verifies even without a submit: compliance also needs the submit accepted.
    return trajectory.passed and trajectory.status == "submitted"
