"""Running an external agent on tasks: server, sandbox, relay, agent, verifier, trajectory.

`AgentServer` serves a policy (`harnessrl serve`) on a Unix socket in a folder of its own,
with a random operator key it keeps to itself, a recorder, and the relay program beside the
socket. For each task, `run_task` gives the agent a key of the run's own session (it can call
the server as that session only, and the key is revoked when the run ends), lays the task's workspace into a fresh sandbox that also shows the agent's install
folder (read-only), the server's folder (read-only) and a fresh state folder (HOME, logs, the
task text; writable); inside it starts the relay on ``127.0.0.1:RELAY_PORT`` and then the
agent, non-interactively, under the run's time limit. When the agent exits (or is killed at
the limit) the task's verifier scores the workspace, with the agent's final answer for tasks
that check one. The result is the server's recording of the session as a `Trajectory`
(``config="ext:<name>"``, one turn per request, exact token ids), with status, verdict, the
agent's exit and timing in ``metrics``; the agent's own logs are kept under ``log_dir``.

A run that fails says why in ``Trajectory.error``, with status ``error``: it did not start,
hit the time limit, exceeded the model's context (``prompt N tokens > context M``), exited
non-zero (``the agent exited with status N: <reason>``) or reported an error while exiting 0
(``the agent reported an error: <reason>``). The reason is the agent's own, bounded to a few
hundred characters and also kept as ``metrics["agent_error"]``: the error its log reports in
its known format (`ExternalAgent.reported_error`), else the last error-looking lines of its
stderr (`error_lines`), else the end of its stderr.

The sandbox keeps its guarantees: the agent and every command it runs are confined to the
workspace and the state folder, and the network namespace has only loopback, where the
relay is the one thing listening.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.external import EXTERNAL_PREFIX
from harnessrl.external.agents import (
    AGENT_MOUNT,
    LOGS,
    RELAY_PORT,
    SERVE_MOUNT,
    STATE_MOUNT,
    STDERR_LOG,
    TASK_FILE,
    AgentRun,
    ExternalAgent,
    bounded,
    error_lines,
    get_agent,
)
from harnessrl.external.gold_replay import session_name
from harnessrl.external.install import require_installed
from harnessrl.harness.limits import is_bytewise
from harnessrl.policy.base import Policy
from harnessrl.policy.forced import ForcedSampling
from harnessrl.sandbox import (
    WORKSPACE_MOUNT,
    ExecResult,
    SandboxLimits,
    SandboxMount,
    Workspace,
    open_sandbox,
)
from harnessrl.tasks.model import Task, prepare_workspace, verify_task
from harnessrl.trajectory import Trajectory

logger = logging.getLogger(__name__)

SOCKET_NAME = "serve.sock"
RELAY_SOURCE = Path(__file__).with_name("relay.py")


@dataclass(frozen=True)
class ExternalConfig:
    """How external agents run.

    Attributes:
        model: the model name the agent is told to use (the server answers to any).
        max_steps: the agent's own step or turn limit, where it has one.
        time_limit_s: wall-clock seconds for one agent run; it is killed after that.
        memory_mb: address space per process in MiB; None: the agent's own need (what it was
            seen to run with here: 4 GiB for mini-swe-agent and Codex, 8 GiB for Claude Code,
            16 GiB for opencode and OpenClaw, whose JavaScript engines reserve a lot).
        max_processes: processes and threads of the sandbox user.
        backend: the sandbox backend: auto, bwrap or unshare (``none`` cannot mount).
        log_dir: keep each run's agent logs under ``log_dir/<agent>/<session>/``.
        max_tokens: the server's output limit for requests that name none (litellm sends
            none); None: 65,536 for policies that write bytewise (scripted ones write whole
            gold commands), 4,096 for a model on a GPU, else 1,024 (a CPU samples a few
            tokens a second: 4,096 would hold one request for many minutes).
        temperature: when set, every request of the agent samples at this temperature
            (top-p 1), whatever it asked for: an evaluation's own sampling (`ForcedSampling`);
            None: the agent's.
    """

    model: str = "harnessrl"
    max_steps: int = 40
    time_limit_s: float = 900.0
    memory_mb: int | None = None
    max_processes: int = 1024
    backend: str = "auto"
    log_dir: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None

    def __post_init__(self) -> None:
        if not self.model or any(c.isspace() for c in self.model):
            raise ValueError(f"ExternalConfig.model must be a non-empty name without spaces, got {self.model!r}")
        if self.max_steps < 1:
            raise ValueError(f"ExternalConfig.max_steps must be >= 1, got {self.max_steps}")
        if not self.time_limit_s > 0:
            raise ValueError(f"ExternalConfig.time_limit_s must be > 0, got {self.time_limit_s}")
        if self.backend not in ("auto", "bwrap", "unshare"):
            raise ValueError(
                f"ExternalConfig.backend must be auto, bwrap or unshare, got {self.backend!r} (an"
                " external agent always runs in a real sandbox: 'none' cannot mount its folders)")


CPU_MAX_TOKENS, GPU_MAX_TOKENS, BYTEWISE_MAX_TOKENS = 1024, 4096, 1 << 16


def default_max_tokens(policy: Policy) -> int:
    """Returns the output limit of requests that name none (see ``ExternalConfig.max_tokens``):
    scripted policies (``is_bytewise``) write whole commands byte by byte."""
    if is_bytewise(policy):
        return BYTEWISE_MAX_TOKENS
    device = getattr(policy, "device", None)
    return GPU_MAX_TOKENS if getattr(device, "type", None) == "cuda" else CPU_MAX_TOKENS


class AgentServer:
    """`harnessrl serve` over ``policy`` on a Unix socket that sandboxes can mount (see the
    module docstring); a context manager. ``recorder`` holds every session's requests."""

    def __init__(self, policy: Policy, model_name: str = "harnessrl", max_tokens: int | None = None) -> None:
        from harnessrl.serve.app import create_app
        from harnessrl.serve.auth import Credentials
        from harnessrl.serve.recorder import ConversationRecorder

        self.api_key = "harnessrl-" + secrets.token_hex(16)  # the operator's: never given to an agent
        self.credentials = Credentials(self.api_key)
        self.recorder = ConversationRecorder()
        self.folder = Path(tempfile.mkdtemp(prefix="harnessrl-serve-"))
        os.chmod(self.folder, 0o755)  # the sandbox user connects to the socket in it
        shutil.copyfile(RELAY_SOURCE, self.folder / "relay.py")
        os.chmod(self.folder / "relay.py", 0o644)
        if max_tokens is None:
            max_tokens = default_max_tokens(policy)
        self.max_tokens = max_tokens
        self.app = create_app(policy, model_name=model_name, credentials=self.credentials,
                              recorder=self.recorder, default_max_tokens=max_tokens)
        self._thread: Any = None

    def session_key(self, session: str) -> str:
        """Returns a new key that calls the server as ``session`` and cannot name another one
        (``serve/auth.py``); `revoke` withdraws it when the run ends."""
        return self.credentials.issue(session)

    def revoke(self, session: str) -> None:
        """Withdraws the keys of ``session``: a process the run left behind can no longer call."""
        self.credentials.revoke(session)

    @property
    def socket_path(self) -> Path:
        return self.folder / SOCKET_NAME

    def start(self) -> AgentServer:
        """Starts serving; returns self."""
        from harnessrl.serve.runner import ServerThread

        self._thread = ServerThread(self.app, uds=str(self.socket_path)).start()
        os.chmod(self.socket_path, 0o666)  # the key, not the file mode, guards it
        return self

    def close(self) -> None:
        """Stops the server and removes its folder: first the policy worker, which ends the
        generation in progress at its next token (the request of an agent killed at its time
        limit can hold it for minutes, and a thread left inside the model aborts the
        interpreter's exit), so that the server's graceful shutdown waits for nothing."""
        self.app.state.engine.close()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def agent_limits(config: ExternalConfig, agent: ExternalAgent) -> SandboxLimits:
    """Returns the sandbox limits of one agent run: the whole run is one command."""
    return SandboxLimits(
        timeout_s=config.time_limit_s, cpu_s=max(1, int(config.time_limit_s)),
        memory_mb=config.memory_mb or agent.memory_mb, max_processes=config.max_processes,
        file_size_mb=1024, output_bytes=1 << 16, disk_mb=2048,  # its files and caches in the workspace
    )


