"""Black-box rollouts: a training step's episodes as runs of a real agent program.

With ``rollout_through: ext:<agent>`` (``TrainConfig``) a step's rollouts are not episodes of
our harnesses but runs of an unmodified agent program (OpenClaw, Claude Code, Codex,
opencode, mini-swe-agent), the setting of the Harness Scaling paper's black-box baselines:

    for each (task, run) of the step:                    # G runs per task = one GRPO group
        the agent runs in its own sandbox on the task    # agent_concurrency runs at once
        -> every request goes to one server over the current policy (its batcher batches them)
        -> the server records the conversation token-exactly (serve/recorder.py)
        -> the task's verifier scores the workspace: the run's reward
    trajectory = the recorded main thread of the run (its exact prompt ids, sampled ids, log-probs)

The server is `harnessrl serve` in this process over the trainer's own rollout policy object,
behind `ForcedSampling`; the trainer's ``sync_weights`` after each optimizer step updates
that very object, so the next step's agent runs sample from the updated weights without any
copy or reload (and its prefix KV cache is dropped with it). A run stopped at its time limit
may leave a request generating; the sync takes the policy's generation lock, so it waits for
that generation and no generation ever sees half-updated weights.

Side requests. An agent program also asks the model for things that are not its task loop:
a session title, a summary of its own history, a topic check. The recorder puts each in a
thread of its own and ``to_trajectory`` takes the main thread (the one with the most
requests). Side threads are recorded (their tokens are counted in ``side_requests`` and
``tokens_side``, and kept in the recorder) but not trained: the verifier's reward judges
what the main loop did in the workspace, a title did not act, and crediting it with the
run's advantage would train text that had no part in the outcome. A summary the agent folds
back into its context becomes part of later main-thread prompts, where it is a prompt token
and never trained either.

Sampling. The agent names its own temperature and output limit (or none); `ForcedSampling`
(``policy/forced.py``) replaces them with the training ones (``temperature``, ``top_p``,
``max_new_tokens``), so the recorded log-probabilities are those the update's importance
ratio assumes.

Cost. An agent run costs more than an in-space episode (a long system prompt, tool schemas,
its own retries). `rollout_cost` counts every run's prompt and sampled tokens (side requests
included) and the step's wall time; `harnessrl experiment` reports them per arm next to the
equal optimizer steps and rollouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from harnessrl.external import EXTERNAL_PREFIX
from harnessrl.external.agents import get_agent
from harnessrl.external.gold_replay import GoldReplayPolicy, session_name
from harnessrl.external.install import require_installed
from harnessrl.external.run import AgentServer, ExternalConfig, run_task
from harnessrl.policy.base import Policy, SamplingParams
from harnessrl.policy.forced import ForcedSampling
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


def rollout_agent(rollout_through: str) -> str | None:
    """Returns the agent program named by ``rollout_through`` (None for ``harness``); raises
    ``ValueError`` naming the known agents for an unknown one."""
    if rollout_through == "harness":
        return None
    if not rollout_through.startswith(EXTERNAL_PREFIX):
        raise ValueError(f"rollout_through must be 'harness' or 'ext:<agent>', got {rollout_through!r}")
    return get_agent(rollout_through[len(EXTERNAL_PREFIX):]).name


@dataclass
class AgentRolloutStats:
    """What a step's agent runs produced and cost (the fields `Trainer.rl_step` logs)."""

    episodes: int = 0
    errored: int = 0
    tokens_generated: int = 0  # sampled tokens of the main threads (the trained ones)
    tokens_prompt: int = 0  # prompt tokens of every request, side requests included
    tokens_side: int = 0  # prompt and sampled tokens of side requests (recorded, not trained)
    side_requests: int = 0
    agent_wall_s: float = 0.0  # the runs' own durations, summed (they overlap in time)

    def metrics(self) -> dict[str, Any]:
        """Returns the step-record fields of the agent runs (``agent/...``)."""
        return {"agent/side_requests": self.side_requests, "agent/run_wall_s": round(self.agent_wall_s, 2)}


