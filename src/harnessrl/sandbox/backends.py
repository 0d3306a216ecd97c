"""The backends (bwrap, unshare, none), probing which work here, and `open_sandbox`."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import warnings
from collections.abc import Sequence

from harnessrl.sandbox.api import (
    SANDBOX_HOST_UID,
    SandboxLimits,
    SandboxMount,
    SandboxUnavailableError,
    check_backend_name,
    check_mounts,
    checked_env,
)
from harnessrl.sandbox.base import Sandbox
from harnessrl.sandbox.isolation import (
    bwrap_argv,
    bwrap_sizes_tmpfs,
    give_tree,
    mount_plan,
    unshare_setup_script,
)
from harnessrl.sandbox.session import ServerSandbox
from harnessrl.sandbox.workspace import Workspace

logger = logging.getLogger(__name__)

class _BwrapSandbox(ServerSandbox):
    """bubblewrap backend (docs/sandbox.md says what it isolates)."""

    backend = "bwrap"
    _scratch: Workspace | None = None  # /tmp and /dev/shm where bwrap cannot size a tmpfs

    def _launch_argv(self) -> list[str]:
        plan = mount_plan(str(self.workspace.root), self._host_uid, self._mounts)
        return bwrap_argv(plan, self.limits.memory_mb << 20, scratch=self._fresh_scratch())

    def _fresh_scratch(self) -> str | None:
        """None where bwrap sizes its tmpfs (``--size``). Older bwrap (before 0.8.0) mounts them
        unsized: half the machine's memory each. There ``/tmp`` and ``/dev/shm`` are the folders
        ``tmp`` and ``shm`` of a fresh host folder of their own, sized like the workspace: a tmpfs
        of ``memory_mb`` for both where this process may mount (root), else on disk, limited per
        file. A restarted server gets a fresh one, as it would get fresh tmpfs."""
        if bwrap_sizes_tmpfs():
            return None
        if self._scratch is not None:
            self._scratch.close()
        self._scratch = Workspace(prefix="harnessrl-scratch-", quota_mb=self.limits.memory_mb)
        for name in ("tmp", "shm"):
            (self._scratch.root / name).mkdir()
            os.chmod(self._scratch.root / name, 0o1777)  # as /tmp is
        os.chmod(self._scratch.root, 0o755)
        if self._host_uid is not None:
            give_tree(str(self._scratch.root), self._host_uid)
        return str(self._scratch.root)

    def close(self) -> None:
        super().close()
        if self._scratch is not None:
            self._scratch.close()


class _UnshareSandbox(ServerSandbox):
    """util-linux unshare backend (docs/sandbox.md says what it does not isolate)."""

    backend = "unshare"

    def _launch_argv(self) -> list[str]:
        plan = mount_plan(str(self.workspace.root), self._host_uid, self._mounts)
        script = unshare_setup_script(plan, self.limits.memory_mb << 20)
        return [
            "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
            "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts",
            "--", "/bin/sh", "-c", script, "harnessrl-setup",
        ]

    def _harden(self) -> bool:
        return True


class _UnsandboxedSandbox(ServerSandbox):
    """``none`` backend: same protocol and limits, NO isolation. For debugging only."""

    backend = "none"

    def __init__(self, workspace: Workspace, limits: SandboxLimits, owns_workspace: bool,
                 env: dict[str, str] | None = None) -> None:
        message = (
            "harnessrl sandbox backend 'none': commands run on the host WITHOUT ANY ISOLATION"
            " (full network, filesystem and process access as the current user). Use it only"
            " for trusted commands and debugging."
        )
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        logger.warning(message)
        super().__init__(workspace, limits, owns_workspace, host_uid=None, env=env)

    def _inside_root(self) -> str:
        return str(self.workspace.root)

    def _home(self) -> str:
        return str(self.workspace.root)

    def _user(self) -> str:
        import pwd

        with contextlib.suppress(KeyError):
            return pwd.getpwuid(os.getuid()).pw_name
        return str(os.getuid())

    def _launch_argv(self) -> list[str]:
        return []

    def _launch_cwd(self) -> str:
        return str(self.workspace.root)


_BACKEND_CLASSES: dict[str, type[ServerSandbox]] = {
    "bwrap": _BwrapSandbox,
    "unshare": _UnshareSandbox,
}

# The only module-level mutable state: per backend, how it runs here (the host uid to run the
# sandbox as) or why it cannot. Probed once per process, under a lock.
_PROBE_LOCK = threading.Lock()
_PROBES: dict[str, tuple[bool, int | None, str]] = {}


def probe_backend(backend: str) -> tuple[bool, int | None, str]:
    """Return (usable, host_uid, reason) for a real backend, trying it for real once."""
    with _PROBE_LOCK:
        if backend in _PROBES:
            return _PROBES[backend]
        result = _probe_uncached(backend)
        _PROBES[backend] = result
        return result


def _probe_uncached(backend: str) -> tuple[bool, int | None, str]:
    tool = "bwrap" if backend == "bwrap" else "unshare"
    if shutil.which(tool) is None:
        return False, None, f"`{tool}` is not installed"
    # As root, prefer an unprivileged host uid: RLIMIT_NPROC is not enforced for uid 0.
    candidates: list[int | None] = [SANDBOX_HOST_UID, None] if os.geteuid() == 0 else [None]
    reasons = []
    for host_uid in candidates:
        workspace = Workspace(prefix="harnessrl-probe-")
        try:
            sandbox = _BACKEND_CLASSES[backend](workspace, SandboxLimits(timeout_s=10.0), True, host_uid)
            try:
                result = sandbox.exec("echo ok")
            finally:
                sandbox.close()
            if result.stdout.strip() == "ok":
                if host_uid is None and os.geteuid() == 0:
                    logger.warning(
                        "sandbox %s runs as host root: the max_processes limit is not enforced", backend)
                return True, host_uid, ""
            reasons.append(f"test command failed: {result.stderr.strip()[:300]}")
        except (SandboxUnavailableError, OSError) as exc:
            reasons.append(str(exc))
        finally:
            workspace.close()
    return False, None, "; ".join(reasons)


def available_backends() -> list[str]:
    """Return the backends that work on this machine, best first; ``none`` is always last."""
    return [name for name in ("bwrap", "unshare") if probe_backend(name)[0]] + ["none"]


def open_sandbox(workspace: Workspace | None = None, backend: str = "auto",
                 limits: SandboxLimits | None = None, mounts: Sequence[SandboxMount] = (),
                 env: dict[str, str] | None = None) -> Sandbox:
    """Start a sandbox on ``workspace`` and return it.

    ``backend`` is "auto" (bwrap if usable, else unshare), "bwrap", "unshare" or "none" (no
    isolation; warns). When ``workspace`` is None a fresh one is created and closed with the
    sandbox. ``mounts`` adds host directories (`SandboxMount`; not with "none", which has no
    filesystem of its own) and ``env`` adds or overrides variables of the commands' otherwise
    fixed environment. Raises `SandboxUnavailableError` when the backend cannot run here.
    """
    check_backend_name(backend)
    limits = limits if limits is not None else SandboxLimits()
    mounts = tuple(mounts)
    env = checked_env(env)
    check_mounts(mounts)
    if mounts and backend == "none":
        raise ValueError("sandbox backend 'none' cannot show extra mounts; use bwrap or unshare")
    chosen, host_uid = backend, None
    if backend == "auto":
        reasons = []
        for name in ("bwrap", "unshare"):
            usable, host_uid, reason = probe_backend(name)
            if usable:
                chosen = name
                break
            reasons.append(f"{name}: {reason}")
        else:
            raise SandboxUnavailableError(
                "no sandbox backend works on this machine (" + "; ".join(reasons) + "). Install "
                "bubblewrap (e.g. `apt-get install bubblewrap`), or pass backend='none' explicitly "
                "to run commands WITHOUT isolation."
            )
    elif backend != "none":
        usable, host_uid, reason = probe_backend(backend)
        if not usable:
            raise SandboxUnavailableError(f"sandbox backend {backend!r} does not work here: {reason}")
    owns = workspace is None
    workspace = workspace if workspace is not None else Workspace(quota_mb=limits.disk_mb)
    try:
        if chosen == "none":
            return _UnsandboxedSandbox(workspace, limits, owns, env=env)
        return _BACKEND_CLASSES[chosen](workspace, limits, owns, host_uid, mounts=mounts, env=env)
    except BaseException:
        if owns:
            workspace.close()
        raise
