"""The sandbox's public types: errors, `SandboxLimits`, `ExecResult`, `SandboxMount` and the
constants every backend shares (see docs/sandbox.md)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

WORKSPACE_MOUNT = "/workspace"
"""Where the workspace appears inside the sandbox (bwrap and unshare backends)."""

SANDBOX_HOST_UID = 65534
"""Host uid (``nobody``) the sandbox's root user maps to when harnessrl itself runs as root."""

BACKENDS = ("bwrap", "unshare", "none")
"""Backend names in order of preference; ``none`` is never chosen by ``auto``."""

MAX_COMMAND_BYTES = 1 << 20
"""Longest command `Sandbox.exec` accepts (UTF-8 bytes); longer ones get an error result."""

SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level names that are links into /usr (or directories) on merged-/usr systems."""


class SandboxError(Exception):
    """A refused or failed sandbox operation; ``str(error)`` is a message fit for the model."""


class SandboxUnavailableError(RuntimeError):
    """No usable sandbox backend (or the requested one cannot start); a message for the operator."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to every command.

    Attributes:
        timeout_s: wall-clock seconds per command; the command's whole process group is killed.
        cpu_s: CPU seconds per process (RLIMIT_CPU; SIGXCPU, then SIGKILL one second later).
        memory_mb: address space per process in MiB (RLIMIT_AS); also the size of the private /tmp.
        max_processes: processes (and threads) of the sandbox user (RLIMIT_NPROC, counted per
            sandbox because each sandbox has its own user namespace; the server, the master
            shell and the spare shell count too).
        file_size_mb: largest file a command may write, in MiB (RLIMIT_FSIZE).
        output_bytes: bytes kept per stream (stdout, stderr); the head and the tail are kept
            around a truncation marker.
        disk_mb: total size of the workspace `open_sandbox` makes, in MiB: a size-limited tmpfs
            where the host process may mount one (root); 0 = no quota (`Workspace`).
    """

    timeout_s: float = 30.0
    cpu_s: int = 60
    memory_mb: int = 2048
    max_processes: int = 128
    file_size_mb: int = 64
    output_bytes: int = 65536
    disk_mb: int = 512

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout_s, int | float) and not isinstance(self.timeout_s, bool)
                and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"SandboxLimits.timeout_s must be a positive number, got {self.timeout_s!r}")
        if not isinstance(self.disk_mb, int) or isinstance(self.disk_mb, bool) or self.disk_mb < 0:
            raise ValueError(f"SandboxLimits.disk_mb must be an integer >= 0 (0: no quota), got {self.disk_mb!r}")
        for name in ("cpu_s", "memory_mb", "max_processes", "file_size_mb", "output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ExecResult:
    """What one command did: exit code (128+N when killed by signal N, 124 on timeout), output
    (decoded as UTF-8 with replacement characters), wall time seen by the caller, and flags."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 and was not killed at the timeout."""
        return self.exit_code == 0 and not self.timed_out



# Where an extra mount may not go: the system directories the sandbox builds itself.
_RESERVED_TARGETS = ("/usr", "/etc", "/proc", "/dev", "/tmp", *("/" + n for n in SYSTEM_LINKS))
MAX_MOUNTS = 6
"""Most extra `SandboxMount` directories one sandbox takes (the unshare backend holds one
descriptor per mount in fds 3..8 while it builds the filesystem)."""
_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True)
class SandboxMount:
    """An extra host directory shown inside the sandbox at ``target`` (bwrap and unshare only).

    Read-only unless ``writable``; a writable one is given to the sandbox user like the
    workspace. Like the workspace, ``source`` must be reachable by the sandbox user: when
    harnessrl runs as root, its parents must be searchable by others (``/root`` is not).
    At most `MAX_MOUNTS` per sandbox. ``target`` must be an absolute path outside the directories
    the sandbox builds itself (``/usr``, ``/etc``, ``/proc``, ``/dev``, ``/tmp``, ``/bin``, ...)
    and outside the workspace, e.g. ``/opt/agent``. A Unix socket in a read-only mount can
    still be connected to: that is how a sandboxed program reaches a host server without any
    network (see `harnessrl.external`).
    """

    source: str
    target: str
    writable: bool = False

    def __post_init__(self) -> None:
        target = str(self.target)
        if not target.startswith("/") or os.path.normpath(target) != target or target == "/":
            raise ValueError(f"SandboxMount target {target!r} must be a normalized absolute path other than /")
        for reserved in (*_RESERVED_TARGETS, WORKSPACE_MOUNT):
            if is_within(target, reserved) or is_within(reserved, target):
                raise ValueError(
                    f"SandboxMount target {target!r} overlaps {reserved}, which the sandbox builds"
                    " itself; mount somewhere else, e.g. under /opt or /run")
        if not os.path.isdir(self.source):
            raise ValueError(f"SandboxMount source {self.source!r} is not a directory")


def check_backend_name(name: object) -> str:
    """Returns ``name`` if it names a backend `open_sandbox` takes ("auto" or one of
    `BACKENDS`); raises ValueError naming the choices otherwise (for configs to check early)."""
    if not isinstance(name, str) or name not in ("auto", *BACKENDS):
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of auto, {', '.join(BACKENDS)}")
    return name


def check_mounts(mounts: tuple[SandboxMount, ...]) -> None:
    """Raises ValueError if ``mounts`` are too many for one sandbox or overlap each other."""
    if len(mounts) > MAX_MOUNTS:
        raise ValueError(f"a sandbox takes at most {MAX_MOUNTS} extra mounts, got {len(mounts)}")
    targets = [mount.target for mount in mounts]
    for index, target in enumerate(targets):
        if any(is_within(target, other) or is_within(other, target) for other in targets[:index]):
            raise ValueError(f"SandboxMount targets overlap: {target!r} and another mount")


def checked_env(env: dict[str, str] | None) -> dict[str, str]:
    """Returns ``env`` after checking that names and values can go into an environment."""
    out: dict[str, str] = {}
    for name, value in (env or {}).items():
        if not name or name[0].isdigit() or not set(name) <= _ENV_NAME_CHARS:
            raise ValueError(f"sandbox environment variable name {name!r} is not a valid name")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"sandbox environment variable {name} must be a str without NUL bytes")
        out[name] = value
    return out


def is_within(path: str, root: str) -> bool:
    """True if ``path`` is ``root`` or lies under it (both normalized absolute paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
