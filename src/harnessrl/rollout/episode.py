"""The agent loop: harness x task x policy -> Trajectory.

``Episode`` is a small state machine so that the rollout engine can interleave many
episodes (``request`` -> policy -> ``advance``, until ``done``); ``run_episode`` is the whole
loop for one episode and reads top to bottom:

    start:   lay out the workspace; system message and first user message (the task)
             (+ what the harness's start hooks show)
    repeat:  render the context -> policy samples -> parse -> (harness rules may block
             a call) act in the sandbox -> observation (+ reminders) -> maybe submit,
             review, or stop
    finish:  verify the workspace and answer -> reward -> Trajectory

Bad policy output never raises: it becomes an error observation in the harness's own
style and is counted; too many in a row end the episode with status ``format_errors``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from harnessrl.harness.base import (
    SPAN_OBSERVATION,
    SPAN_POLICY,
    SPAN_REMINDER,
    SPAN_SYSTEM,
    SPAN_TASK,
    EpisodeState,
    Message,
    PromptContext,
    ToolOutput,
    describe_call,
)
from harnessrl.harness.chat import ChatTokenizer
from harnessrl.harness.limits import is_bytewise, resolve_limits
from harnessrl.policy.base import Generation, GenerationRequest, Policy, SamplingParams
from harnessrl.tasks.model import prepare_workspace, verify_task
from harnessrl.trajectory import Trajectory, Turn, run_length

if TYPE_CHECKING:
    from harnessrl.harness.harness import Harness
    from harnessrl.sandbox import Sandbox
    from harnessrl.tasks.model import Task

PLAN_NOTED = "Plan noted. Now carry it out, one action per response."
PLAN_WITH_ACTION = (
    "Plan noted. Actions in the planning response are not executed; carry out the plan now, "
    "one action per response."
)


class Episode:
    """One episode in progress. Call ``start``, then ``request``/``advance`` until ``done``,
    then ``finish``."""

    def __init__(
        self,
        harness: Harness,
        task: Task,
        sandbox: Sandbox,
        tokenizer: ChatTokenizer,
        sampling: SamplingParams | None = None,
        seed: int = 0,
    ) -> None:
        self.harness, self.task, self.sandbox, self.tokenizer = harness, task, sandbox, tokenizer
        # A scripted (bytewise) policy gets room for its text where the harness kept the defaults.
        self.limits = resolve_limits(harness.limits, bytewise=is_bytewise(tokenizer))
        # The harness's per-turn limit caps whatever the caller asks for.
        base = sampling or SamplingParams(max_new_tokens=self.limits.max_new_tokens)
        self.sampling = SamplingParams(
            temperature=base.temperature,
            top_p=base.top_p,
            max_new_tokens=min(base.max_new_tokens, self.limits.max_new_tokens),
            stop_token_ids=tuple(tokenizer.stop_token_ids),
            seed=seed if base.seed is None else base.seed,
        )
        self.seed = seed
        self.state = EpisodeState(task=task, max_turns=self.limits.max_turns)
        self.history: list[Message] = []
        self.turns: list[Turn] = []
        self.done = False
        self.status = "error"
        self.error: str | None = None
        self.sandbox_time_s = 0.0  # laying out, running tool calls, verifying
        self.harness_time_s = 0.0  # rendering, parsing, formatting, context policy
        self._prompt: tuple[list[int], list[str]] | None = None
        self._last_outputs: list[ToolOutput] = []

    # -- start -------------------------------------------------------------------------
    def start(self) -> None:
        """Lays out the workspace and writes the opening messages."""
        t0 = time.perf_counter()
        prepare_workspace(self.task, self.sandbox)
        if self.limits.fixed_wall_time:  # a listing of the starting files shows no clock either
            self.sandbox.workspace.freeze_times()
        t1 = time.perf_counter()
        ctx = PromptContext(self.task, self.harness.tools, self.harness.workflow, self.limits.max_turns)
        self.history.append(Message("system", self.harness.system.system_message(ctx), SPAN_SYSTEM, pinned=True))
        self.history.append(Message("user", self.harness.system.first_user_message(ctx), SPAN_TASK, pinned=True))
        t2 = time.perf_counter()
        # Start hooks (sibling harnesses) show read-only command output: harness text, pinned.
        for text in self.harness.episode_hooks.at_start(self.state, self.sandbox):
            self.history.append(Message("user", text, SPAN_REMINDER, pinned=True))
        self.sandbox_time_s += t1 - t0 + time.perf_counter() - t2
        self.harness_time_s += t2 - t1

    # -- one turn ------------------------------------------------------------------------
    def request(self) -> GenerationRequest | None:
        """Returns the next prompt for the policy, or None when the episode just ended
        because the context no longer fits."""
        t0 = time.perf_counter()
        visible = self.harness.context.apply(
            self.history, self.state, self.tokenizer.count_tokens, self.limits.context_tokens
        )
        rendered = self.tokenizer.render(visible)
        self.harness_time_s += time.perf_counter() - t0
        if len(rendered) + self.sampling.max_new_tokens > self.limits.context_tokens:
            self.end("context_exceeded")
            return None
        self._prompt = (rendered.ids, rendered.spans)
        # The episode is the request's context: scripted policies read it as an EpisodeView.
        return GenerationRequest(list(rendered.ids), self.sampling, context=self)

    def advance(self, generation: Generation) -> None:
        """Consumes the policy's completion: parse, act, observe, and decide whether to stop."""
        assert self._prompt is not None, "advance() without request()"
        prompt_ids, prompt_spans = self._prompt
        self._prompt = None
        ids = list(generation.token_ids)
        text = self.tokenizer.decode([i for i in ids if i not in self.tokenizer.stop_token_ids])
        turn = Turn(
            index=self.state.turn, prompt_ids=prompt_ids, prompt_spans=run_length(prompt_spans),
            completion_ids=ids, completion_logprobs=list(generation.logprobs),
            finish_reason=generation.finish_reason, text=text,
        )
        self.turns.append(turn)
        if generation.finish_reason == "error":
            self.error = generation.error or "policy error"
            self.end("error")
            return
        policy_message = Message("assistant", text, SPAN_POLICY, token_ids=tuple(ids), turn=self.state.turn)
        self.history.append(policy_message)

        t0 = time.perf_counter()
        sandbox_before = self.sandbox_time_s
        observation, reminders = self._act(text, turn, policy_message)
        reminders += self.harness.workflow.after_step(self.state, self._last_outputs)
        system_reminder = self.harness.system.reminder(self.state)
        if system_reminder:
            reminders.append(system_reminder)
        self.harness_time_s += time.perf_counter() - t0 - (self.sandbox_time_s - sandbox_before)

        turn.observation = "\n".join([observation, *reminders]).strip()
        if observation and not self.done:
            self.history.append(Message("user", observation, SPAN_OBSERVATION, turn=self.state.turn))
        for reminder in reminders if not self.done else []:
            self.history.append(Message("user", reminder, SPAN_REMINDER, turn=self.state.turn))
        self.state.turn += 1
        if not self.done and self.state.turn >= self.limits.max_turns:
            self.end("max_turns")

    def _act(self, text: str, turn: Turn, policy_message: Message) -> tuple[str, list[str]]:
        """Returns (observation, reminders) for the policy's text; runs its actions."""
        harness, state = self.harness, self.state
        self._last_outputs: list[ToolOutput] = []
        if harness.workflow.wants_plan(state):
            turn.kind = "plan"
            state.plan = text.strip() or "(empty plan)"
            policy_message.pinned = True
            parsed = harness.tools.parse(text)
            return "", [PLAN_WITH_ACTION if parsed.calls else PLAN_NOTED]
        parsed = harness.tools.parse(text)
        if parsed.error is not None:
            kind = parsed.error_kind or "format"
            turn.error = kind
            if kind == "tool":
                state.tool_errors += 1
            state.format_errors += 1
            state.consecutive_format_errors += 1
            state.errors.append(parsed.error)
            if state.consecutive_format_errors >= self.limits.max_consecutive_format_errors:
                self.end("format_errors")
            return harness.observation.format_error(parsed.error, kind), []
        state.consecutive_format_errors = 0
        turn.calls = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
        observations: list[str] = []
        reminders: list[str] = []
        for call in parsed.calls:
            verdict = harness.episode_hooks.before_call(call, state)
            reminders += verdict.hints
            t0 = time.perf_counter()
            if verdict.blocked is not None:  # a harness rule refused it: the reason is the observation
                output = ToolOutput(tool=call.name, output=verdict.blocked, is_error=True)
                state.blocked_calls += 1
            else:
                output = harness.tools.execute(call, self.sandbox)
            self.sandbox_time_s += time.perf_counter() - t0
            self._last_outputs.append(output)
            turn.outcomes.append({"tool": call.name, "failed": output.failed, "exit_code": output.exit_code,
                                  "submitted": output.submitted is not None,
                                  **({"blocked": True} if verdict.blocked is not None else {})})
            state.commands.append(describe_call(call))
            state.changed_paths.extend(output.changed_paths)
            if output.is_error:
                state.tool_errors += 1
                turn.error = turn.error or "tool"
            if output.failed:
                state.errors.append((output.stderr or output.output)[-200:])
            if output.submitted is not None:
                state.submits += 1
                state.answer = output.submitted
                decision = harness.workflow.on_submit(state, self.sandbox)
                if decision.done:
                    self.end("submitted")
                    return "", []
                reminders.append(decision.message or "")
                break  # a submit ends the turn; later calls in the same response are dropped
            observations.append(harness.observation.format(self._shown(output)))
        state.last_failed = any(o.failed for o in self._last_outputs)
        return "\n".join(observations), reminders

    def _shown(self, output: ToolOutput) -> ToolOutput:
        """Returns ``output`` as the observation shows it: with the fixed stand-in for its wall
        time under ``limits.fixed_wall_time`` (the time stays measured in the episode's metrics)."""
        if not self.limits.fixed_wall_time:
            return output
        return replace(output, duration_s=self.limits.command_timeout_s if output.timed_out else 0.0)

    def end(self, status: str) -> None:
        """Marks the episode done with ``status`` (``submitted``, ``max_turns``, ``error``, ...);
        ``run_episode`` and the rollout engine call it when the episode fails outside ``advance``."""
        self.done, self.status = True, status

    # -- finish --------------------------------------------------------------------------
    def finish(self, policy_name: str = "") -> Trajectory:
        """Verifies the outcome and returns the trajectory."""
        trajectory = Trajectory(
            task_id=self.task.id, config=self.harness.code, harness=self.harness.code,
            turns=self.turns, status=self.status, answer=self.state.answer, error=self.error,
            policy=policy_name, seed=self.seed, out_of_space=self.harness.out_of_space,
            sibling=dict(self.harness.sibling or {}),
        )
        t0 = time.perf_counter()
        if self.status != "error":
            try:
                verdict = verify_task(self.task, self.sandbox, self.state.answer)
                trajectory.passed, trajectory.reward = verdict.passed, verdict.reward
                trajectory.verdict = [{"name": r.name, "passed": r.passed, "detail": r.detail} for r in verdict.results]
            except Exception as exc:  # verification failure is recorded, never raised
                trajectory.error = f"verification failed: {type(exc).__name__}: {exc}"
        self.sandbox_time_s += time.perf_counter() - t0
        trajectory.metrics = {
            "turns": len(self.turns),
            "policy_tokens": trajectory.n_policy_tokens,
            "prompt_tokens_last": len(self.turns[-1].prompt_ids) if self.turns else 0,
            "format_errors": self.state.format_errors,
            "tool_errors": self.state.tool_errors,
            "blocked_calls": self.state.blocked_calls,
            "submits": self.state.submits,
            "commands": len(self.state.commands),
            "sandbox_time_s": round(self.sandbox_time_s, 4),
            "harness_time_s": round(self.harness_time_s, 4),
        }
        return trajectory


def run_episode(
    harness: Harness,
    task: Task,
    policy: Policy,
    sandbox: Sandbox | None = None,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    backend: str = "auto",
) -> Trajectory:
    """Runs one episode of ``policy`` on ``task`` under ``harness`` and returns its trajectory.

    Opens (and closes) a fresh sandbox unless one is given. An exception from the
    environment or the policy is recorded in the trajectory (status ``error``).
    """
    from harnessrl.sandbox import SandboxLimits, open_sandbox

    owned = sandbox is None
    if sandbox is None:
        sandbox = open_sandbox(backend=backend, limits=SandboxLimits(timeout_s=harness.limits.command_timeout_s))
    episode = Episode(harness, task, sandbox, policy.tokenizer, sampling, seed)
    try:
        episode.start()
        while not episode.done:
            request = episode.request()
            if request is None:
                break
            episode.advance(policy.generate([request])[0])
        return episode.finish(policy.name)
    except Exception as exc:
        episode.error = f"{type(exc).__name__}: {exc}"
        episode.end("error")
        return episode.finish(policy.name)
    finally:
        if owned:
            sandbox.close()
