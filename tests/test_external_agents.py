"""External agents against `harnessrl serve`: gold replay, installs, and real end-to-end runs.

mini-swe-agent runs end to end here and in CI: the test installs it into the agents cache
(PyPI), and a scripted policy replays each task's gold solution through mini-swe-agent's own
text format; the task's verifier scores the workspace. The npm agents (Claude Code, Codex,
opencode, OpenClaw) run in the tests marked ``external_agent`` when they are installed
(`harnessrl external install NAME`), and skip with that command otherwise.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from harnessrl.external.agents import AGENTS, get_agent
from harnessrl.external.gold_replay import GoldReplayPolicy, session_name, shell_arguments
from harnessrl.external.install import (
    AgentInstallError,
    InstallPlan,
    Package,
    agents_root,
    install,
    read_manifest,
    require_installed,
    resolve_entry,
)
from harnessrl.external.run import AgentServer, ExternalConfig, evaluate_external
from harnessrl.harness.tools.tool_call import parse_completion
from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.serve.context import ServeContext
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.suite import load_suite
from harnessrl.tasks.verify import AnswerEquals, FileContains


def _task(answer: str | None = None) -> Task:
    gold = [Action.write("notes/a.txt", "alpha\n"), Action.run("echo beta >> notes/a.txt")]
    if answer is not None:
        gold.append(Action.submit(answer))
    verifier = AnswerEquals(answer) if answer is not None else FileContains("notes/a.txt", "beta")
    return Task(id="unit/task-1", instruction="Write notes.", verifier=verifier, gold=gold,
                expects_answer=answer is not None)


BASH_TOOL = {"name": "Bash", "description": "Run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"},
                                     "timeout": {"type": "number"}}, "required": ["command"]}}
CODEX_SHELL = {"name": "shell", "description": "Runs a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                     "workdir": {"type": "string"}}, "required": ["command"]}}
OPENCODE_BASH = {"name": "bash", "description": "Executes a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"},
                                     "timeout": {"type": "number"}}, "required": ["command", "description"]}}
READ_TOOL = {"name": "Read", "description": "Read a file", "parameters": {"type": "object", "properties": {}}}


def _reply(policy: GoldReplayPolicy, context: ServeContext) -> str:
    [generation] = policy.generate([GenerationRequest([1, 2], SamplingParams(max_new_tokens=1 << 16), context)])
    assert generation.error is None, generation.error
    return policy.tokenizer.decode(generation.token_ids)


def test_gold_replay_calls_the_clients_shell_tool_one_action_per_request() -> None:
    task = _task()
    policy = GoldReplayPolicy([task])
    session = session_name(task.id, 0)
    messages: list[dict] = [{"role": "system", "content": "You are an agent."},
                            {"role": "user", "content": task.instruction}]
    seen = []
    for _step in range(2):
        text = _reply(policy, ServeContext("messages", session, list(messages), [READ_TOOL, BASH_TOOL]))
        _content, calls = parse_completion(text)
        assert [c["name"] for c in calls] == ["Bash"]
        seen.append(calls[0]["arguments"]["command"])
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", **calls[0]}]},
                     {"role": "tool", "tool_call_id": "c", "name": "Bash", "content": "ok"},
                     {"role": "system", "content": "a reminder the client inserted mid-conversation"}]
    assert seen == [a.as_shell() for a in task.gold]
    final = _reply(policy, ServeContext("messages", session, messages, [READ_TOOL, BASH_TOOL]))
    assert parse_completion(final)[1] == [] and final.strip()


def test_gold_replay_commands_do_what_the_gold_actions_do(tmp_path: Path) -> None:
    task = _task()
    policy = GoldReplayPolicy([task])
    messages: list[dict] = [{"role": "user", "content": task.instruction}]
    for _step in task.gold:
        _content, [call] = parse_completion(_reply(policy, ServeContext("chat", session_name(task.id), list(messages), [OPENCODE_BASH])))
        subprocess.run(["bash", "-c", call["arguments"]["command"]], cwd=tmp_path, check=True)
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": "x", **call}]})
    assert (tmp_path / "notes" / "a.txt").read_text() == "alpha\nbeta\n"


def test_shell_arguments_follow_the_tool_schema() -> None:
    assert shell_arguments(BASH_TOOL, "ls", "why") == {"command": "ls"}
    assert shell_arguments(CODEX_SHELL, "ls -a", "why") == {"command": ["bash", "-lc", "ls -a"]}
    assert shell_arguments(OPENCODE_BASH, "ls", "List files") == {"command": "ls", "description": "List files"}
    exec_command = {"name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                           "required": ["cmd"]}}
    assert shell_arguments(exec_command, "pwd", "") == {"cmd": "pwd"}


def test_gold_replay_speaks_mini_swe_agents_text_format_and_submits_the_answer() -> None:
    task = _task(answer="42")
    policy = GoldReplayPolicy([task])
    system = ("Reply with one block:\n```mswea_bash_command\nyour_command\n```\n"
              "Finish with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.")
    messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": task.instruction}]
    blocks = []
    for _step in range(3):
        text = _reply(policy, ServeContext("chat", session_name(task.id, 3), list(messages)))
        assert text.startswith("THOUGHT: ")
        blocks.append(text.split("```mswea_bash_command\n", 1)[1].rsplit("\n```", 1)[0])
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "<returncode>0</returncode>"}]
    assert blocks[:2] == [a.as_shell() for a in task.gold[:2]]
    out = subprocess.run(["bash", "-c", blocks[2]], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "42"]


def test_gold_replay_encodes_commands_that_would_end_the_fenced_block(tmp_path: Path) -> None:
    content = "# Title\n```python\nprint(1)\n```\n"
    task = Task(id="fence", instruction="Write the readme.", verifier=FileContains("README.md", "print"),
                gold=[Action.write("README.md", content)])
    system = "```bash\ncmd\n```\nthen echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    text = _reply(GoldReplayPolicy([task]), ServeContext("chat", session_name("fence"), [{"role": "system", "content": system}]))
    block = text.split("```bash\n", 1)[1].rsplit("\n```", 1)[0]
    assert "```" not in block and "base64" in block
    subprocess.run(["bash", "-c", block], cwd=tmp_path, check=True)
    assert (tmp_path / "README.md").read_text() == content


def test_gold_replay_side_requests_and_unknown_sessions() -> None:
    task = _task()
    policy = GoldReplayPolicy([task])
    title = _reply(policy, ServeContext("chat", session_name(task.id), [{"role": "user", "content": "Write a title"}]))
    assert title and "<tool_call>" not in title and "```" not in title
    [unknown] = policy.generate([GenerationRequest([1], context=ServeContext("chat", "nobody@0", []))])
    assert unknown.finish_reason == "error" and "nobody" in (unknown.error or "")
    [no_context] = policy.generate([GenerationRequest([1])])
    assert no_context.finish_reason == "error"
    [no_shell] = policy.generate([GenerationRequest([1], context=ServeContext(
        "chat", session_name(task.id), [{"role": "user", "content": "x"}], [READ_TOOL]))])
    assert no_shell.finish_reason == "error" and "no shell tool" in (no_shell.error or "")


def test_session_names_are_url_path_safe() -> None:
    assert session_name("unit/task 1", 2) == "unit_task_1@2"
    assert session_name("ws-test-data-3-0") == "ws-test-data-3-0@0"


def test_install_manifest_decides_what_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_AGENTS", str(tmp_path))
    assert agents_root() == tmp_path
    plan = InstallPlan((Package("npm", "some-agent", "1.2.3"),), ("node_modules/some-agent/bin/*",))
    with pytest.raises(AgentInstallError, match="harnessrl external install some"):
        require_installed("some", plan)
    folder = tmp_path / "some"
    (folder / "node_modules/some-agent/bin").mkdir(parents=True)
    (folder / "node_modules/some-agent/bin/run").write_text("#!/bin/sh\n")
    assert resolve_entry(folder, plan) == "node_modules/some-agent/bin/run"
    assert resolve_entry(folder, replace(plan, native=True)) is None  # a script is not a native binary
    (folder / "manifest.json").write_text(json.dumps({"packages": ["some-agent@1.2.3"],
                                                      "entry": "node_modules/some-agent/bin/run"}))
    assert require_installed("some", plan) == (folder, "node_modules/some-agent/bin/run")
    assert install("some", plan)["entry"] == "node_modules/some-agent/bin/run"  # idempotent: nothing ran
    newer = InstallPlan((Package("npm", "some-agent", "1.2.4"),), plan.entries)
    with pytest.raises(AgentInstallError, match="pinned versions"):
        require_installed("some", newer)
    (folder / "manifest.json").write_text("{not json")
    assert read_manifest("some") is None


def test_unknown_agents_and_bad_configs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="known: mini-swe-agent"):
        get_agent("aider")
    with pytest.raises(ValueError, match="max_steps"):
        ExternalConfig(max_steps=0)
    with pytest.raises(ValueError, match="model"):
        ExternalConfig(model="two words")
    with pytest.raises(ValueError, match="real sandbox"):
        ExternalConfig(backend="none")
    assert set(AGENTS) == {"mini-swe-agent", "claude-code", "codex", "opencode", "openclaw"}


# --------------------------------------------------------------------------------------------
# End to end: real agents in the sandbox against harnessrl serve
# --------------------------------------------------------------------------------------------


# mini_swe_agent: the fixture in conftest.py installs it into the agents cache.


E2E_TASK_IDS = ("ws-test-recovery-4-0", "ws-test-sqlite-1-0", "ws-test-text-4-0")
"""A broken program to repair, a question whose answer the verifier checks, a file edit."""


@pytest.fixture(scope="module")
def workspace_tasks() -> list[Task]:
    tasks = {t.id: t for t in load_suite("workspace").tasks("test")}
    return [tasks[task_id] for task_id in E2E_TASK_IDS]


def test_mini_swe_agent_passes_tasks_by_replaying_gold_through_its_shell(
        mini_swe_agent: str, workspace_tasks: list[Task], tmp_path: Path) -> None:
    config = ExternalConfig(time_limit_s=300, log_dir=str(tmp_path))
    trajectories = evaluate_external(mini_swe_agent, GoldReplayPolicy(workspace_tasks), workspace_tasks, config=config)
    assert [t.task_id for t in trajectories] == [t.id for t in workspace_tasks]
    for task, trajectory in zip(workspace_tasks, trajectories, strict=True):
        assert trajectory.passed, (trajectory.error, trajectory.verdict)
        assert trajectory.status == "submitted" and trajectory.config == "ext:mini-swe-agent"
        actions = [a for a in task.gold if a.kind != "submit"]
        # one request per gold action plus the submit, each with the exact sampled ids
        assert len(trajectory.turns) == len(actions) + 1
        assert all(turn.completion_ids for turn in trajectory.turns)
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in trajectory.turns[-1].text
        logs = Path(trajectory.metrics["logs"])
        saved = json.loads((logs / "trajectory.json").read_text())
        assert saved["info"]["exit_status"] == "Submitted"
        if task.expects_answer:
            assert (trajectory.answer or "").strip() == task.gold[-1].answer


def test_mini_swe_agent_that_does_no_work_fails_the_verifier(
        mini_swe_agent: str, workspace_tasks: list[Task]) -> None:
    task = workspace_tasks[0]
    lazy = GoldReplayPolicy(lambda key: replace(task, gold=[Action.submit("")]))
    [trajectory] = evaluate_external(mini_swe_agent, lazy, [task], config=ExternalConfig(time_limit_s=300))
    assert trajectory.status == "submitted" and len(trajectory.turns) == 1
    assert not trajectory.passed
    assert any(not v["passed"] for v in trajectory.verdict)


def test_agent_that_cannot_reach_a_task_is_an_error_trajectory(
        mini_swe_agent: str, workspace_tasks: list[Task]) -> None:
    # The policy knows no task: the server answers every request with an error, the agent gives
    # up, and the trajectory says why (the server's message, from the agent's own stderr).
    task = workspace_tasks[0]
    policy = GoldReplayPolicy([])
    with AgentServer(policy) as server:
        [trajectory] = evaluate_external(mini_swe_agent, policy, [task],
                                         config=ExternalConfig(time_limit_s=120, max_steps=3), server=server)
    assert not trajectory.passed and trajectory.turns == []
    assert trajectory.status == "error" and trajectory.metrics["exit_code"] != 0
    assert "knows no task" in (trajectory.error or ""), trajectory.error


# --------------------------------------------------------------------------------------------
# npm agents: run when installed
# --------------------------------------------------------------------------------------------

NPM_AGENTS = ("claude-code", "codex", "opencode", "openclaw")


def _installed_or_skip(name: str) -> None:
    agent = get_agent(name)
    try:
        require_installed(name, agent.plan())
    except AgentInstallError:
        pytest.skip(f"{name} is not installed: run `harnessrl external install {name}`")


@pytest.mark.external_agent
@pytest.mark.parametrize("name", NPM_AGENTS)
def test_installed_npm_agent_runs_inside_the_sandbox(name: str) -> None:
    from harnessrl.external.run import check_agent

    _installed_or_skip(name)
    version = check_agent(name)
    assert get_agent(name).packages[-1].version.split(".")[0] in version


@pytest.mark.external_agent
@pytest.mark.parametrize("name", NPM_AGENTS)
def test_installed_npm_agent_passes_tasks_by_replaying_gold_through_its_tools(
        name: str, workspace_tasks: list[Task], tmp_path: Path) -> None:
    _installed_or_skip(name)
    tasks = workspace_tasks[:2]
    config = ExternalConfig(time_limit_s=300, log_dir=str(tmp_path))
    trajectories = evaluate_external(name, GoldReplayPolicy(tasks), tasks, config=config)
    for task, trajectory in zip(tasks, trajectories, strict=True):
        assert trajectory.passed, (trajectory.error, trajectory.verdict, trajectory.metrics)
        assert trajectory.config == f"ext:{name}" and trajectory.metrics["apis"] == [get_agent(name).api]
        actions = [a for a in task.gold if a.kind != "submit"]
        # every gold action was one request, and the final answer one more
        assert trajectory.metrics.get("session_requests", len(trajectory.turns)) >= len(actions) + 1
        # (OpenClaw adds a context message to each request and leaves it out of the next; the
        # recorder still keeps its requests in one thread, by the server's own last reply.)
        assert len([turn for turn in trajectory.turns if turn.calls]) == len(actions)
        if task.expects_answer:
            assert task.gold[-1].answer in (trajectory.answer or "")


def test_eval_scores_ext_configurations_next_to_in_space_harnesses(
        mini_swe_agent: str, workspace_tasks: list[Task]) -> None:
    from harnessrl.eval.evaluate import evaluate
    from harnessrl.harness.harness import HarnessLimits
    from harnessrl.policy.scripted import OraclePolicy
    from harnessrl.rollout.settings import RolloutSettings

    tasks = workspace_tasks[1:3]
    limits = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)
    # the agent program on a small fixed subset of the tasks (an experiment's eval.external_tasks)
    result = evaluate(OraclePolicy(), ["S0-T0-O0-C0-W0", "ext:mini-swe-agent"], tasks, settings=RolloutSettings(limits),
                      external_tasks=tasks[:1])
    assert set(result.per_config) == {"S0-T0-O0-C0-W0", "ext:mini-swe-agent"}
    assert result.per_config["ext:mini-swe-agent"]["pass_at_1"] == 1.0
    assert result.per_config["S0-T0-O0-C0-W0"]["episodes"] == 2 and result.per_config["ext:mini-swe-agent"]["episodes"] == 1
    assert [t.task_id for t in result.trajectories if t.config == "ext:mini-swe-agent"] == [tasks[0].id]
    assert result.overall["pass_at_1"] == 1.0 and result.overall["episodes"] == 3


def test_unknown_ext_configuration_is_a_clear_error() -> None:
    from harnessrl.external.run import split_external

    assert split_external(["S0-T0-O0-C0-W0", "ext:codex"]) == (["S0-T0-O0-C0-W0"], ["codex"])
    with pytest.raises(ValueError, match="unknown external agent 'cursor'"):
        split_external(["ext:cursor"])


def test_cli_lists_checks_and_runs_agents(mini_swe_agent: str, capsys: pytest.CaptureFixture[str]) -> None:
    from harnessrl.cli import main

    assert main(["external", "list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(AGENTS) and rows["mini-swe-agent"]["state"] == "installed"
    assert main(["external", "check", "mini-swe-agent"]) == 0
    assert capsys.readouterr().out.strip() == "mini-swe-agent 2.4.6"
    assert main(["external", "run", "mini-swe-agent", "--limit", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 1 and summary["pass_rate"] == 1.0
    assert main(["external", "install", "aider"]) == 2
    assert "unknown external agent 'aider'" in capsys.readouterr().err


def test_eval_cli_runs_agent_programs_on_the_first_tasks_only(
        mini_swe_agent: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harnessrl.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--policy", "oracle", "--configs", "S0-T0-O0-C0-W0,ext:mini-swe-agent", "--limit", "2",
                 "--external-limit", "1", "--out", str(out), "--json"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["per_config"]["S0-T0-O0-C0-W0"]["episodes"] == 2
    assert results["per_config"]["ext:mini-swe-agent"]["episodes"] == 1 and results["meta"]["external_tasks"] == 1
    assert "1/1 " in capsys.readouterr().err  # the agent runs counted as they end: one
    with pytest.raises(SystemExit, match="--external-limit must be >= 1"):
        main(["eval", "--policy", "oracle", "--configs", "ext:mini-swe-agent", "--limit", "1", "--external-limit", "0"])


def test_install_that_leaves_a_placeholder_fails_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harnessrl.external import install as install_module

    monkeypatch.setenv("HARNESSRL_AGENTS", str(tmp_path))

    def placeholder_npm(folder: Path, plan: InstallPlan) -> None:  # what npm leaves on too old a Node
        (folder / "node_modules/openclaw").mkdir(parents=True)
        (folder / "node_modules/openclaw/openclaw.mjs").write_text("")

    monkeypatch.setattr(install_module, "_install_npm", placeholder_npm)
    plan = get_agent("openclaw").plan()
    with pytest.raises(AgentInstallError, match="empty placeholder"):
        install("openclaw", plan)
    assert read_manifest("openclaw") is None
    monkeypatch.setattr(install_module, "_install_npm", lambda folder, plan: None)
    with pytest.raises(AgentInstallError, match="no entry point matches"):
        install("claude-code", get_agent("claude-code").plan())


def test_agent_that_never_acts_ends_with_its_own_format_error_status(
        mini_swe_agent: str, workspace_tasks: list[Task]) -> None:
    from harnessrl.policy.scripted import CallbackPolicy

    rambling = CallbackPolicy(lambda context: "I am not sure what to do.")
    [trajectory] = evaluate_external(mini_swe_agent, rambling, workspace_tasks[:1],
                                     config=ExternalConfig(time_limit_s=120, max_steps=5))
    assert trajectory.status == "format_errors" and not trajectory.passed
    assert [turn.text for turn in trajectory.turns] == ["I am not sure what to do."] * len(trajectory.turns)


def test_agent_that_never_reaches_the_server_is_an_error_trajectory(
        mini_swe_agent: str, workspace_tasks: list[Task]) -> None:
    # 64 MiB of address space: neither the relay nor the agent can start.
    [trajectory] = evaluate_external(mini_swe_agent, GoldReplayPolicy(workspace_tasks), workspace_tasks[:1],
                                     config=ExternalConfig(time_limit_s=60, memory_mb=64))
    assert trajectory.status == "error" and not trajectory.passed and trajectory.turns == []
    assert trajectory.metrics["requests"] == 0 and trajectory.metrics["exit_code"] != 0
    assert "exited with status" in (trajectory.error or "")


def test_external_agent_names_are_what_evaluation_sets_resolve() -> None:
    from harnessrl.external import external_agent_names
    from harnessrl.external.run import evaluate_external_targets

    assert external_agent_names() == list(AGENTS)
    with pytest.raises(ValueError, match="not external targets"):
        evaluate_external_targets(["S0-T0-O0-C0-W0"], GoldReplayPolicy([]), [])
    assert evaluate_external_targets([], GoldReplayPolicy([]), []) == []