def rollout_cost(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """Returns the tokens a step's rollouts cost: prompt tokens of every policy call, sampled
    tokens, and for agent runs the side requests' tokens (``tokens_side``)."""
    prompt = sum(t.metrics.get("tokens_prompt", sum(len(turn.prompt_ids) for turn in t.turns)) for t in trajectories)
    return {"tokens_prompt": int(prompt), "tokens_generated": sum(t.n_policy_tokens for t in trajectories),
            "tokens_side": sum(int(t.metrics.get("tokens_side", 0)) for t in trajectories)}


class AgentRollouts:
    """Runs a training step's rollouts through one agent program against one server over the
    current policy (see the module docstring); ``close`` stops the server."""

    def __init__(self, agent: str, policy: Policy, sampling: SamplingParams, *, max_steps: int,
                 time_limit_s: float, concurrency: int, backend: str = "auto",
                 gold_tasks: Sequence[Task] | None = None, log: Callable[[str], None] = print) -> None:
        self.agent = get_agent(agent)
        require_installed(self.agent.name, self.agent.plan())  # fail before the first step, with the fix
        # Gold replay (black-box SFT's oracle) speaks the model's tokenizer, so its ids are
        # the ids the model would have to sample.
        self.served: Policy = (GoldReplayPolicy(gold_tasks, tokenizer=policy.tokenizer) if gold_tasks is not None
                               else ForcedSampling(policy, sampling.temperature, sampling.top_p,
                                              sampling.max_new_tokens))
        self.config = ExternalConfig(max_steps=max_steps, time_limit_s=time_limit_s,
                                     backend="auto" if backend == "none" else backend,
                                     max_tokens=None if gold_tasks is not None else sampling.max_new_tokens)
        self.concurrency = concurrency
        self.log = log
        self.server: AgentServer | None = None

    @classmethod
    def of(cls, cfg: Any, policy: Policy, train_tasks: Sequence[Task],
           log: Callable[[str], None] = print) -> AgentRollouts | None:
        """Returns the agent rollouts a ``TrainConfig`` asks for (None: ``rollout_through:
        harness``); ``objective: sft`` with ``sft_source: gold`` serves gold replay of
        ``train_tasks`` instead of the policy."""
        agent = rollout_agent(cfg.rollout_through)
        if agent is None:
            return None
        gold = train_tasks if cfg.objective == "sft" and cfg.sft_source == "gold" else None
        return cls(agent, policy, SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens),
                   max_steps=cfg.agent_max_steps, time_limit_s=cfg.agent_time_limit_s,
                   concurrency=cfg.agent_concurrency, backend=cfg.sandbox_backend, gold_tasks=gold, log=log)

    def start(self) -> AgentServer:
        """Starts the server on first use; returns it."""
        if self.server is None:
            self.server = AgentServer(self.served, model_name=self.config.model,
                                      max_tokens=self.config.max_tokens).start()
        return self.server

    def run(self, tasks: Sequence[Task], first_run: int) -> tuple[list[Trajectory], AgentRolloutStats]:
        """Runs the agent once per entry of ``tasks`` (a task repeated G times is a GRPO group),
        ``concurrency`` at a time; run i is session ``<task>@<first_run + i>``. Returns the
        trajectories in order (a run that fails is an ``error`` trajectory, never lost) and
        their stats."""
        server = self.start()
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="agent-run") as pool:
            futures = [pool.submit(run_task, self.agent, task, server, self.config, first_run + index)
                       for index, task in enumerate(tasks)]
            trajectories = [future.result() for future in futures]
        stats = AgentRolloutStats(episodes=len(trajectories))
        for index, (task, trajectory) in enumerate(zip(tasks, trajectories, strict=True)):
            session = session_name(task.id, first_run + index)
            self._count(server, session, trajectory, stats)
            server.recorder.forget(session)  # the trajectory holds what training needs
        self.log(f"{self.agent.name}: {len(trajectories)} runs in {time.perf_counter() - started:.1f}s, "
                 f"{stats.errored} errored, {stats.side_requests} side requests")
        return trajectories, stats

    @staticmethod
    def _count(server: AgentServer, session: str, trajectory: Trajectory, stats: AgentRolloutStats) -> None:
        records = server.recorder.records(session) if session in server.recorder.sessions() else []
        main = trajectory.metrics.get("thread", 0)
        side = [r for r in records if r.get("thread", 0) != main]
        tokens_prompt = sum(len(r["prompt_ids"]) for r in records)
        tokens_side = sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in side)
        trajectory.metrics.update({"tokens_prompt": tokens_prompt, "tokens_side": tokens_side,
                                   "side_requests": len(side)})
        stats.errored += trajectory.status == "error"
        stats.tokens_generated += trajectory.n_policy_tokens
        stats.tokens_prompt += tokens_prompt
        stats.tokens_side += tokens_side
        stats.side_requests += len(side)
        stats.agent_wall_s += float(trajectory.metrics.get("duration_s", 0.0))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def trajectory_summary(trajectory: Trajectory, tokenizer: Any = None) -> dict[str, Any]:
    """Returns a token-level summary of one rollout: per turn the prompt length, the trained
    (policy-span) and other prompt tokens, the sampled ids' count and mean log-prob, and per
    training sequence how many tokens the loss mask keeps."""
    samples = trajectory.training_samples()
    turns = []
    for turn in trajectory.turns:
        labels = turn.prompt_labels()
        logprobs = turn.completion_logprobs
        turns.append({
            "prompt_tokens": len(turn.prompt_ids),
            "prompt_spans": dict(sorted({label: labels.count(label) for label in set(labels)}.items())),
            "sampled_tokens": len(turn.completion_ids),
            "mean_logprob": round(sum(logprobs) / len(logprobs), 4) if logprobs else None,
            "finish": turn.finish_reason,
            "text": (tokenizer.decode(turn.completion_ids) if tokenizer is not None else turn.text)[:80],
        })
    return {
        "task": trajectory.task_id, "config": trajectory.config, "status": trajectory.status,
        "reward": trajectory.reward, "passed": trajectory.passed, "turns": turns,
        "sequences": [{"tokens": len(s.input_ids), "trained": sum(s.loss_mask)} for s in samples],
        "side_requests": trajectory.metrics.get("side_requests", 0),
    }