def agent_command(agent: ExternalAgent, run: AgentRun, entry: str) -> str:
    """Returns the one shell command of a run: start the relay, then the agent in the workspace,
    its stdout and stderr kept in the logs folder."""
    relay = (f"python3 -I -S {SERVE_MOUNT}/relay.py 127.0.0.1 {RELAY_PORT}"
             f" {SERVE_MOUNT}/{SOCKET_NAME} >{LOGS}/relay.log 2>&1")
    inner = agent.command(run, f"{AGENT_MOUNT}/{entry}")
    return f"{relay} && cd {WORKSPACE_MOUNT} && {{ {inner} ; }} 2>{LOGS}/{STDERR_LOG} </dev/null"


def _state_folder(task: Task) -> Path:
    state = Path(tempfile.mkdtemp(prefix="harnessrl-agent-"))
    os.chmod(state, 0o755)
    for name in ("home", "logs"):
        (state / name).mkdir(mode=0o755)
    instruction = (
        f"{task.instruction.strip()}\n\nThe files are in {WORKSPACE_MOUNT}, the current directory."
        " Work there with your tools and finish when the task is done."
    )
    if task.expects_answer:
        instruction += " End with the answer alone as your final message."
    (state / TASK_FILE.removeprefix(STATE_MOUNT + "/")).write_text(instruction + "\n", encoding="utf-8")
    return state


