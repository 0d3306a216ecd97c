"""Observation formats, context policies and workflows behave as their realizations promise."""

import json

from harnessrl.harness.base import (
    SPAN_OBSERVATION,
    SPAN_POLICY,
    SPAN_SUMMARY,
    SPAN_SYSTEM,
    SPAN_TASK,
    EpisodeState,
    Message,
    ToolOutput,
)
from harnessrl.harness.context import Compaction, FullHistory, ObservationWindow
from harnessrl.harness.observation import (
    CodexHeaderObservation,
    RawObservation,
    ReturnCodeObservation,
    StructuredObservation,
)
from harnessrl.harness.workflow import PlanThenAct, ReAct, VerifyAndRetry
from harnessrl.tasks import Action, FileExists, Task


def make_task():
    return Task(id="t", instruction="do", verifier=FileExists("x"), gold=[Action.run("true")])


def test_observation_formats_differ_and_carry_the_exit_code():
    out = ToolOutput(tool="bash", output="hello\n", stderr="warn\n", exit_code=3, duration_s=0.25)
    raw = RawObservation().format(out)
    rc = ReturnCodeObservation().format(out)
    structured = json.loads(StructuredObservation().format(out))
    assert raw == "hello\nwarn\n"
    assert rc.startswith("<returncode>3</returncode>") and "hello" in rc
    assert structured["exit_code"] == 3 and structured["stdout"] == "hello\n" and structured["stderr"] == "warn\n"
    assert structured["wall_time_s"] == 0.25 and structured["truncated"] is False


def test_rc_observation_keeps_head_and_tail_past_its_limit():
    text = "".join(f"line {i}\n" for i in range(2000))
    rc = ReturnCodeObservation().format(ToolOutput(tool="bash", output=text, exit_code=0))
    assert "<output_head>" in rc and "<output_tail>" in rc and "characters elided" in rc
    assert "line 0\n" in rc and "line 1999" in rc and "line 1000\n" not in rc


def test_error_observations_follow_each_style():
    assert RawObservation().format_error("bad") == "bad"
    assert ReturnCodeObservation().format_error("bad", "tool").startswith('<error kind="tool">')
    assert json.loads(StructuredObservation().format_error("bad"))["error"]["message"] == "bad"


def test_codex_header_observation_shows_exit_code_time_and_cut_output():
    obs = CodexHeaderObservation()
    text = obs.format(ToolOutput(tool="exec_command", output="hello\n", stderr="warn\n", exit_code=2, duration_s=0.123))
    assert text == "Exit code: 2\nWall time: 0.1 seconds\nOutput:\nhello\nwarn\n"
    long = obs.format(ToolOutput(tool="x", output="".join(f"l{i}\n" for i in range(1000)), exit_code=0))
    assert "Total output lines: 1001" in long and "[... omitted 745 of 1001 lines ...]" in long
    assert "l0\n" in long and "l999" in long and "l500\n" not in long
    assert obs.format(ToolOutput(tool="x", output="no such file", is_error=True)).startswith("Exit code: 1\n")
    assert obs.format_error("bad call", "tool") == "tool error: bad call"


def history(n_obs):
    msgs = [Message("system", "s", SPAN_SYSTEM, pinned=True), Message("user", "task", SPAN_TASK, pinned=True)]
    for i in range(n_obs):
        msgs.append(Message("assistant", f"act {i}", SPAN_POLICY, token_ids=(1, 2), turn=i))
        msgs.append(Message("user", f"output {i}\n" * 50, SPAN_OBSERVATION, turn=i))
    return msgs


def test_full_history_is_unchanged():
    msgs = history(6)
    assert FullHistory().apply(msgs, EpisodeState(make_task()), len, 8192) == msgs


def test_window_masks_older_observations_with_a_placeholder():
    msgs = history(6)
    out = ObservationWindow().apply(msgs, EpisodeState(make_task()), len, 8192)
    observations = [m for m in out if m.span == SPAN_OBSERVATION]
    placeholders = [m for m in out if m.span == SPAN_SUMMARY]
    assert len(observations) == 3 and len(placeholders) == 3
    assert placeholders[0].content == "[older output omitted (51 lines)]"
    assert [m.content for m in out if m.span == SPAN_POLICY] == [f"act {i}" for i in range(6)]
    assert msgs[3].span == SPAN_OBSERVATION  # the history itself is not changed


def test_compaction_replaces_old_turns_with_a_digest_past_the_budget():
    state = EpisodeState(make_task(), commands=["bash ls", "bash cat a.txt"], changed_paths=["a.txt"], errors=["No such file"])
    msgs = history(6)
    small = Compaction().apply(msgs, state, len, 100_000)
    assert small == msgs  # under budget: untouched
    out = Compaction().apply(msgs, state, len, 1000)
    assert out[0].span == SPAN_SYSTEM and out[1].span == SPAN_TASK  # pinned survive
    digest = out[2]
    assert digest.span == SPAN_SUMMARY and "bash cat a.txt" in digest.content
    assert "a.txt" in digest.content and "No such file" in digest.content
    assert len(out) < len(msgs) and out[-1] is msgs[-1] and out[3].role == "assistant"


def test_workflows():
    state = EpisodeState(make_task())
    assert not ReAct().wants_plan(state) and ReAct().on_submit(state, None).done
    plan = PlanThenAct()
    assert plan.wants_plan(state)
    state.plan = "1. look\n2. act"
    assert not plan.wants_plan(state)
    state.turn = 3
    assert "Reminder of your plan" in plan.after_step(state, [])[0]
    retry = VerifyAndRetry()
    assert retry.after_step(state, [ToolOutput("bash", exit_code=0)]) == []
    assert "exited with code 2" in retry.after_step(state, [ToolOutput("bash", exit_code=2)])[0]

    class FakeSandbox:
        def list_dir(self, path):
            return ["a.txt"]

    state.submits = 1
    first = retry.on_submit(state, FakeSandbox())
    assert not first.done and "Checklist" in first.message and "a.txt" in first.message
    state.submits = 2
    assert retry.on_submit(state, FakeSandbox()).done


def test_compaction_can_ask_the_policy_for_the_summary():
    from harnessrl.harness import Harness
    from harnessrl.harness.chat import ByteTokenizer
    from harnessrl.harness.context import Compaction
    from harnessrl.policy.base import Generation
    from harnessrl.policy.summarizer import PolicySummarizer

    class SummaryPolicy:
        tokenizer = ByteTokenizer()
        calls = 0

        def generate(self, requests):
            SummaryPolicy.calls += 1
            prompt = self.tokenizer.decode(requests[0].prompt_ids)
            assert "output 0" in prompt  # the dropped turns are what it summarizes
            ids = self.tokenizer.completion_ids("Listed files; a.txt changed.")
            return [Generation(ids, [0.0] * len(ids), "stop")]

    harness = Harness.named("S0-T0-O0-C2-W0").with_summarizer(PolicySummarizer(SummaryPolicy()))
    state = EpisodeState(make_task())
    out = harness.context.apply(history(6), state, len, 1000)
    digest = next(m for m in out if m.span == SPAN_SUMMARY)
    assert digest.content.endswith("Listed files; a.txt changed.")
    harness.context.apply(history(6), state, len, 1000)
    assert SummaryPolicy.calls == 1  # one summary per set of dropped turns
    window = Harness.named("S0-T0-O0-C1-W0").with_summarizer(PolicySummarizer(SummaryPolicy()))
    assert isinstance(window.context, ObservationWindow)
    assert not isinstance(Harness.named("S0-T0-O0-C1-W0").context, Compaction)
