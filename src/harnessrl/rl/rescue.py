"""Harness-S in the trainer: each group's siblings, the router, paired validation, the rescue pass.

The loop per step (Harness-S Algorithm 1, online part), for ``rescue: siblings``:

    anchor:  at step 0 and every ``reanchor_every`` updates: freeze the policy, roll it out
             once per (harness, validation task) under every group harness and its siblings,
             and hand the outcomes to the router (``PairedValidation``); once more at the end
    rollout: G rollouts per (task, H0) pair, as in plain GRPO
    rescue:  every group that failed entirely -> the router picks K siblings of its H0 -> one
             rollout each from the task's initial state -> the rescue group replaces it
    update:  group-relative advantages over the (possibly rescued) groups, the clipped loss on
             policy tokens of each trajectory in its own context

``rescue: h0`` resamples a dead group K times under its own harness; ``mixture`` mixes
siblings into every group from the start (``mixture_harnesses``). A group's H0 is its own
configuration, so this composes with Harness Scaling's design and pairing: siblings are the
configuration's neighbours in the space (``siblings: space`` / ``space:R``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harnessrl.rescue.groups import (
    GroupInfo,
    RescueStats,
    apply_rescue,
    dead_groups,
    mixture_harnesses,
    plan_rescue,
)
from harnessrl.rescue.rank1 import paired_validation
from harnessrl.rescue.router import Evidence, Router
from harnessrl.rescue.routing import make_router
from harnessrl.rescue.sibling_source import SiblingSource
from harnessrl.rl.config import TrainConfig
from harnessrl.rl.schedules import select_tasks
from harnessrl.rollout.engine import RolloutJob
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory

RunJobs = Callable[[list[RolloutJob]], list[Trajectory]]
HarnessOf = Callable[[str], Any]  # name -> Harness


class Rescue:
    """The Harness-S part of a run: built from the config, stepped by the trainer, checkpointed."""

    def __init__(
        self,
        cfg: TrainConfig,
        group_harnesses: Sequence[str],
        validation_tasks: Sequence[Task],
        harness_of: HarnessOf,
        seed_of: Callable[[int, int], int],
        log: Callable[[str], None] = print,
        check_endpoints: bool = True,
    ) -> None:
        self.cfg = cfg
        self.group_harnesses = list(dict.fromkeys(group_harnesses))
        self.validation_tasks = list(validation_tasks)
        self.harness_of, self.seed_of, self.log = harness_of, seed_of, log
        self.source = SiblingSource.parse(cfg.siblings)
        self.pools = self.source.load_pools()
        self._siblings: dict[str, list[str]] = {}
        self.router: Router = make_router(
            cfg.router, seed=cfg.seed, track=self.group_harnesses, per_family=cfg.router_per_family,
            voters=cfg.profile_voters, writer=cfg.profile_writer, check_endpoints=check_endpoints,
        )
        self.last_anchor: int | None = None

    # -- siblings ------------------------------------------------------------------------------
    def siblings_of(self, h0: str) -> list[str]:
        """Returns the sibling names of a group harness: its neighbours in the space, the run's
        other training configurations (``design`` in the spec), and the members (``DIR#ID``) of
        every configured pool built on it."""
        if h0 not in self._siblings:
            self._siblings[h0] = self.source.siblings_of(h0, self.pools, self.group_harnesses)
        return self._siblings[h0]

    def mixture(self, h0: str, seed: int) -> list[str]:
        """Returns the harness of each rollout of a group under ``rescue: mixture``."""
        return mixture_harnesses(h0, self.siblings_of(h0), self.cfg.group_size, self.cfg.mixture_fraction, seed)

    # -- paired validation (anchoring) -----------------------------------------------------------
    @property
    def anchors(self) -> bool:
        """True when the router runs on paired validation evidence (sibling rescue with
        validation or profile routing)."""
        return self.router.anchored and self.cfg.rescue == "siblings"

    def needs_anchor(self, step: int) -> bool:
        """True when the router's evidence is due: before the first update, then every
        ``reanchor_every`` updates."""
        if not self.anchors:
            return False
        if self.last_anchor is None:
            return True
        every = self.cfg.reanchor_every
        return bool(every) and step >= self.last_anchor + every

    def validation_harnesses(self) -> list[str]:
        """Returns every harness the paired validation runs: the group harnesses and their siblings."""
        names = list(self.group_harnesses)
        for h0 in self.group_harnesses:
            names += self.siblings_of(h0)
        return list(dict.fromkeys(names))

    def anchor(self, step: int, run_jobs: RunJobs) -> dict[str, Any]:
        """Runs the paired validation with the current policy and re-anchors the router (its
        margins, or the profiles written from the paired runs); returns a summary."""
        names = self.validation_harnesses()
        self.log(f"rescue: paired validation at step {step}: {len(names)} harnesses x "
                 f"{len(self.validation_tasks)} tasks")
        runs: dict[str, dict[str, Trajectory]] = {}
        record = paired_validation(run_jobs, self.harness_of, names, self.validation_tasks,
                                   lambda i: self.seed_of(step, 10_000_000 + i), step=step, keep=runs)
        self.last_anchor = step
        success = {name: sum(o.values()) / len(o) for name, o in record.outcomes.items() if o}
        summary: dict[str, Any] = {"step": step, "episodes": len(names) * len(self.validation_tasks),
                                   "success": success}
        siblings = {h0: self.siblings_of(h0) for h0 in self.group_harnesses}
        summary.update(self.router.anchor(Evidence(record, runs, self.validation_tasks, siblings)))
        return summary

    # -- the rescue pass -----------------------------------------------------------------------
    def rescue(
        self, step: int, trajectories: list[Trajectory], groups: list[int], infos: Sequence[GroupInfo],
        run_jobs: RunJobs, task_of: Callable[[str], Task],
    ) -> tuple[list[Trajectory], list[int], dict[str, Any]]:
        """Replaces the step's dead groups by rescue groups (mode ``siblings`` or ``h0``);
        returns the new trajectories, their group keys, and the step's rescue metrics."""
        stats = RescueStats(groups=len(infos), base_rollouts=len(trajectories))
        dead_keys = set(dead_groups(trajectories, groups))
        dead = [info for info in infos if info.group in dead_keys]
        stats.dead = len(dead)
        mode = self.cfg.rescue if self.cfg.rescue in ("siblings", "h0") else "none"
        before = self.router.metrics()  # profile routing: this step's votes, and the garbage ones
        runs = plan_rescue(mode, dead, self.cfg.rescue_k, self.router, self.siblings_of, seed=self.cfg.seed + step)
        voted = {f"router_{key}": int(value - before[key]) for key, value in self.router.metrics().items()}
        if not runs:
            return trajectories, groups, {**stats.metrics(), **voted}
        jobs = [
            RolloutJob(task_of(info.task.task_id), self.harness_of(run.harness),
                       seed=self.seed_of(step, len(trajectories) + i), tags={"group": run.group, "rescue": run.harness})
            for i, (run, info) in enumerate((r, next(x for x in dead if x.group == r.group)) for r in runs)
        ]
        rescued = run_jobs(jobs)
        new_trajectories, new_groups = apply_rescue(trajectories, groups, runs, rescued, stats)
        return new_trajectories, new_groups, {**stats.metrics(), **voted}

    # -- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"router": self.router.state_dict(), "last_anchor": self.last_anchor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.router.load_state_dict(state.get("router", {}))
        self.last_anchor = state.get("last_anchor")


def validation_tasks(cfg: TrainConfig, train_tasks: Sequence[Task], log: Callable[[str], None]) -> list[Task]:
    """Returns the paired validation tasks of rescue routing: train-split tasks the run does
    not train on (its training tasks when the split has no others)."""
    wanted = cfg.rescue_validation_tasks
    training = {t.id for t in train_tasks}
    pool = select_tasks(cfg, cfg.train_split, len(train_tasks) + wanted)
    apart = [t for t in pool if t.id not in training][:wanted]
    if len(apart) < wanted:
        log(f"rescue: only {len(apart)} train tasks outside training; validating on training tasks too")
        apart += [t for t in train_tasks if t not in apart][: wanted - len(apart)]
    return apart