def _keep_logs(state: Path, config: ExternalConfig, agent: ExternalAgent, session: str,
               result: ExecResult | None) -> str | None:
    if config.log_dir is None:
        return None
    target = Path(config.log_dir) / agent.name / session
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(state / "logs", target, symlinks=True, dirs_exist_ok=True)
    if result is not None:
        (target / "command.txt").write_text(
            f"exit {result.exit_code} timed_out={result.timed_out} {result.duration_s:.1f}s\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n", encoding="utf-8")
    return str(target)


def agent_failure(agent: ExternalAgent, run: AgentRun, result: ExecResult) -> str | None:
    """Returns the agent's own reason for a failed run (see the module docstring): the error
    it reported in its log, else the last error-looking lines of its stderr (the sandbox's,
    when the agent never wrote its own), else the end of that stderr; None when it said
    nothing."""
    reported = agent.reported_error(run)
    if reported:
        return reported
    stderr_log = run.host_logs / STDERR_LOG
    stderr = stderr_log.read_text(errors="replace") if stderr_log.exists() else ""
    for text in (stderr, result.stderr):
        if text.strip():
            return error_lines(text) or bounded(text.strip()[-300:])
    return None


def _status(result: ExecResult | None, ended: str | None, error: str | None) -> str:
    """The trajectory status: ``error`` for a run that failed (``error`` says why: it never
    ran, hit the time limit, exited non-zero or reported an error), else how the agent says
    it ended, else ``submitted``."""
    if result is None or result.timed_out or error:
        return "error"
    return ended or "submitted"


