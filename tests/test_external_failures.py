"""Why an external run failed, in its own words; and runs cut by their time limit.

A failed run is an ``error`` trajectory whose ``error`` carries the agent's own reason, read
from its log's known format (the shapes below were recorded from real runs of Claude Code
2.1.328, Codex 0.169.0, opencode 1.18.33 and mini-swe-agent 2.4.6 against a model with a
4,096-token context), else from the error-looking lines of its stderr. mini-swe-agent fails
for real here; fake agent scripts produce the shapes it cannot (an error reported with exit
0, a Claude Code result, a crash with no output). The command line, run in a subprocess,
exits 0 when a run hits its time limit with a generation in flight, keeping the trajectory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import harnessrl
from conftest import save_tiny_model
from harnessrl.cli.external import run_line
from harnessrl.external.agents import (
    LOGS,
    REASON_CHARS,
    AgentRun,
    ClaudeCode,
    ExternalAgent,
    error_lines,
    get_agent,
)
from harnessrl.external.gold_replay import GoldReplayPolicy
from harnessrl.external.install import InstallPlan, Package
from harnessrl.external.run import AgentServer, ExternalConfig, evaluate_external, run_task
from harnessrl.policy.base import Generation, GenerationRequest, Policy
from harnessrl.tasks.model import Action, Task
from harnessrl.tasks.suite import load_suite
from harnessrl.tasks.verify import FileContains

# What the agents wrote when the model's context was too small (abridged, fields kept).
CLAUDE_RESULT = {
    "type": "result", "subtype": "success", "is_error": True, "api_error_status": 400,
    "api_error_type": "invalid_request_error", "terminal_reason": "prompt_too_long", "num_turns": 1,
    "result": "Prompt is too long \u00b7 the request is ~12459 tokens (limit 4096) but this conversation is"
              " only ~2546 tokens",
}
CLAUDE_WARNING = '[claude-code:unrecognized_model] {"model":"harnessrl","query_source":"sdk"}'
CODEX_EVENTS = [
    {"type": "thread.started", "thread_id": "01a2"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "error",
                                        "message": "Model metadata for `harnessrl` not found."}},
    {"type": "turn.started"},
    {"type": "error", "message": "Codex ran out of room in the model's context window."},
    {"type": "turn.failed", "error": {"message": "Codex ran out of room in the model's context window."}},
]
OPENCODE_ERROR = {"type": "error", "sessionID": "ses_1", "error": {
    "name": "ContextOverflowError",
    "data": {"message": "This model's maximum context length is 4096 tokens. However, your messages resulted"
                        " in 7416 tokens."}}}
RICH_TRACEBACK = """Warning: Input is not a terminal (fd=0).
\u256d\u2500\u2500\u2500\u2500 Traceback (most recent call last) \u2500\u2500\u2500\u2500\u256e
\u2502    946 \u2502   \u2502   except (OpenAIError, UnsupportedParamsError):      \u2502
\u2502 \u2771  945 \u2502   \u2502   \u2502   raise e                                  \u2502
\u2570\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u256f
InternalServerError: litellm.InternalServerError: InternalServerError:
OpenAIException - the model ran out of memory
"""


def _jsonl(events: list[dict]) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


def _run_with_logs(tmp_path: Path, files: dict[str, str]) -> AgentRun:
    (tmp_path / "logs").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (tmp_path / "logs" / name).write_text(text, encoding="utf-8")
    return AgentRun(session="s@0", base_url="http://127.0.0.1:1/s/s@0", model="m", api_key="k",
                    max_steps=3, time_limit_s=60.0, state=tmp_path)


def test_each_agents_reported_error_is_read_from_its_own_log_format(tmp_path: Path) -> None:
    claude = _run_with_logs(tmp_path / "claude", {"claude.jsonl": _jsonl([{"type": "system"}, CLAUDE_RESULT])})
    assert get_agent("claude-code").status(claude) == "submitted"  # what the agent calls it
    assert get_agent("claude-code").reported_error(claude) == (
        "prompt_too_long (API 400): " + CLAUDE_RESULT["result"])
    turns = _run_with_logs(tmp_path / "turns", {"claude.jsonl": _jsonl([{**CLAUDE_RESULT, "subtype": "error_max_turns"}])})
    assert get_agent("claude-code").reported_error(turns) is None  # the turn limit is an outcome

    codex = _run_with_logs(tmp_path / "codex", {"codex.jsonl": _jsonl(CODEX_EVENTS)})
    assert get_agent("codex").reported_error(codex) == "Codex ran out of room in the model's context window."
    recovered = _run_with_logs(tmp_path / "codex-ok", {"codex.jsonl": _jsonl([*CODEX_EVENTS, {"type": "turn.completed"}])})
    assert get_agent("codex").reported_error(recovered) is None

    opencode = _run_with_logs(tmp_path / "opencode", {"opencode.jsonl": _jsonl([OPENCODE_ERROR, {"type": "step_start"}])})
    assert get_agent("opencode").reported_error(opencode) == (
        "ContextOverflowError: " + OPENCODE_ERROR["error"]["data"]["message"])
    answered = _run_with_logs(tmp_path / "opencode-ok", {"opencode.jsonl": _jsonl(
        [OPENCODE_ERROR, {"type": "text", "part": {"type": "text", "text": "done"}}])})
    assert get_agent("opencode").reported_error(answered) is None

    trajectory = {"info": {"exit_status": "InternalServerError", "submission": ""},
                  "messages": [{"role": "exit", "content": "x", "extra": {
                      "exit_status": "InternalServerError", "exception_str": "litellm.InternalServerError: " + "x" * 900}}]}
    mini = _run_with_logs(tmp_path / "mini", {"trajectory.json": json.dumps(trajectory)})
    reason = get_agent("mini-swe-agent").reported_error(mini) or ""
    assert reason.startswith("InternalServerError: litellm.InternalServerError: xxx")
    assert len(reason) == REASON_CHARS and reason.endswith("\u2026")  # bounded, and says so
    trajectory["info"]["exit_status"] = "Submitted"
    submitted = _run_with_logs(tmp_path / "mini-ok", {"trajectory.json": json.dumps(trajectory)})
    assert get_agent("mini-swe-agent").reported_error(submitted) is None


def test_error_lines_are_the_last_error_looking_lines_without_traceback_frames() -> None:
    assert error_lines(RICH_TRACEBACK) == (
        "InternalServerError: litellm.InternalServerError: InternalServerError: | "
        "OpenAIException - the model ran out of memory")
    assert error_lines("all good\nnothing to see\n") is None
    assert len(error_lines("error: " + "e" * 5000) or "") == REASON_CHARS


# --------------------------------------------------------------------------------------------
# A real agent failing for a known reason
# --------------------------------------------------------------------------------------------


class BrokenModel(Policy):
    """A policy whose every generation fails with one message (the server answers 500)."""

    name = "broken"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        return [Generation([], [], "error", error="the model ran out of memory (a test)") for _ in requests]


@pytest.fixture(scope="module")
def task() -> Task:
    return next(iter(load_suite("workspace").tasks("test", limit=1, seed=0)))


def test_mini_swe_agent_failing_on_a_server_error_gives_its_own_reason(mini_swe_agent: str, task: Task) -> None:
    from harnessrl.harness.chat import ByteTokenizer

    [trajectory] = evaluate_external(mini_swe_agent, BrokenModel(ByteTokenizer()), [task],
                                     config=ExternalConfig(time_limit_s=120, max_steps=3))
    assert trajectory.status == "error" and not trajectory.passed and trajectory.turns == []
    assert trajectory.metrics["exit_code"] == 1
    reason = trajectory.metrics["agent_error"]
    # mini-swe-agent's own record of the exception that ended it, not its framed traceback
    assert reason.startswith("InternalServerError: ") and "the model ran out of memory (a test)" in reason
    assert "\u2502" not in reason and len(reason) <= REASON_CHARS
    assert trajectory.error == f"the agent exited with status 1: {reason}"
    assert run_line(trajectory) == (
        f"FAIL {task.id} [ext:mini-swe-agent] status=error requests=0 exit=1 error={trajectory.error}")


CONTEXT_OVERFLOW_REASONS = {
    "claude-code": "prompt_too_long (API 400): Prompt is too long",
    "codex": "Codex ran out of room in the model's context window",
    "opencode": "ContextOverflowError: This model's maximum context length is 4096 tokens",
}


@pytest.mark.external_agent
@pytest.mark.parametrize("name", sorted(CONTEXT_OVERFLOW_REASONS))
def test_installed_npm_agent_on_a_too_small_context_says_why_in_its_own_words(
        name: str, task: Task, tmp_path_factory) -> None:
    from harnessrl.external.install import AgentInstallError, require_installed
    from harnessrl.policy.hf import HFPolicy

    try:
        require_installed(name, get_agent(name).plan())
    except AgentInstallError:
        pytest.skip(f"{name} is not installed: run `harnessrl external install {name}`")
    short = HFPolicy(save_tiny_model(tmp_path_factory, "short-4k", max_position_embeddings=4096), device="cpu")
    # (opencode retries after the error until the time limit ends it)
    [trajectory] = evaluate_external(name, short, [task], config=ExternalConfig(time_limit_s=45, max_steps=3))
    assert trajectory.status == "error" and not trajectory.passed
    assert (trajectory.error or "").startswith("prompt ") and "tokens > context 4096; the agent " in trajectory.error
    assert CONTEXT_OVERFLOW_REASONS[name] in (trajectory.metrics["agent_error"] or "")
    assert trajectory.metrics["agent_error"] in trajectory.error
    assert "unrecognized_model" not in trajectory.error  # Claude Code's warning on stderr is not the cause


# --------------------------------------------------------------------------------------------
# Fake agents: failure shapes mini-swe-agent cannot produce
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_agents_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An agents folder the sandbox user can read (the fake agents are installed in it)."""
    root = Path(tempfile.mkdtemp(prefix="harnessrl-fake-agents-"))
    os.chmod(root, 0o755)
    monkeypatch.setenv("HARNESSRL_AGENTS", str(root))
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


