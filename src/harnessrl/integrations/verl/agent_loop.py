"""The verl agent loop ``harnessrl``: one harnessrl episode per sample, generating through verl.

Importing this module registers ``HarnessAgentLoop`` in verl's agent-loop registry. For each
dataset row (``dataset.build_rows``) verl calls ``run``, which reads top to bottom:

    start:   the row's harness (a configuration code, an out-of-space name or a sibling),
             refused unless its context is append-only; the row's task; a fresh sandbox
    repeat:  Episode.request() -> verl's server manager generates (token ids in, token ids
             and log-probs out) -> Episode.advance() (parse, act in the sandbox, observe)
    finish:  Episode.finish() verifies -> reward; the turns -> one sequence with the policy
             tokens masked in (``sequence.episode_sequence``)

The episode is ``rollout.episode.Episode``, the same state machine as every other rollout
path; sandbox work runs in a thread so verl's event loop keeps serving other samples.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from harnessrl.harness.chat import HFChatTokenizer
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.integrations.verl import AGENT_NAME
from harnessrl.integrations.verl.sequence import (
    EpisodeSequence,
    episode_sequence,
    require_append_only,
)
from harnessrl.policy.base import Generation, SamplingParams
from harnessrl.rollout.episode import Episode
from harnessrl.sandbox import SandboxLimits, open_sandbox
from harnessrl.tasks.model import Task
from harnessrl.tasks.suite import load_suite

RUNNING_EPISODES: weakref.WeakValueDictionary[str, Episode] = weakref.WeakValueDictionary()
"""The episodes in progress by request id, for in-process servers whose policy reads the
episode (a scripted policy such as the oracle); verl's own servers never look here."""

REWARD_EXTRA_METRICS: tuple[str, ...] = ("turns", "policy_tokens", "format_errors", "tool_errors", "blocked_calls")
"""Episode metrics reported to verl as ``reward_extra_info`` (besides ``passed``)."""

_TASKS: dict[tuple[str, str], Task] = {}  # (suite, task id) -> task, loaded once per worker


class PromptTooLong(ValueError):
    """A row whose opening messages do not fit verl's ``rollout.prompt_length``."""


def task_of(suite: str, task_id: str) -> Task:
    """Returns the task ``task_id`` of ``suite`` (loaded once per process)."""
    key = (suite, task_id)
    if key not in _TASKS:
        _TASKS[key] = load_suite(suite).get(task_id)
    return _TASKS[key]