def run_task(agent: ExternalAgent, task: Task, server: AgentServer, config: ExternalConfig,
             run: int = 0) -> Trajectory:
    """Runs ``agent`` once on ``task`` against ``server`` and returns the scored trajectory.

    A run that cannot start (sandbox, setup) or whose agent fails is an ``error`` trajectory
    that says why, never an exception; a missing install raises `AgentInstallError`.
    """
    folder, entry = require_installed(agent.name, agent.plan())
    session = session_name(task.id, run)
    state = _state_folder(task)
    agent_run = AgentRun(  # the key, not the guessable name, holds the agent to its session
        session=session, base_url=f"http://127.0.0.1:{RELAY_PORT}/s/{session}", model=config.model,
        api_key=server.session_key(session), max_steps=config.max_steps, time_limit_s=config.time_limit_s,
        state=state,
    )
    result: ExecResult | None = None
    answer: str | None = None
    ended: str | None = None
    verdict = None
    error: str | None = None
    reason: str | None = None  # the agent's own, for a run that failed
    started = time.monotonic()
    limits = agent_limits(config, agent)
    workspace = Workspace(prefix="ws-ext-", quota_mb=limits.disk_mb)
    try:
        agent.prepare(agent_run)
        mounts = [SandboxMount(str(folder), AGENT_MOUNT), SandboxMount(str(server.folder), SERVE_MOUNT),
                  SandboxMount(str(state), STATE_MOUNT, writable=True)]
        with open_sandbox(workspace, backend=config.backend, limits=limits,
                          mounts=mounts, env=agent.env(agent_run)) as sandbox:
            prepare_workspace(task, sandbox)
            result = sandbox.exec(agent_command(agent, agent_run, entry), timeout=config.time_limit_s)
            answer = agent.answer(agent_run, result.stdout)
            ended = agent.status(agent_run)
            verdict = verify_task(task, sandbox, answer)
        if result.timed_out:
            reason = agent.reported_error(agent_run)
            error = f"the agent did not finish within {config.time_limit_s:g} s" + (
                f" (it reported: {reason})" if reason else "")
        elif result.exit_code != 0:
            reason = agent_failure(agent, agent_run, result)
            error = f"the agent exited with status {result.exit_code}" + (f": {reason}" if reason else "")
        elif (reason := agent.reported_error(agent_run)) is not None:
            error = f"the agent reported an error: {reason}"
    except Exception as exc:  # a run that cannot start is a failed episode, not a crash
        logger.warning("external %s on %s: %s", agent.name, task.id, exc)
        error = f"{type(exc).__name__}: {exc}"
    finally:
        server.revoke(session)
        workspace.close()
    log_path = _keep_logs(state, config, agent, session, result)
    shutil.rmtree(state, ignore_errors=True)
    passed = bool(verdict is not None and verdict.passed)
    metrics: dict[str, Any] = {
        "agent": agent.name,
        "exit_code": None if result is None else result.exit_code,
        "timed_out": bool(result is not None and result.timed_out),
        "duration_s": round(time.monotonic() - started, 3),
        "logs": log_path,
        "agent_error": reason,
    }
    overflow = server.app.state.engine.context_overflows.pop(session, None)
    if overflow is not None:  # the real cause, whatever the agent made of the refusal
        error = f"prompt {overflow[0]} tokens > context {overflow[1]}" + (f"; {error}" if error else "")
    status = "error" if overflow is not None else _status(result, ended, error)
    if session in server.recorder.sessions():
        trajectory = server.recorder.to_trajectory(
            session, task_id=task.id, config=f"ext:{agent.name}", harness=agent.name, passed=passed,
            status=status, metrics=metrics,
        )
        server.recorder.end(session)  # its records leave memory: the recorder stays bounded
    else:  # the agent never reached the server
        trajectory = Trajectory(
            task_id=task.id, config=f"ext:{agent.name}", harness=agent.name, passed=passed,
            reward=1.0 if passed else 0.0, status=status, out_of_space=True,
            metrics={"requests": 0, "apis": [], "session": session, **metrics},
        )
    trajectory.metrics.setdefault("turns", len(trajectory.turns))
    trajectory.answer = answer
    trajectory.error = error
    trajectory.seed = run
    if verdict is not None:
        trajectory.verdict = [{"name": r.name, "passed": r.passed, "detail": r.detail} for r in verdict.results]
    return trajectory