def _install_fake(root: Path, agent: ExternalAgent) -> None:
    folder = root / agent.name
    folder.mkdir(mode=0o755)
    (folder / "agent.sh").write_text("#!/bin/sh\n", encoding="utf-8")
    (folder / "manifest.json").write_text(json.dumps(
        {"name": agent.name, "packages": agent.plan().specs, "entry": "agent.sh"}), encoding="utf-8")


class FakeAgent(ExternalAgent):
    """An agent program that is a shell script: ``script`` runs in the workspace."""

    api = "chat"
    description = "a shell script"
    entries = ("agent.sh",)
    native = False

    def __init__(self, name: str, script: str) -> None:
        self.name, self.script = name, script
        self.packages = (Package("npm", name, "0.0.1"),)

    def plan(self) -> InstallPlan:
        return InstallPlan(self.packages, self.entries, native=False)

    def command(self, run: AgentRun, entry: str) -> str:
        return f"sh -c {shlex.quote(self.script)}"


class FakeClaude(ClaudeCode):
    """Claude Code's log and stderr, written by a script: the real parser reads them."""

    def __init__(self, script: str) -> None:
        self.name, self.script = "fake-claude", script
        self.packages = (Package("npm", "fake-claude", "0.0.1"),)

    def plan(self) -> InstallPlan:
        return InstallPlan(self.packages, ("agent.sh",), native=False)

    def command(self, run: AgentRun, entry: str) -> str:
        return f"sh -c {shlex.quote(self.script)}"


