"""The training loop: one run's steps as its data flow, and the run around them.

    for step t:
        rollouts = source.run(t)                        # rl/sources.py: harness jobs (pairs from
                                                        #   rl/sampling.py: K-pairing, frontier,
                                                        #   dynamic sampling) or agent programs
        rollouts = rescue(t, rollouts)                  # rl/rescue.py: dead groups (rescue != none)
        samples  = ALGORITHMS[algorithm](rollouts)      # rl/algorithms.py: grpo, ppo, sft
        metrics  = actor.update(samples)                # rl/actor.py: update_step + weight sync
        log, checkpoint (atomic), evaluate every N steps

Before step 0 the untrained policy is evaluated (for the summary) and, optionally, warm
started by SFT on oracle demonstrations rendered under the training harnesses (rl/sft.py).
After the last step the optimizer and any master copy are released, the final evaluation
runs, and its record goes into the last checkpoint's trainer state alone.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.design import Design, HeldOut, make_design
from harnessrl.diskio import append_text, is_disk_full, write_text_atomic
from harnessrl.harness.harness import HarnessLimits
from harnessrl.harness.registry import default_space
from harnessrl.memory import limit_malloc_arenas, peak_rss_mb, rss_mb
from harnessrl.pairing import PairingSchedule
from harnessrl.progress import Progress
from harnessrl.rl.actor import Actor
from harnessrl.rl.advantages import no_signal_fraction
from harnessrl.rl.algorithms import algorithm_of, group_advantages
from harnessrl.rl.blackbox import AgentRollouts, rollout_cost
from harnessrl.rl.checkpoint import disk_full_error, prepare_run_dir, restate_checkpoint
from harnessrl.rl.config import TrainConfig
from harnessrl.rl.distributed import DataParallel
from harnessrl.rl.evaluation import eval_sets, evaluate_run
from harnessrl.rl.frontier import FrontierSettings
from harnessrl.rl.rescue import Rescue, validation_tasks
from harnessrl.rl.sampling import StepSampler
from harnessrl.rl.schedules import rollout_seed, seed_everything, select_tasks
from harnessrl.rl.sft import warm_start
from harnessrl.rl.sources import AgentSource, HarnessSource, Rollouts
from harnessrl.rl.summary import format_summary, run_summary
from harnessrl.rl.tracking import Tracker
from harnessrl.rl.weight_version import check_current
from harnessrl.rollout.groups import signal_metrics
from harnessrl.sandbox.workspace import remove_stale_workspaces
from harnessrl.trajectory import save_jsonl

Logger = Callable[[str], None]


class Trainer:
    """Owns the policy, optimizer and run directory of one training run."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, log: Logger = print) -> None:
        limit_malloc_arenas()  # bounded host memory without MALLOC_ARENA_MAX (harnessrl.memory)
        self.sitting_started = time.monotonic()
        # Under torchrun every rank trains; rank 0 alone logs and writes (rl.distributed).
        self.parallel = DataParallel.from_env()
        self.main = self.parallel is None or self.parallel.is_main
        self.cfg, self.log = cfg, (log if self.main else lambda message: None)
        log = self.log
        self.run_dir = Path(cfg.run_dir)
        checkpoint = prepare_run_dir(self.run_dir, resume, cfg.model_dump_json(indent=2), self.parallel, log)
        if self.main and (removed := remove_stale_workspaces()):
            log(f"removed {removed} episode workspace(s) a killed run left behind")
        seed_everything(cfg.seed)

        # A resumed run's model (or LoRA adapter), optimizer and schedule come from its checkpoint.
        self.actor = Actor(cfg, checkpoint, self.parallel, self.run_dir / "sync", log)
        self.policy = self.actor.policy
        self.state: dict[str, Any] = {"step": 0}
        self.wall_time_before = 0.0  # of the sittings before this one (trainer state "wall_time_s")
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if checkpoint is not None:
            self.state = self.actor.load_training_state()
            self.wall_time_before = float(self.state.get("wall_time_s", 0.0))
            self._drop_metrics_from(int(self.state["step"]))
            self.log(f"resumed from {checkpoint} (step {self.state['step']})")
        self.tracker = Tracker(self.run_dir, cfg.report_to, cfg.model_dump(), self.log)

        space = default_space()
        self.design = make_design(space, cfg.design, n=cfg.design_n, seed=cfg.seed, base=cfg.base_harness)
        self.held_out = held_out_configs(cfg, self.design)
        context = min(cfg.context_tokens, getattr(self.policy, "context_length", None) or cfg.context_tokens)  # a server's
        self.limits = HarnessLimits(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens, context_tokens=context,
                                    fixed_wall_time=cfg.deterministic)
        self.train_tasks = select_tasks(cfg, cfg.train_split, cfg.max_train_tasks)
        self.eval_tasks = select_tasks(cfg, cfg.eval_split, cfg.eval_tasks)
        self.task_by_id = {t.id: t for t in self.train_tasks}
        self.schedule = PairingSchedule(
            [t.id for t in self.train_tasks], self.design.configs, cfg.tasks_per_step, cfg.k, cfg.pairing, cfg.seed
        )
        frontier = FrontierSettings.from_config(cfg) if cfg.frontier else None
        self.sampler = StepSampler(self.schedule, seed=cfg.seed, frontier=frontier,
                                   max_rounds=cfg.dynamic_sampling_rounds)
        if "sampler" in self.state:
            self.sampler.load_state_dict(self.state["sampler"])
        self.source: HarnessSource | AgentSource = HarnessSource(
            cfg, self.policy, self.sampler, self.task_by_id, self.limits, self.parallel)
        self.harness_source = self.source
        self.rescue: Rescue | None = None
        if cfg.rescue != "none":
            self.rescue = Rescue(
                cfg, self.design.codes, validation_tasks(cfg, self.train_tasks, log), self.harness_source.harness,
                lambda step, index: rollout_seed(cfg.seed, step, index), log=log,
            )
            if "rescue" in self.state:
                self.rescue.load_state_dict(self.state["rescue"])
            if cfg.rescue == "mixture":
                self.harness_source.mixture = self.rescue.mixture
        # Black-box: served in-process, so the trainer's weight sync reaches the agents' server.
        agents = AgentRollouts.of(cfg, self.policy, self.train_tasks, log)
        if agents is not None:
            self.source = AgentSource(cfg, self.policy, agents, self.schedule, self.task_by_id)

    def close(self) -> None:
        """Stops the rollout source's servers (black-box agents); the policy stays usable."""
        self.source.close()

    def release_training_state(self) -> None:
        """Drops the optimizer state and any master copy of the weights (``Actor.release_training_state``):
        ``run`` does before its final evaluation; the trainer cannot step or save after it."""
        self.actor.release_training_state()

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self, label: str) -> dict[str, Any]:
        """Returns Pass@1 per evaluation set (``rl.evaluation``; on rank 0 under torchrun); then
        drops what its prompts cached, which the next optimizer step would otherwise hold."""
        def run() -> dict[str, Any]:
            out = evaluate_run(self.policy, self.cfg, eval_sets(self.cfg, self.held_out), self.eval_tasks,
                               self.limits, self.design, self.run_dir / "eval" / f"{label}.jsonl", self.log)
            if out:
                self.tracker.log_eval(label, out, int(self.state.get("step", 0)))
            self.actor.release_rollout_memory()
            return out

        return self.parallel.on_main(run) if self.parallel is not None else run()

    # -- one RL step --------------------------------------------------------------------------
    def rollouts(self, step: int) -> Rollouts:
        """The step's rollouts from the run's source, with rescue's re-anchoring and dead-group
        rescue applied (``rl/rescue.py``)."""
        extra: dict[str, Any] = {}
        if self.rescue is not None and self.rescue.needs_anchor(step):
            extra["rescue_anchor"] = self.rescue.anchor(step, self.harness_source.run_jobs)
        rollouts = self.source.run(step)
        if self.rescue is not None:
            rollouts.trajectories, rollouts.groups, rescue_metrics = self.rescue.rescue(
                step, rollouts.trajectories, rollouts.groups, rollouts.group_infos, self.harness_source.run_jobs,
                self.task_by_id.__getitem__,
            )
            extra.update({f"rescue/{k}": v for k, v in rescue_metrics.items()})
        rollouts.metrics.update(extra)
        return rollouts

    def rl_step(self, step: int) -> dict[str, Any]:
        """One step as its data flow: rollouts (rescued), samples of the run's algorithm, the
        actor's update and weight sync; returns the step's metrics record."""
        t0 = time.perf_counter()
        rollouts = self.rollouts(step)
        trajectories, groups = rollouts.trajectories, rollouts.groups
        check_current(trajectories, self.policy)
        rewards = [t.reward for t in trajectories]
        samples = algorithm_of(self.cfg)(trajectories, rewards, groups, self.cfg, self.actor)
        t1 = time.perf_counter()
        update = self.actor.update(samples, seed=rollout_seed(self.cfg.seed, step, 0))
        if self.main:
            save_jsonl(trajectories, self.run_dir / "rollouts" / f"step-{step:06d}.jsonl")
        return {
            "step": step,
            "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
            "pass_rate": float(np.mean([t.passed for t in trajectories])) if trajectories else 0.0,
            "no_signal_fraction": no_signal_fraction(rewards, groups),
            **signal_metrics(trajectories, groups, group_advantages(rewards, groups, self.cfg)),
            "episodes": len(trajectories),
            "errored": rollouts.stats.errored,
            "trained_samples": len(samples),
            "trained_tokens": sum(sum(s.loss_mask) for s in samples),
            "format_errors": sum(t.metrics.get("format_errors", 0) for t in trajectories),
            "pairs": rollouts.pairs,
            "lr": self.actor.scheduler.get_last_lr()[0],
            "rollout_time_s": round(t1 - t0, 2),
            "update_time_s": round(time.perf_counter() - t1, 2),
            **rollout_cost(trajectories),
            "tokens_generated": rollouts.stats.tokens_generated,
            **{f"update/{k}": v for k, v in update.items()},
            **rollouts.metrics,
            # After the step's buffers went back to the system (the weight sync): flat across steps.
            "memory/rss_mb": round(rss_mb(), 1),
            "memory/peak_rss_mb": round(peak_rss_mb(), 1),
        }

    # -- the run ---------------------------------------------------------------------------------
    def warm_start(self) -> dict[str, Any]:
        """SFT on oracle demonstrations under the training harnesses (``rl.sft.warm_start``)."""
        return warm_start(self.actor, self.cfg, self.train_tasks, [c.code for c in self.design.configs], self.log)

    def _drop_metrics_from(self, step: int) -> None:
        """Forgets metrics of steps at or after ``step`` (they are redone after a resume)."""
        if not self.main or not self.metrics_path.exists():
            return
        kept = [
            line for line in self.metrics_path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", -1) < step
        ]
        write_text_atomic(self.metrics_path, "".join(f"{line}\n" for line in kept))

    def write_metrics(self, record: dict[str, Any]) -> None:
        if not self.main:
            return
        append_text(self.metrics_path, json.dumps(record) + "\n")  # a whole line or none
        self.tracker.log_step(record)

    def checkpoint(self, step: int, *, state_only: bool = False) -> None:
        """Saves checkpoint ``step``; ``state_only`` rewrites only the trainer state of the
        placed one (``rl.checkpoint.restate_checkpoint``: no model or optimizer needed)."""
        if self.rescue is not None:
            self.state["rescue"] = self.rescue.state_dict()
        if self.cfg.frontier or self.cfg.dynamic_sampling_rounds:
            self.state["sampler"] = self.sampler.state_dict()
        # The run's wall time over every sitting so far (a resumed run adds this sitting's).
        self.state["wall_time_s"] = round(self.wall_time_before + time.monotonic() - self.sitting_started, 1)
        if not state_only:
            self.actor.save(self.run_dir, step, self.state, self.main)
        elif self.main:
            restate_checkpoint(self.run_dir, step, self.state)
        if self.parallel is not None:
            self.parallel.barrier()

    def run(self) -> dict[str, Any]:
        """Trains, evaluates and reports; returns the summary. A full disk ends it with a
        `DiskFull` that names the run folder and the checkpoint a rerun resumes from."""
        try:
            return self._run()
        except Exception as exc:
            if is_disk_full(exc):
                raise disk_full_error(self.run_dir, exc, getattr(getattr(self, "actor", None), "model", None)) from exc
            raise

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        start = int(self.state.get("step", 0))
        if start == 0 and "base_eval" not in self.state:
            if cfg.eval_base:
                self.state["base_eval"] = self.evaluate("base")
            if cfg.sft_warm_start_steps:
                self.state["warm_start"] = self.warm_start()
            self.state["step"] = 0
            self.checkpoint(0)
        for step in Progress.over(range(start, cfg.steps), "train", "step"):
            record = self.rl_step(step)
            self.log(
                f"step {step + 1}/{cfg.steps}: reward {record['reward_mean']:.3f} no-signal "
                f"{record['no_signal_fraction']:.2f} samples {record['trained_samples']} "
                f"optimizer steps {record.get('update/optimizer_steps', 0):.0f} clipped "
                f"{record.get('update/clipfrac_low', 0.0):.3f}/{record.get('update/clipfrac_high', 0.0):.3f} "
                f"approx_kl {record.get('update/approx_kl', 0.0):.2e} "
                f"({record['rollout_time_s']}s rollout, {record['update_time_s']}s update)"
            )
            self.state["step"] = step + 1
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                record["eval"] = self.evaluate(f"step-{step + 1:06d}")
            self.write_metrics(record)
            if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
                self.checkpoint(step + 1)
        if self.rescue is not None and self.rescue.anchors and self.state.get("final_anchor_step") != cfg.steps:
            # Once more after training: the final policy's routing evidence (and its margins).
            self.state["final_anchor"] = self.rescue.anchor(cfg.steps, self.harness_source.run_jobs)
            self.state["final_anchor_step"] = cfg.steps
            self.checkpoint(cfg.steps)
        self.close()
        # No step or full save is left: the final evaluation runs without the optimizer's
        # moments and the master copy (the run's peak memory otherwise), and its record goes
        # into the last checkpoint's trainer state alone.
        self.release_training_state()
        final = self.state.get("final_eval")
        if final is None or self.state.get("final_eval_step") != cfg.steps:
            final = self.evaluate("final")
            self.state.update({"final_eval": final, "final_eval_step": cfg.steps})
            self.checkpoint(cfg.steps, state_only=True)
        summary = self.summary()
        if not self.main:
            return summary
        write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        write_text_atomic(self.run_dir / "summary.md", format_summary(summary))
        self.write_report()
        self.tracker.close()
        return summary

    def write_report(self) -> None:
        """Writes report/ (HTML + Markdown); a failure is logged, never raised: the run is saved."""
        from harnessrl.eval.report import write_run_report

        try:
            self.log(f"report: {write_run_report(self.run_dir)}")
        except Exception as exc:  # the checkpoints and summary are already on disk
            self.log(f"report failed ({type(exc).__name__}: {exc}); rebuild it with `harnessrl report {self.run_dir}`")

    def summary(self) -> dict[str, Any]:
        """Returns the run's summary: base vs trained Pass@1 per evaluation set (``rl.summary``)."""
        return run_summary(self.state, run_dir=str(self.run_dir), steps=self.cfg.steps, design=self.design.kind,
                           algorithm=self.cfg.algorithm, train_configs=self.design.codes, precision=self.actor.precision,
                           held_out=[c.code for c in self.held_out.configs], eval_tasks=[t.id for t in self.eval_tasks])


def held_out_configs(cfg: TrainConfig, design: Design) -> HeldOut:
    """Returns the held-out configurations a run evaluates (its learning curve's, in an experiment):
    ``eval_held_out`` drawn from the complement of the training ``design``, or of ``eval_design``
    (around ``eval_base_harness`` as H0) where those name another, so that arms trained on
    different designs share them."""
    kind = cfg.eval_design or cfg.design
    base = cfg.eval_base_harness or cfg.base_harness
    if (kind, base) != (cfg.design, cfg.base_harness):
        design = make_design(default_space(), kind, n=cfg.design_n, seed=cfg.seed, base=base)
    return design.held_out(cfg.eval_held_out, seed=cfg.seed)


def train(cfg: TrainConfig, resume: bool = False, log: Logger = print) -> dict[str, Any]:
    """Runs (or resumes) a training run and returns its summary."""
    trainer = Trainer(cfg, resume=resume, log=log)
    try:
        return trainer.run()
    finally:
        if trainer.parallel is not None:  # ranks meet before closing only after a run that ended well
            trainer.parallel.close(ok=sys.exc_info()[0] is None)
