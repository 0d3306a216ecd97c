"""Where a training step's rollouts come from, behind one interface: `HarnessSource` (the
run's harnesses through the rollout engine, with the task frontier and dynamic sampling of
`rl/sampling.py`) and `AgentSource` (an agent program against the served policy,
`rl/blackbox.py`). ``source.run(step)`` returns a `Rollouts` record; the harness source also
runs the extra jobs of rescue and its routing (``run_jobs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.pairing import Pair, PairingSchedule
from harnessrl.policy.base import WeightSyncedPolicy
from harnessrl.rl.blackbox import AgentRollouts
from harnessrl.rl.config import TrainConfig
from harnessrl.rl.distributed import DataParallel
from harnessrl.rl.sampling import StepSampler, combine_stats
from harnessrl.rl.schedules import rollout_seed
from harnessrl.rl.weight_version import stamp_weight_version
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.rollout.groups import GroupInfo, TaskInfo
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory

Mixture = Callable[[str, int], list[str]]
"""Returns the harness codes of a group's G rollouts (rescue: mixture) from its code and seed."""


@dataclass
class Rollouts:
    """One step's rollouts: the trajectories in group order, each one's group index, the
    groups' pairs (task, configuration) and bookkeeping, the rollout stats, and the source's
    own metrics (dynamic sampling's, or the agent runs')."""

    trajectories: list[Trajectory]
    groups: list[int]
    pairs: list[list[str]]
    group_infos: list[GroupInfo]
    stats: Any
    metrics: dict[str, Any] = field(default_factory=dict)


class RolloutSource(Protocol):
    def run(self, step: int) -> Rollouts: ...

    def close(self) -> None: ...


class HarnessSource:
    """G episodes per pair under the run's harnesses, through the rollout engine over the
    current policy (under torchrun each rank runs its share); the pairs are the sampler's."""

    def __init__(self, cfg: TrainConfig, policy: WeightSyncedPolicy, sampler: StepSampler,
                 tasks: dict[str, Task], limits: HarnessLimits, parallel: DataParallel | None) -> None:
        self.cfg, self.policy, self.sampler, self.tasks = cfg, policy, sampler, tasks
        self.limits, self.parallel = limits, parallel
        self.harnesses: dict[str, Harness] = {}
        self.mixture: Mixture | None = None  # set by rescue: mixture

    def harness(self, code: str) -> Harness:
        if code not in self.harnesses:
            self.harnesses[code] = Harness.named(code, self.limits)
        return self.harnesses[code]

    def run(self, step: int) -> Rollouts:
        # The frontier's round tasks and dynamic sampling's rounds (rl/sampling.py).
        result = self.sampler.run(step, lambda batch, round_: self.run_pairs(step, batch, round_))
        trajectories, groups = result.flat()
        return Rollouts(
            trajectories, groups, [[p.task, p.config.code] for p in result.pairs],
            [GroupInfo(g, TaskInfo.of(self.tasks[p.task]), p.config.code) for g, p in enumerate(result.pairs)],
            combine_stats(result.stats), result.metrics,
        )

    def run_pairs(self, step: int, pairs: Sequence[Pair], round_: int) -> tuple[list[list[Trajectory]], Any]:
        """Rolls out G episodes of each pair (sampling round ``round_`` of ``step``); returns
        them per pair and the engine's stats."""
        jobs: list[RolloutJob] = []
        seed = self.cfg.seed if round_ == 0 else self.cfg.seed * 7_919 + round_  # rounds > 0: seeds of their own
        size = self.cfg.group_size
        for group, pair in enumerate(pairs):
            code = pair.config.code
            members = [code] * size if self.mixture is None else self.mixture(code, rollout_seed(seed, step, group))
            for member, harness in enumerate(members):
                jobs.append(RolloutJob(self.tasks[pair.task], self.harness(harness),
                                       seed=rollout_seed(seed, step, group * size + member),
                                       tags={"group": group, "slot": pair.slot}))
        version, groups = self.policy.weight_version, [job.tags["group"] for job in jobs]
        trajectories, stats = self._run_sharded(jobs, groups)
        trajectories = stamp_weight_version(trajectories, self.policy, version)
        per_pair: list[list[Trajectory]] = [[] for _ in pairs]
        for trajectory, group in zip(trajectories, groups, strict=True):
            per_pair[group].append(trajectory)
        return per_pair, stats

    def run_jobs(self, jobs: list[RolloutJob]) -> list[Trajectory]:
        """Runs jobs under the training sampling; returns their trajectories in order."""
        version = self.policy.weight_version
        return stamp_weight_version(self._run_sharded(jobs, list(range(len(jobs))))[0], self.policy, version)

    def _run_sharded(self, jobs: list[RolloutJob], keys: list[int]) -> tuple[list[Trajectory], Any]:
        """Runs jobs (under torchrun: job i on rank ``keys[i] mod world size``, gathered on every
        rank); returns their trajectories in order and the rollout stats."""
        if self.parallel is None:
            return self.engine().run(jobs)
        owners = [key % self.parallel.world_size for key in keys]
        return self.parallel.run_sharded(self.engine().run, jobs, owners)

    def engine(self) -> RolloutEngine:
        """Returns a rollout engine over the current policy with the training sampling."""
        return self.cfg.rollout_settings(self.limits).engine(self.policy)

    def close(self) -> None:
        pass


class AgentSource:
    """G runs of an agent program per task of the schedule's pairs (black-box training): the
    agents talk to a server over the trainer's rollout policy, so the weight sync reaches it."""

    def __init__(self, cfg: TrainConfig, policy: WeightSyncedPolicy, agents: AgentRollouts,
                 schedule: PairingSchedule, tasks: dict[str, Task]) -> None:
        self.cfg, self.policy, self.agents, self.schedule, self.tasks = cfg, policy, agents, schedule, tasks

    def run(self, step: int) -> Rollouts:
        pairs, size = self.schedule.step(step), self.cfg.group_size
        tasks = [self.tasks[p.task] for p in pairs for _ in range(size)]
        infos = [GroupInfo(g, TaskInfo.of(self.tasks[p.task]), self.cfg.rollout_through) for g, p in enumerate(pairs)]
        version = self.policy.weight_version
        trajectories, stats = self.agents.run(tasks, first_run=step * len(tasks))
        trajectories = stamp_weight_version(trajectories, self.policy, version)
        return Rollouts(trajectories, [i // size for i in range(len(tasks))], [[p.task, p.config.code] for p in pairs],
                        infos, stats, stats.metrics())

    def close(self) -> None:
        self.agents.close()
