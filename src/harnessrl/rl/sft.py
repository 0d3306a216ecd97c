"""SFT: behaviour cloning on trajectories, trained only on policy spans.

Two uses: the paper's black-box SFT baseline (trajectories collected through an external
harness), and a warm start that teaches a small model the tool syntax of the training
harnesses from oracle demonstrations rendered under those harnesses.
"""

from __future__ import annotations

from collections.abc import Sequence

from harnessrl.harness.chat import ChatTokenizer
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rl.batching import UpdateSample
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


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
    trajectories, _ = RolloutEngine(policy, max_concurrent=8, backend=backend).run(jobs)
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