def split_external(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Returns (harness names, external agent names) of an evaluation set; ``ext:<name>``
    entries are checked against the known agents."""
    harnesses, external = [], []
    for name in names:
        if name.startswith(EXTERNAL_PREFIX):
            external.append(get_agent(name[len(EXTERNAL_PREFIX):]).name)
        else:
            harnesses.append(name)
    return harnesses, external


def policy_for_external(policy: Policy, tasks: Sequence[Task]) -> Policy:
    """Returns the policy to serve to external agents: the oracle (gold through the harness's
    own tools) becomes `GoldReplayPolicy` (gold through the agent's own tools); any other
    policy is served as it is."""
    from harnessrl.external.gold_replay import GoldReplayPolicy
    from harnessrl.policy.scripted import OraclePolicy

    return GoldReplayPolicy(tasks) if isinstance(policy, OraclePolicy) else policy


def evaluate_external(name: str, policy: Policy, tasks: Sequence[Task], k: int = 1,
                      config: ExternalConfig | None = None,
                      server: AgentServer | None = None,
                      on_trajectory: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Runs external agent ``name`` k times on every task with ``policy`` behind `harnessrl
    serve` and returns the trajectories (``config="ext:<name>"``), task by task.

    Runs go one at a time (each agent is a whole program, and the policy is shared; a run cut
    at its time limit ends the server's generation in progress); pass a started ``server`` to
    reuse one across agents, never one that serves other clients meanwhile. ``on_trajectory`` is called with each run's
    trajectory as it finishes (the command line prints its PASS/FAIL line then).
    """
    agent = get_agent(name)
    config = config or ExternalConfig()
    require_installed(agent.name, agent.plan())
    owned = server is None
    server = server or AgentServer(policy, model_name=config.model, max_tokens=config.max_tokens).start()
    try:
        trajectories = []
        for task in tasks:
            for run in range(k):
                trajectories.append(run_task(agent, task, server, config, run))
                if on_trajectory is not None:
                    on_trajectory(trajectories[-1])
                if trajectories[-1].metrics["timed_out"]:
                    # The killed agent's last request may still be sampled, holding the policy
                    # for the next run: end it (runs go one at a time; the next request starts
                    # a new policy worker).
                    server.app.state.engine.close()
        return trajectories
    finally:
        if owned:
            with contextlib.suppress(Exception):
                server.close()


def check_agent(name: str, backend: str = "auto") -> str:
    """Runs the installed agent's version command inside the sandbox it runs in (its folder
    mounted read-only, a fresh HOME, no network) and returns what it printed; raises
    `AgentInstallError` when it is not installed and `RuntimeError` when it does not run."""
    agent = get_agent(name)
    folder, entry = require_installed(agent.name, agent.plan())
    state = Path(tempfile.mkdtemp(prefix="harnessrl-agent-check-"))
    os.chmod(state, 0o755)
    (state / "home").mkdir(mode=0o755)
    (state / "logs").mkdir(mode=0o755)
    probe = AgentRun(session="check", base_url=f"http://127.0.0.1:{RELAY_PORT}/s/check", model="harnessrl",
                     api_key="unused", max_steps=1, time_limit_s=120.0, state=state)
    try:
        mounts = [SandboxMount(str(folder), AGENT_MOUNT), SandboxMount(str(state), STATE_MOUNT, writable=True)]
        limits = agent_limits(ExternalConfig(time_limit_s=120.0), agent)
        with open_sandbox(backend=backend, limits=limits, mounts=mounts, env=agent.env(probe)) as sandbox:
            result = sandbox.exec(agent.version_command(f"{AGENT_MOUNT}/{entry}"))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if not result.ok:
        raise RuntimeError(f"{name} does not run in the sandbox (exit {result.exit_code}):"
                           f" {(result.stderr or result.stdout).strip()[-800:]}")
    return result.stdout.strip()


def evaluate_external_targets(names: Sequence[str], policy: Policy, tasks: Sequence[Task], k: int = 1,
                              config: ExternalConfig | None = None,
                              on_trajectory: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Runs every ``ext:<name>`` evaluation target k times on every task and returns the
    trajectories: the evaluation's one entry point for external agents. The oracle is served
    as gold replay (`policy_for_external`); ``names`` without the prefix are refused;
    ``on_trajectory`` hears of each run as it ends (see `evaluate_external`)."""
    _harnesses, agents = split_external(names)
    if _harnesses:
        raise ValueError(f"not external targets (ext:<name>): {', '.join(_harnesses)}")
    served = policy_for_external(policy, tasks) if agents else policy
    if config is not None and config.temperature is not None:
        served = ForcedSampling(served, temperature=config.temperature)
    trajectories: list[Trajectory] = []
    for name in agents:
        trajectories += evaluate_external(name, served, tasks, k=k, config=config, on_trajectory=on_trajectory)
    return trajectories