def _write(path: str, text: str) -> str:
    return f"printf '%s' {shlex.quote(text)} > {path}"


def _fake_task() -> Task:
    return Task(id="fake/task-1", instruction="Write notes.", verifier=FileContains("notes.txt", "beta"),
                gold=[Action.write("notes.txt", "beta\n")])


def _run_fake(root: Path, agent: ExternalAgent):
    _install_fake(root, agent)
    policy = GoldReplayPolicy([])
    with AgentServer(policy) as server:
        return run_task(agent, _fake_task(), server, ExternalConfig(time_limit_s=60))


CLAUDE_LOG = _write(f"{LOGS}/claude.jsonl", _jsonl([{"type": "system", "subtype": "init"}, CLAUDE_RESULT]))


def test_claude_code_exiting_on_an_api_error_is_an_error_with_its_reason_not_the_stderr_warning(
        fake_agents_root: Path) -> None:
    trajectory = _run_fake(fake_agents_root, FakeClaude(f"{CLAUDE_LOG}; echo {shlex.quote(CLAUDE_WARNING)} >&2; exit 1"))
    assert trajectory.status == "error"  # its result event says "success"
    assert trajectory.error == "the agent exited with status 1: prompt_too_long (API 400): " + CLAUDE_RESULT["result"]
    assert "unrecognized_model" not in trajectory.error


def test_an_error_reported_with_exit_status_0_is_not_a_clean_submit(fake_agents_root: Path) -> None:
    trajectory = _run_fake(fake_agents_root, FakeClaude(f"{CLAUDE_LOG}; exit 0"))
    assert trajectory.metrics["exit_code"] == 0
    assert trajectory.status == "error" and not trajectory.passed
    assert trajectory.error == "the agent reported an error: prompt_too_long (API 400): " + CLAUDE_RESULT["result"]
    assert "exit=" not in run_line(trajectory) and "error=the agent reported an error" in run_line(trajectory)


def test_an_agent_without_a_known_log_format_gives_its_last_error_lines(fake_agents_root: Path) -> None:
    script = ("echo 'starting up' >&2; echo 'Traceback (most recent call last):' >&2;"
              " echo '  File \"agent.py\", line 3' >&2; echo 'RuntimeError: connection refused by 127.0.0.1' >&2;"
              " echo 'bye' >&2; exit 3")
    trajectory = _run_fake(fake_agents_root, FakeAgent("fake-generic", script))
    assert trajectory.status == "error" and trajectory.metrics["exit_code"] == 3
    assert trajectory.error == ("the agent exited with status 3: Traceback (most recent call last): | "
                                "RuntimeError: connection refused by 127.0.0.1")


