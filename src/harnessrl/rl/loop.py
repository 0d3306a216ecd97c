"""The harness-scaling training loop: design -> pairing -> rollouts -> advantages -> update.

    for step t:
        pairs   = schedule.step(t)                      # (task, config) pairs, K-pairing
        rollout = G episodes per pair                   # a GRPO group = one task under one config
        A       = group-relative advantages             # zero for groups without signal
        update  = clipped surrogate on policy tokens    # ppo_epochs x mini_batches optimizer steps
        log, checkpoint (atomic), evaluate every N steps

Before step 0 the untrained policy is evaluated (for the summary) and, optionally, warm
started by SFT on oracle demonstrations rendered under the training harnesses.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harnessrl.design import make_design
from harnessrl.diskio import append_text, is_disk_full, write_text_atomic
from harnessrl.eval.behaviour import rates
from harnessrl.eval.evaluate import EvalResult, evaluate
from harnessrl.eval.sets import EvalTarget
from harnessrl.harness.harness import Harness, HarnessLimits, out_of_space_names
from harnessrl.harness.registry import default_space
from harnessrl.memory import limit_malloc_arenas, peak_rss_mb, release_freed_memory, rss_mb
from harnessrl.pairing import Pair, PairingSchedule
from harnessrl.policy.base import SamplingParams
from harnessrl.progress import Progress
from harnessrl.rescue.groups import GroupInfo, signal_metrics
from harnessrl.rescue.router import TaskInfo
from harnessrl.rl.advantages import grpo_advantages, no_signal_fraction, rloo_advantages
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.blackbox import AgentRollouts, rollout_cost
from harnessrl.rl.checkpoint import (
    disk_full_error,
    latest_checkpoint,
    load_training_state,
    recover_checkpoints,
    save_checkpoint,
)
from harnessrl.rl.config import TrainConfig
from harnessrl.rl.distributed import DataParallel
from harnessrl.rl.frontier import FrontierSettings
from harnessrl.rl.objectives import UpdateSettings
from harnessrl.rl.ppo import ppo_samples
from harnessrl.rl.rescue import Rescue
from harnessrl.rl.sampling import StepSampler, combine_stats
from harnessrl.rl.schedules import (
    lr_lambda,
    rollout_seed,
    schedule,
    seed_everything,
    select_tasks,
    sft_order,
)
from harnessrl.rl.sft import oracle_demonstrations, sft_samples
from harnessrl.rl.summary import format_summary, run_summary
from harnessrl.rl.tracking import Tracker
from harnessrl.rl.update import update_step
from harnessrl.rl.weight_version import check_current, stamp_weight_version
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.sandbox.workspace import remove_stale_workspaces
from harnessrl.tasks.model import Task
from harnessrl.trajectory import save_jsonl

Logger = Callable[[str], None]


class Trainer:
    """Owns the policy, optimizer and run directory of one training run."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, log: Logger = print) -> None:
        limit_malloc_arenas()  # bounded host memory without MALLOC_ARENA_MAX (harnessrl.memory)
        # Under torchrun every rank trains; rank 0 alone logs and writes (rl.distributed).
        self.parallel = DataParallel.from_env()
        self.main = self.parallel is None or self.parallel.is_main
        self.cfg, self.log = cfg, (log if self.main else lambda message: None)
        log = self.log
        self.run_dir = Path(cfg.run_dir)
        if resume:  # this trainer is the run's only writer: repair what a kill mid-save left
            for message in recover_checkpoints(self.run_dir):
                log(f"checkpoints: {message}")
        checkpoint = latest_checkpoint(self.run_dir)
        if resume and checkpoint is None and self.run_dir.exists():
            log(f"no complete checkpoint in {self.run_dir}: starting from step 0")
        if not resume and self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise ValueError(
                f"run directory {self.run_dir} is not empty; pass --resume to continue it or --run-dir for a new run"
            )
        if self.parallel is not None:
            self.parallel.barrier()  # every rank has looked at the directory before rank 0 fills it
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.main:
            write_text_atomic(self.run_dir / "config.json", cfg.model_dump_json(indent=2))
            if removed := remove_stale_workspaces():
                log(f"removed {removed} episode workspace(s) a killed run left behind")
        seed_everything(cfg.seed)

        from harnessrl.policy import make_training_policy
        from harnessrl.policy.device import resolve_device, resolve_dtype, resolve_rollout_dtype
        from harnessrl.policy.embedded import resolve_model_path
        from harnessrl.policy.hf import HFPolicy

        resuming = resume and checkpoint is not None
        # Several processes shard full fine-tuning with FSDP2 and replicate LoRA (rl.distributed).
        shard = self.parallel is not None and not cfg.lora_rank
        if shard and cfg.policy_server is not None:
            raise ValueError("full fine-tuning on several processes shards the model (FSDP2) and rolls out in "
                             "process: drop policy_server, train LoRA (lora_rank > 0), or run one process")
        # A LoRA checkpoint holds only the adapter: the base model comes from the config.
        model_source = str(checkpoint / "model") if (resuming and not cfg.lora_rank) else cfg.model
        device = resolve_device(cfg.device)
        # Full fine-tuning keeps float32 master weights (the optimizer's) and samples from a
        # copy in the rollout dtype, synced after every optimizer step; the update's forward
        # and backward run under autocast in that dtype. bfloat16 master weights would round
        # away updates of lr ~1e-6. LoRA trains float32 adapters on the shared base model.
        # A float32 (or LoRA) rollout model in this process is trained in place, no copy; a
        # sharded model cannot sample, so FSDP2 always trains a copy of its own.
        rollout_dtype = resolve_dtype(cfg.dtype, device) if cfg.lora_rank else resolve_rollout_dtype(cfg.dtype, device)
        self.policy = make_training_policy(model_source, cfg.device, rollout_dtype, server=cfg.policy_server,
                                           server_model=cfg.policy_server_model, weights_dir=self.run_dir / "sync")
        self.model = self.policy.local_model()
        self.autocast_dtype: torch.dtype | None = None  # update_step's default: bf16 on CUDA only
        if self.model is None or (not cfg.lora_rank and (rollout_dtype != torch.float32 or shard)):
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(
                resolve_model_path(model_source), dtype=torch.float32, local_files_only=True
            ).to(device)
            if rollout_dtype != torch.float32:
                self.autocast_dtype = rollout_dtype
        self.precision = {
            "rollout": str(rollout_dtype).removeprefix("torch."),
            "master": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "autocast": str(self.autocast_dtype or (torch.bfloat16 if device.type == "cuda" else "off")).removeprefix("torch."),
        }
        log(f"precision: rollout {self.precision['rollout']}, master weights {self.precision['master']}, "
            f"update autocast {self.precision['autocast']}")
        if cfg.lora_rank:
            self.model = self._wrap_lora(self.model, checkpoint / "model" if resuming else None)
            self.policy.sync_weights(self.model)  # samples through the adapters; drops the bare model's KV
        elif cfg.policy_server is not None:
            self.policy.sync_weights(self.model)  # the server samples from the weights trained here (or resumed)
        if self.parallel is not None:
            if shard:
                self.parallel.shard_model(self.model)  # before the optimizer: it steps the shards
            log(f"data parallel: {self.parallel.world_size} processes, "
                f"{'model sharded by FSDP2' if shard else 'LoRA adapters replicated'}")
        # The KL reference is the model the run started from, also after a resume.
        self.ref_model: torch.nn.Module | None = None
        if cfg.kl_coef > 0:
            self.ref_model = HFPolicy(cfg.model, device=cfg.device, dtype=cfg.dtype).model.eval()
            for parameter in self.ref_model.parameters():
                parameter.requires_grad_(False)
        self.value_head: torch.nn.Module | None = None
        if cfg.algorithm == "ppo":
            # The critic shares the policy's trunk: a linear value head on the last hidden state.
            hidden = int(self.model.config.hidden_size)
            self.value_head = torch.nn.Linear(hidden, 1).to(next(self.model.parameters()).device)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            if resume and checkpoint is not None and (checkpoint / "value_head.pt").exists():
                self.value_head.load_state_dict(torch.load(checkpoint / "value_head.pt", map_location="cpu"))
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            trainable += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg, cfg.steps))
        self.state: dict[str, Any] = {"step": 0}
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if resume and checkpoint is not None:
            shard_state = (lambda full: self.parallel.shard_optimizer_state(self.optimizer, full)) if shard else None
            self.state = load_training_state(checkpoint, self.optimizer, self.scheduler, shard_state)
            self._drop_metrics_from(int(self.state["step"]))
            self.log(f"resumed from {checkpoint} (step {self.state['step']})")
        self.tracker = Tracker(self.run_dir, cfg.report_to, cfg.model_dump(), self.log)

        space = default_space()
        self.design = make_design(space, cfg.design, n=cfg.design_n, seed=cfg.seed, base=cfg.base_harness)
        self.held_out = self.design.held_out(cfg.eval_held_out, seed=cfg.seed)
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
        self.harnesses: dict[str, Harness] = {}
        self._pairs: list[list[str]] = []
        self._groups: list[GroupInfo] = []
        self._sampling: dict[str, Any] = {}
        self.rescue: Rescue | None = None
        # Black-box: served in-process, so the trainer's weight sync reaches the agents' server.
        self.agent_rollouts = AgentRollouts.of(cfg, self.policy, self.train_tasks, log)
        if cfg.rescue != "none":
            self.rescue = Rescue(
                cfg, self.design.codes, self.validation_tasks(), self.harness,
                lambda step, index: rollout_seed(cfg.seed, step, index), log=log,
            )
            if "rescue" in self.state:
                self.rescue.load_state_dict(self.state["rescue"])

    def validation_tasks(self) -> list[Task]:
        """Returns the paired validation tasks of rescue routing: train-split tasks the run does
        not train on (its training tasks when the split has no others)."""
        wanted = self.cfg.rescue_validation_tasks
        pool = select_tasks(self.cfg, self.cfg.train_split, len(self.train_tasks) + wanted)
        apart = [t for t in pool if t.id not in self.task_by_id][:wanted]
        if len(apart) < wanted:
            self.log(f"rescue: only {len(apart)} train tasks outside training; validating on training tasks too")
            apart += [t for t in self.train_tasks if t not in apart][: wanted - len(apart)]
        return apart

    def sync_rollout_weights(self) -> None:
        """Gives the rollout policy the trained weights (copied in when the master weights are a
        model of their own; gathered when sharded) and drops its prefix KV cache: call it after
        every optimizer step."""
        if self.parallel is not None and self.parallel.sharded:
            self.parallel.sync_sampling_copy(self.model, self.policy)
        else:
            self.policy.sync_weights(self.model)
        release_freed_memory()  # the step's activations, kept by the C allocator otherwise

    def close(self) -> None:
        """Stops the agent server of black-box rollouts (if any); the policy stays usable."""
        if self.agent_rollouts is not None:
            self.agent_rollouts.close()

    def _wrap_lora(self, model: Any, adapter_dir: Path | None) -> Any:
        try:
            from peft import LoraConfig, PeftModel, get_peft_model
        except ImportError:
            raise ValueError("lora_rank > 0 needs peft: pip install 'harnessrl[lora]'") from None
        if adapter_dir is not None:
            return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
        config = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, target_modules="all-linear")
        return get_peft_model(model, config)

    def harness(self, code: str) -> Harness:
        if code not in self.harnesses:
            self.harnesses[code] = Harness.named(code, self.limits)
        return self.harnesses[code]

    # -- evaluation -------------------------------------------------------------------------
    def eval_sets(self) -> dict[str, list[str]]:
        sets = {"in_space": [c.code for c in self.held_out.configs]}
        if self.cfg.eval_out_of_space:
            sets["out_of_space"] = out_of_space_names()
        return sets

    def evaluate(self, label: str) -> dict[str, Any]:
        """Returns Pass@1 per evaluation set; all sets run as one batch of episodes (on rank 0)."""
        if self.parallel is not None:
            return self.parallel.on_main(lambda: self._evaluate(label))
        return self._evaluate(label)

    def _evaluate(self, label: str) -> dict[str, Any]:
        sets = {name: codes for name, codes in self.eval_sets().items() if codes}
        if not sets:
            return {}
        targets = [EvalTarget(code, name) for name, codes in sets.items() for code in codes]
        result: EvalResult = evaluate(
            self.policy, targets, self.eval_tasks, k=1,
            limits=self.limits, temperature=self.cfg.eval_temperature, max_new_tokens=self.cfg.max_new_tokens,
            seed=self.cfg.seed, max_concurrent=self.cfg.max_concurrent, env_workers=self.cfg.env_workers,
            backend=self.cfg.sandbox_backend, progress=True, design=self.design, deterministic=self.cfg.deterministic,
        )
        save_jsonl(result.trajectories, self.run_dir / "eval" / f"{label}.jsonl")
        out: dict[str, Any] = {}
        for name, codes in sets.items():
            scores = result.per_group[name]
            out[name] = {
                **{key: scores[key] for key in ("pass_at_1", "pass_at_1_ci", "episodes", "format_error_rate")},
                "per_config": {c: result.per_config[c]["pass_at_1"] for c in codes if c in result.per_config},
                "behaviour": rates(result.behaviour["per_group"][name]),
            }
            self.log(f"eval[{label}] {name}: Pass@1 {out[name]['pass_at_1']:.3f} over {scores['episodes']} episodes")
        self.tracker.log_eval(label, out, int(self.state.get("step", 0)))
        return out

    # -- one RL step --------------------------------------------------------------------------
    def rollouts(self, step: int) -> tuple[list[Any], list[int], Any]:
        pairs = self.schedule.step(step)
        if self.agent_rollouts is not None:  # black-box: G agent runs per task (rl/blackbox.py)
            self._pairs = [[p.task, p.config.code] for p in pairs]
            tasks = [self.task_by_id[p.task] for p in pairs for _ in range(self.cfg.group_size)]
            self._groups = [GroupInfo(g, TaskInfo.of(self.task_by_id[p.task]), self.cfg.rollout_through)
                            for g, p in enumerate(pairs)]
            version = self.policy.weight_version
            trajectories, agent_stats = self.agent_rollouts.run(tasks, first_run=step * len(tasks))
            trajectories = stamp_weight_version(trajectories, self.policy, version)
            return trajectories, [i // self.cfg.group_size for i in range(len(tasks))], agent_stats
        # The frontier's round tasks and dynamic sampling's rounds (rl/sampling.py).
        result = self.sampler.run(step, lambda batch, round_: self.run_pairs(step, batch, round_))
        self._pairs = [[p.task, p.config.code] for p in result.pairs]
        self._groups = [GroupInfo(g, TaskInfo.of(self.task_by_id[p.task]), p.config.code)
                        for g, p in enumerate(result.pairs)]
        self._sampling = result.metrics
        trajectories, groups = result.flat()
        return trajectories, groups, combine_stats(result.stats)

    def run_pairs(self, step: int, pairs: Sequence[Pair], round_: int) -> tuple[list[list[Any]], Any]:
        """Rolls out G episodes of each pair (sampling round ``round_`` of ``step``); returns
        them per pair and the engine's stats."""
        jobs: list[RolloutJob] = []
        seed = self.cfg.seed if round_ == 0 else self.cfg.seed * 7_919 + round_  # rounds > 0: seeds of their own
        for group, pair in enumerate(pairs):
            code = pair.config.code
            members = [code] * self.cfg.group_size
            if self.rescue is not None and self.cfg.rescue == "mixture":
                members = self.rescue.mixture(code, seed=rollout_seed(seed, step, group))
            for member, harness in enumerate(members):
                index = group * self.cfg.group_size + member
                jobs.append(
                    RolloutJob(
                        self.task_by_id[pair.task], self.harness(harness),
                        seed=rollout_seed(seed, step, index),
                        tags={"group": group, "slot": pair.slot},
                    )
                )
        version, groups = self.policy.weight_version, [job.tags["group"] for job in jobs]
        trajectories, stats = self.run_sharded(jobs, groups)
        trajectories = stamp_weight_version(trajectories, self.policy, version)
        per_pair: list[list[Any]] = [[] for _ in pairs]
        for trajectory, group in zip(trajectories, groups, strict=True):
            per_pair[group].append(trajectory)
        return per_pair, stats

    def run_sharded(self, jobs: list[RolloutJob], keys: list[int]) -> tuple[list[Any], Any]:
        """Runs jobs (under torchrun: job i on rank ``keys[i] mod world size``, gathered on every
        rank); returns their trajectories in order and the rollout stats."""
        if self.parallel is None:
            return self.engine().run(jobs)
        owners = [key % self.parallel.world_size for key in keys]
        return self.parallel.run_sharded(self.engine().run, jobs, owners)

    def engine(self) -> RolloutEngine:
        """Returns a rollout engine over the current policy with the training sampling."""
        return RolloutEngine(
            self.policy, max_concurrent=self.cfg.max_concurrent, env_workers=self.cfg.env_workers,
            sampling=SamplingParams(temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                    max_new_tokens=self.cfg.max_new_tokens),
            backend=self.cfg.sandbox_backend, progress=True, deterministic=self.cfg.deterministic,
        )

    def run_jobs(self, jobs: list[RolloutJob]) -> list[Any]:
        """Runs jobs under the training sampling; returns their trajectories in order."""
        version = self.policy.weight_version
        return stamp_weight_version(self.run_sharded(jobs, list(range(len(jobs))))[0], self.policy, version)

    def rl_step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        if self.rescue is not None and self.rescue.needs_anchor(step):
            extra["rescue_anchor"] = self.rescue.anchor(step, self.run_jobs)
        trajectories, groups, stats = self.rollouts(step)
        if self.rescue is not None:
            trajectories, groups, rescue_metrics = self.rescue.rescue(
                step, trajectories, groups, self._groups, self.run_jobs, self.task_by_id.__getitem__
            )
            extra.update({f"rescue/{k}": v for k, v in rescue_metrics.items()})
        check_current(trajectories, self.policy)
        rewards = [t.reward for t in trajectories]
        if self.cfg.objective == "sft":  # behaviour cloning on the step's successful runs
            samples = sft_samples([t for t in trajectories if t.passed])
        elif self.cfg.algorithm == "ppo":
            samples = self.ppo_samples(trajectories)
        else:
            samples = self.grpo_samples(trajectories, rewards, groups)
        t1 = time.perf_counter()
        update = update_step(
            self.model, self.optimizer, samples, self.policy.tokenizer.pad_token_id,
            UpdateSettings.from_config(self.cfg, self.autocast_dtype),
            ref_model=self.ref_model, value_head=self.value_head, scheduler=self.scheduler,
            seed=rollout_seed(self.cfg.seed, step, 0),  # a pure function of the step: resumable
            data_parallel=self.parallel,
        )
        self.sync_rollout_weights()
        if self.main:
            save_jsonl(trajectories, self.run_dir / "rollouts" / f"step-{step:06d}.jsonl")
        return {
            "step": step,
            "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
            "pass_rate": float(np.mean([t.passed for t in trajectories])) if trajectories else 0.0,
            "no_signal_fraction": no_signal_fraction(rewards, groups),
            **signal_metrics(trajectories, groups, self.group_advantages(rewards, groups)),
            "episodes": len(trajectories),
            "errored": stats.errored,
            "trained_samples": len(samples),
            "trained_tokens": sum(sum(s.loss_mask) for s in samples),
            "format_errors": sum(t.metrics.get("format_errors", 0) for t in trajectories),
            "pairs": self._pairs,
            "lr": self.scheduler.get_last_lr()[0],
            "rollout_time_s": round(t1 - t0, 2),
            "update_time_s": round(time.perf_counter() - t1, 2),
            **rollout_cost(trajectories),
            "tokens_generated": stats.tokens_generated,
            **(stats.metrics() if self.agent_rollouts is not None else {}),
            **{f"update/{k}": v for k, v in update.items()},
            **self._sampling,
            **extra,
            # After the step's buffers went back to the system (sync_rollout_weights): flat across steps.
            "memory/rss_mb": round(rss_mb(), 1),
            "memory/peak_rss_mb": round(peak_rss_mb(), 1),
        }

    def group_advantages(self, rewards: list[float], groups: list[int]) -> list[float]:
        """Returns each rollout's group-relative advantage (``cfg.advantage``: GRPO or RLOO)."""
        if self.cfg.advantage == "rloo":
            return rloo_advantages(rewards, groups)
        return grpo_advantages(rewards, groups, scale_std=self.cfg.scale_std)

    def grpo_samples(self, trajectories: list[Any], rewards: list[float], groups: list[int]) -> list[UpdateSample]:
        """Returns update samples with each rollout's group-relative advantage (``cfg.advantage``)."""
        advantages = self.group_advantages(rewards, groups)
        samples: list[UpdateSample] = []
        for trajectory, advantage in zip(trajectories, advantages, strict=True):
            if self.cfg.skip_no_signal_groups and advantage == 0.0:
                continue
            for s in trajectory.training_samples():
                samples.append(UpdateSample(s.input_ids, s.loss_mask, s.old_logprobs, advantage))
        return samples

    def ppo_samples(self, trajectories: list[Any]) -> list[UpdateSample]:
        """Returns update samples with per-turn GAE advantages from the value head (``rl.ppo``)."""
        assert self.value_head is not None
        return ppo_samples(trajectories, self.model, self.value_head, self.policy.tokenizer.pad_token_id,
                           micro_batch_tokens=self.cfg.micro_batch_tokens, gamma=self.cfg.gamma,
                           gae_lambda=self.cfg.gae_lambda, autocast_dtype=self.autocast_dtype)

    # -- the run ---------------------------------------------------------------------------------
    def warm_start(self) -> dict[str, Any]:
        """SFT on oracle demonstrations under the training harnesses (behaviour cloning)."""
        cfg = self.cfg
        # The oracle is not bound by the policy's per-turn sampling limit: demonstrations show
        # whole actions (the context window still applies).
        demo_limits = HarnessLimits(
            max_turns=max(cfg.max_turns, 8), max_new_tokens=min(2048, cfg.context_tokens // 2),
            context_tokens=cfg.context_tokens, fixed_wall_time=cfg.deterministic,
        )
        demos = oracle_demonstrations(
            self.train_tasks[: cfg.sft_tasks], [c.code for c in self.design.configs], self.policy.tokenizer,
            demo_limits, seed=cfg.seed, backend=cfg.sandbox_backend,
        )
        samples = sft_samples(demos)
        if not samples:
            self.log("warm start skipped: no oracle demonstration passed under these limits")
            return {"demonstrations": 0, "samples": 0, "nll": []}
        optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=cfg.sft_learning_rate)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, schedule(cfg.sft_lr_schedule, cfg.sft_warm_start_steps)
        )
        history = []
        per_step = max(1, math.ceil(len(samples) / max(1, cfg.sft_warm_start_steps)))
        order = sft_order(samples, [s.meta["harness"] for s in samples], cfg.seed, chunk=cfg.sft_harness_run)
        for i in Progress.over(range(cfg.sft_warm_start_steps), "sft", "step"):
            batch = [order[(i * per_step + j) % len(order)] for j in range(min(per_step, len(order)))]
            metrics = update_step(
                self.model, optimizer, batch, self.policy.tokenizer.pad_token_id, UpdateSettings(
                    objective="nll", max_grad_norm=cfg.max_grad_norm, micro_batch_tokens=cfg.micro_batch_tokens,
                    autocast_dtype=self.autocast_dtype),
                scheduler=scheduler, data_parallel=self.parallel,
            )
            self.sync_rollout_weights()
            history.append(metrics["nll"])
            self.log(f"sft {i + 1}/{cfg.sft_warm_start_steps}: nll {metrics['nll']:.3f}")
        return {"demonstrations": len(demos), "samples": len(samples), "nll": history}

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

    def checkpoint(self, step: int) -> None:
        if self.rescue is not None:
            self.state["rescue"] = self.rescue.state_dict()
        if self.cfg.frontier or self.cfg.dynamic_sampling_rounds:
            self.state["sampler"] = self.sampler.state_dict()
        tokenizer = getattr(self.policy, "hf_tokenizer", None)
        extra = {"value_head": self.value_head} if self.value_head is not None else None
        model_state = optimizer_state = None
        if self.parallel is not None and self.parallel.sharded:  # every rank gathers, rank 0 writes
            model_state = self.parallel.full_model_state(self.model)
            optimizer_state = self.parallel.full_optimizer_state(self.optimizer)
        if self.main:  # one full checkpoint, whatever the world size: it resumes on any
            save_checkpoint(self.run_dir, step, self.model, tokenizer, self.optimizer, self.scheduler, self.state,
                            keep=self.cfg.keep_checkpoints, extra_modules=extra,
                            model_state=model_state, optimizer_state=optimizer_state)
        if self.parallel is not None:
            self.parallel.barrier()

    def run(self) -> dict[str, Any]:
        """Trains, evaluates and reports; returns the summary. A full disk ends it with a
        `DiskFull` that names the run folder and the checkpoint a rerun resumes from."""
        try:
            return self._run()
        except Exception as exc:
            if is_disk_full(exc):
                raise disk_full_error(self.run_dir, exc, getattr(self, "model", None)) from exc
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
            self.state["final_anchor"] = self.rescue.anchor(cfg.steps, self.run_jobs)
            self.state["final_anchor_step"] = cfg.steps
            self.checkpoint(cfg.steps)
        self.close()
        final = self.state.get("final_eval")
        if final is None or self.state.get("final_eval_step") != cfg.steps:
            final = self.evaluate("final")
            self.state.update({"final_eval": final, "final_eval_step": cfg.steps})
            self.checkpoint(cfg.steps)
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
                           algorithm=self.cfg.algorithm, train_configs=self.design.codes,
                           held_out=[c.code for c in self.held_out.configs],
                           eval_tasks=[t.id for t in self.eval_tasks], precision=self.precision)


def train(cfg: TrainConfig, resume: bool = False, log: Logger = print) -> dict[str, Any]:
    """Runs (or resumes) a training run and returns its summary."""
    trainer = Trainer(cfg, resume=resume, log=log)
    try:
        return trainer.run()
    finally:
        if trainer.parallel is not None:
            trainer.parallel.close()