@register(AGENT_NAME)
class HarnessAgentLoop(AgentLoopBase):
    """Runs one harnessrl episode per sample. Keyword options (set them in the agent-loop
    config file next to ``_target_``): ``max_turns``, ``max_new_tokens`` (per turn),
    ``command_timeout_s`` and ``sandbox_backend``; the context window is verl's
    ``prompt_length + response_length``."""

    def __init__(
        self,
        *args: Any,
        max_turns: int = HarnessLimits.max_turns,
        max_new_tokens: int = HarnessLimits.max_new_tokens,
        command_timeout_s: float = HarnessLimits.command_timeout_s,
        sandbox_backend: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.chat_tokenizer = HFChatTokenizer(self.tokenizer)
        self.limits = HarnessLimits(
            max_turns=max_turns, max_new_tokens=min(max_new_tokens, self.response_length),
            context_tokens=self.prompt_length + self.response_length, command_timeout_s=command_timeout_s,
        )
        self.sandbox_backend = sandbox_backend

    def harness_of(self, name: str) -> Harness:
        """Returns the row's harness; raises ``sequence.NotAppendOnly`` for C1/C2 contexts."""
        harness = Harness.named(name, self.limits)
        require_append_only(harness)
        return harness

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        for column in ("harness", "suite", "task_id"):
            if column not in kwargs:
                raise ValueError(
                    f"row has no {column!r} column; build verl's dataset with "
                    "harnessrl.integrations.verl.dataset.build_rows"
                )
        harness = self.harness_of(str(kwargs["harness"]))
        task = await asyncio.to_thread(task_of, str(kwargs["suite"]), str(kwargs["task_id"]))
        seed = int(kwargs.get("index", 0))
        sandbox = await asyncio.to_thread(
            open_sandbox, backend=self.sandbox_backend, limits=SandboxLimits(timeout_s=self.limits.command_timeout_s)
        )
        episode = Episode(
            harness, task, sandbox, self.chat_tokenizer,
            SamplingParams(
                temperature=float(sampling_params.get("temperature", 1.0)),
                top_p=float(sampling_params.get("top_p", 1.0)),
                max_new_tokens=self.limits.max_new_tokens,
            ),
            seed,
        )
        # One request id for the whole episode: verl's sticky sessions keep its turns on one server.
        request_id = uuid.uuid4().hex
        RUNNING_EPISODES[request_id] = episode
        generate_s = tool_s = 0.0
        server_logprobs = True  # whether every generation came with its log-probabilities
        loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(episode.start)
            first_prompt = 0
            while not episode.done:
                request = episode.request()
                if request is None:
                    break
                if not episode.turns:
                    first_prompt = len(request.prompt_ids)
                    if first_prompt > self.prompt_length:
                        raise PromptTooLong(
                            f"task {task.id!r} under {harness.code!r} opens with {first_prompt} tokens, "
                            f"more than rollout.prompt_length={self.prompt_length}"
                        )
                # The whole episode after the first prompt must fit verl's response_length.
                room = self.response_length - (len(request.prompt_ids) - first_prompt)
                if room < 1:
                    episode.end("response_length")
                    break
                t0 = loop.time()
                output = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=request.prompt_ids,
                    sampling_params={**sampling_params, "max_tokens": min(request.params.max_new_tokens, room)},
                )
                t1 = loop.time()
                server_logprobs = server_logprobs and (bool(output.log_probs) or not output.token_ids)
                await asyncio.to_thread(episode.advance, self._generation(output))
                generate_s, tool_s = generate_s + t1 - t0, tool_s + loop.time() - t1
        except PromptTooLong:
            raise
        except Exception as exc:  # the environment or the server failed: recorded, as run_episode does
            episode.error = f"{type(exc).__name__}: {exc}"
            episode.end("error")
        finally:
            RUNNING_EPISODES.pop(request_id, None)
        try:
            trajectory = await asyncio.to_thread(episode.finish, AGENT_NAME)
        finally:
            await asyncio.to_thread(sandbox.close)
        if trajectory.turns:
            sequence = episode_sequence(trajectory.turns)
        else:  # it failed before the first generation: the opening alone, nothing to train on
            opening = self.chat_tokenizer.render(episode.history).ids or [self.chat_tokenizer.eos_token_id]
            sequence = EpisodeSequence(list(opening)[-self.prompt_length:], [], [], [])
        return AgentLoopOutput(
            prompt_ids=sequence.prompt_ids,
            response_ids=sequence.response_ids,
            response_mask=sequence.response_mask,
            response_logprobs=sequence.response_logprobs if server_logprobs else None,
            reward_score=float(trajectory.reward),
            # verl counts user, assistant and tool messages: the task, then a reply and an observation per turn.
            num_turns=1 + 2 * len(trajectory.turns),
            metrics=AgentLoopMetrics(generate_sequences=generate_s, tool_calls=tool_s),
            extra_fields={
                # one key, so that no dataset column of the same name is overwritten in verl's batch
                AGENT_NAME: {
                    "harness": harness.code, "task_id": task.id, "status": trajectory.status,
                    "passed": bool(trajectory.passed), "error": trajectory.error or "",
                    "episode_metrics": dict(trajectory.metrics),
                },
                # scalars verl logs per step, and that algorithm.filter_groups.metric may name
                "reward_extra_info": {
                    "passed": float(trajectory.passed),
                    **{name: float(trajectory.metrics[name]) for name in REWARD_EXTRA_METRICS},
                },
                # the keys verl's own agent loops always set, so batches of mixed loops stack
                "turn_scores": [], "tool_rewards": [],
            },
        )

    def _generation(self, output: Any) -> Generation:
        """Returns verl's ``TokenOutput`` as our ``Generation`` (why sampling stopped, from the ids)."""
        ids = [int(i) for i in output.token_ids]
        if getattr(output, "stop_reason", None) == "aborted":
            return Generation(ids, [0.0] * len(ids), "error", error="generation aborted by verl's server")
        logprobs = [float(x) for x in output.log_probs] if output.log_probs else [0.0] * len(ids)
        stopped = bool(ids) and ids[-1] in self.chat_tokenizer.stop_token_ids
        return Generation(ids, logprobs, "stop" if stopped else "length")