def test_an_agent_that_crashes_without_a_word_is_an_error_with_its_exit_status(fake_agents_root: Path) -> None:
    trajectory = _run_fake(fake_agents_root, FakeAgent("fake-crash", "kill -SEGV $$"))
    assert trajectory.status == "error" and trajectory.metrics["exit_code"] == 139
    assert (trajectory.error or "").startswith("the agent exited with status 139")
    assert " exit=139 " in run_line(trajectory)


def test_an_agent_that_ends_quietly_with_exit_status_0_is_submitted(fake_agents_root: Path) -> None:
    trajectory = _run_fake(fake_agents_root, FakeAgent("fake-done", "echo beta > notes.txt"))
    assert trajectory.status == "submitted" and trajectory.passed and trajectory.error is None
    assert trajectory.metrics["agent_error"] is None


# --------------------------------------------------------------------------------------------
# The command line at the agent's time limit, in a subprocess
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endless_model(tmp_path_factory) -> Path:
    """A tiny model that never samples its stop token, with a 131,072-token context: its
    answer to an agent is still being sampled when the agent's time limit ends the run.

    Attention and MLP outputs are zero, so the last hidden state is the current token's
    embedding, whose first coordinate is 1 for every token; the stop token's is -1, so
    through the tied output layer its logit is about 11 below every other token's.
    """
    import torch
    import transformers

    from harnessrl.harness.chat import HFChatTokenizer

    folder = save_tiny_model(tmp_path_factory, "endless", max_position_embeddings=1 << 17)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    stop_ids = HFChatTokenizer(transformers.AutoTokenizer.from_pretrained(folder)).stop_token_ids
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.get_input_embeddings().weight
        embeddings[:, 0] = 1.0
        embeddings[list(stop_ids), 0] = -1.0
    model.save_pretrained(folder)
    return folder


def test_a_run_cut_at_its_time_limit_frees_the_policy_for_the_next_run(
        mini_swe_agent: str, endless_model: Path) -> None:
    from harnessrl.policy.hf import HFPolicy

    class Counting(HFPolicy):
        """Keeps how each generation the server ran ended (batch at a time, or continuous)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.reasons: list[str] = []

        def generate_stream(self, requests, on_tokens):
            generations = super().generate_stream(requests, on_tokens)
            self.reasons += [generation.finish_reason for generation in generations]
            return generations

        @contextlib.contextmanager
        def continuous(self):
            with super().continuous() as decoder:
                step = decoder.step

                def counted():
                    finished = step()
                    self.reasons += [generation.finish_reason for _, generation in finished]
                    return finished

                decoder.step = counted
                yield decoder

    policy = Counting(endless_model, device="cpu")
    tasks = list(load_suite("workspace").tasks("test", limit=2, seed=0))
    trajectories = evaluate_external(mini_swe_agent, policy, tasks,
                                     config=ExternalConfig(time_limit_s=20, max_tokens=100_000))
    assert [t.metrics["timed_out"] for t in trajectories] == [True, True]
    # Each run's request (100,000 tokens) was ended with its run: the policy did not go on
    # sampling for an agent that was gone, and the second run's request was answered too.
    assert policy.reasons == ["abort", "abort"]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    source = str(Path(harnessrl.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "harnessrl.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=600, check=False)


def test_eval_agent_time_limit_ends_the_run_and_the_process_exits_cleanly(
        mini_swe_agent: str, endless_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    done = _cli("eval", "--policy", f"hf:{endless_model}", "--configs", "ext:mini-swe-agent", "--limit", "1",
                "--agent-time-limit", "15", "--max-new-tokens", "100000", "--context-tokens", str(1 << 17),
                "--out", str(out), "--json")
    # A generation still in flight at exit used to abort the interpreter (exit 134).
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    [trajectory] = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert trajectory["config"] == "ext:mini-swe-agent" and trajectory["status"] == "error"
    assert trajectory["metrics"]["timed_out"] and trajectory["error"] == "the agent did not finish within 15 s"
    assert json.loads(done.stdout)["per_config"]["ext:mini-swe-agent"]["statuses"] == {"error": 1}
    assert "1/1 FAIL" in done.stderr and "error=the agent did not finish within 15 s" in done.stderr


def test_external_run_at_its_time_limit_keeps_the_trajectory_and_exits_cleanly(
        mini_swe_agent: str, endless_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    done = _cli("external", "run", "mini-swe-agent", "--policy", f"hf:{endless_model}", "--limit", "1",
                "--time-limit", "15", "--max-tokens", "100000", "--out", str(out))
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    [trajectory] = [json.loads(line) for line in out.read_text().splitlines()]
    assert trajectory["status"] == "error" and trajectory["metrics"]["timed_out"]
    assert "status=error" in done.stdout and "error=the agent did not finish within 15 s" in done.stdout
