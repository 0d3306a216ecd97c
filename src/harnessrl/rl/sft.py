"""SFT: behaviour cloning on trajectories, trained only on policy spans.

Two uses: the paper's black-box SFT baseline (trajectories collected through an external
harness), and a warm start that teaches a small model the tool syntax of the training
harnesses from oracle demonstrations rendered under those harnesses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from harnessrl.harness.chat import ChatTokenizer
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.progress import Progress
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.schedules import schedule, sft_order
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory

if TYPE_CHECKING:
    from harnessrl.rl.actor import Actor
    from harnessrl.rl.config import TrainConfig


def oracle_demonstrations(
    tasks: Sequence[Task],
    harness_codes: Sequence[str],
    tokenizer: ChatTokenizer,
    limits: HarnessLimits | None = None,
    seed: int = 0,
    backend: str = "auto",
) -> list[Trajectory]:
    """Returns passing oracle trajectories: task i runs under harness ``i mod len(codes)``,
    tokenized with ``tokenizer`` (the model's own, so the ids are what it would sample)."""
    policy = OraclePolicy(tokenizer)
    jobs = [
        RolloutJob(task, Harness.named(harness_codes[i % len(harness_codes)], limits), seed=seed + i)
        for i, task in enumerate(tasks)
    ]
    trajectories, _ = RolloutEngine(policy, backend=backend).run(jobs)  # EngineOptions' episodes in flight
    return [t for t in trajectories if t.passed]


def sft_samples(trajectories: Sequence[Trajectory]) -> list[UpdateSample]:
    """Returns one sample per training sequence, loss on policy tokens only; ``meta["harness"]``
    names the harness it was rendered under."""
    samples = []
    for trajectory in trajectories:
        for s in trajectory.training_samples():
            samples.append(UpdateSample(s.input_ids, s.loss_mask, s.old_logprobs, 1.0,
                                        meta={"harness": trajectory.harness}))
    return samples


def warm_start(
    actor: Actor, cfg: TrainConfig, tasks: Sequence[Task], harness_codes: Sequence[str], log: Callable[[str], None],
) -> dict[str, Any]:
    """SFT of ``actor`` on oracle demonstrations of ``tasks[: cfg.sft_tasks]`` under the training
    harnesses (behaviour cloning): ``cfg.sft_warm_start_steps`` steps of an optimizer of its
    own over one epoch order (``sft_order``); returns what it trained on and its NLL per step."""
    # The oracle is not bound by the policy's per-turn sampling limit: demonstrations show
    # whole actions (the context window still applies).
    demo_limits = HarnessLimits(
        max_turns=max(cfg.max_turns, 8), max_new_tokens=min(2048, cfg.context_tokens // 2),
        context_tokens=cfg.context_tokens, fixed_wall_time=cfg.deterministic,
    )
    demos = oracle_demonstrations(tasks[: cfg.sft_tasks], harness_codes, actor.policy.tokenizer, demo_limits,
                                  seed=cfg.seed, backend=cfg.sandbox_backend)
    samples = sft_samples(demos)
    if not samples:
        log("warm start skipped: no oracle demonstration passed under these limits")
        return {"demonstrations": 0, "samples": 0, "nll": []}
    optimizer = torch.optim.AdamW([p for p in actor.model.parameters() if p.requires_grad], lr=cfg.sft_learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(cfg.sft_lr_schedule, cfg.sft_warm_start_steps))
    history = []
    per_step = max(1, math.ceil(len(samples) / max(1, cfg.sft_warm_start_steps)))
    order = sft_order(samples, [s.meta["harness"] for s in samples], cfg.seed, chunk=cfg.sft_harness_run)
    for i in Progress.over(range(cfg.sft_warm_start_steps), "sft", "step"):
        batch = [order[(i * per_step + j) % len(order)] for j in range(min(per_step, len(order)))]
        metrics = actor.sft_step(batch, optimizer, scheduler)
        history.append(metrics["nll"])
        log(f"sft {i + 1}/{cfg.sft_warm_start_steps}: nll {metrics['nll']:.3f}")
    return {"demonstrations": len(demos), "samples": len(samples), "nll": history}
