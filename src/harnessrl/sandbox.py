"""Sandbox: per-episode `Workspace` directories and untrusted command execution under isolation and limits.

The policy is a model in training, so every command it issues is untrusted. This module owns
where those commands run and what they can reach:

* `Workspace` - a fresh host directory per episode, removed on close (kept with ``keep=True``).
  Inside the sandbox it is mounted at `WORKSPACE_MOUNT` (``/workspace``).
* `Sandbox` - one interface (`exec`, `read_file`, `write_file`, `list_dir`, `edit_file`, ...)
  with three backends, chosen by `open_sandbox`:

  ``bwrap``
      bubblewrap. New user, mount, pid, network, ipc and uts namespaces; a fresh read-only root
      that holds only read-only binds of ``/usr``, the ``/lib*`` and ``/bin`` links and ``/etc``
      (known secret files masked), a new ``/proc``, a read-only minimal ``/dev``, private tmpfs
      ``/tmp`` and ``/dev/shm``, and the workspace (the only host directory that is writable).
      No capabilities, no new privileges, no nested user namespaces, loopback-only network.
  ``unshare``
      util-linux ``unshare`` fallback. The same namespaces and the same filesystem layout, built
      by a small shell script (``mount``, ``pivot_root``) inside the new namespaces; the server
      then brings up loopback, empties the capability bounding set, drops its own capabilities
      and sets no-new-privs before any command runs. What it does *not* do compared to bwrap:
      the read-only remounts are best effort and not locked (a process that regained
      capabilities could remount them; host file permissions still apply), nested user
      namespaces are not disabled, and there is no ``--die-with-parent`` (the server exits, and
      with it the whole pid namespace, as soon as its control socket from the host closes).
  ``none``
      No isolation at all: commands run on the host as the calling user, in the workspace
      directory, with the same limits, clean environment and process-group handling. Must be
      asked for explicitly and warns loudly.

  Neither real backend installs a seccomp filter or a cgroup: memory is limited per process
  (RLIMIT_AS), so a sandbox may use up to ``max_processes * memory_mb`` in the worst case,
  and disk use inside the workspace is limited only per file (RLIMIT_FSIZE).

Extra mounts and environment. ``open_sandbox(mounts=..., env=...)`` shows up to `MAX_MOUNTS`
more host directories (`SandboxMount`: read-only unless asked, never over the directories the
sandbox builds itself or the workspace) and adds variables to the commands' environment. This
is how an external agent program runs here: its install folder read-only, a state folder
(HOME, logs) writable, and a folder holding a Unix socket of `harnessrl serve`, which is the
one way out of the network namespace (see `harnessrl.external`).

How a command runs. Starting fresh namespaces per command costs milliseconds, and so does
starting bash, so each sandbox starts ONE long-lived server (`_CommandServer`, a stdlib-only
Python program shipped as source) as pid 1 of its pid namespace, and that server keeps a
long-lived *master* bash that forks one *spare* shell ahead of time: its own process group,
limits applied with ``ulimit``, waiting for a go byte. The spare's pipe ends are passed to the
host over a Unix socket (SCM_RIGHTS), so a command's critical path is host -> spare -> host,
like plain ``subprocess.run``: the host writes the working directory and the command into the
spare's memfd, sends the go byte, and reads stdout and stderr itself (head and tail kept, with
a truncation marker). The spare ``cd``s to the tracked working directory, ``eval``s the command
and, from an EXIT trap, reports ``$?`` and ``$PWD`` on a side pipe: the working directory
persists across commands like in one shell session; environment changes do not. While the
command runs, the server prepares the next spare. At the timeout the host asks the server to
kill the command's process group. Being pid 1, the server cannot be killed or stopped from
inside (``kill -9 -1`` spares it); if it dies anyway, the command in flight gets an error
result and the next `Sandbox.exec` restarts it transparently (the working directory is kept,
background processes are lost). Because commands run in forks of the master shell, ``$$`` is
the master's pid (constant over the session, as in an interactive shell; ``$BASHPID`` is the
command's own), and ``kill $$`` kills the master, which is restarted, not the command.

A command is finished when its shell has exited and its output pipes are closed. Background
jobs that redirect their output (``cmd > log 2>&1 &``) keep running until the episode ends;
processes that still hold the command's stdout/stderr a short grace period after the shell
exited are killed (with the command's process group if they keep appearing: this is what
contains ``:(){ :|:& };:``).

Processes and users. When harnessrl runs as root, the sandbox's root user is mapped to the
unprivileged host uid `SANDBOX_HOST_UID` (``nobody``): the kernel does not enforce
RLIMIT_NPROC for host uid 0, and host root would otherwise keep owner access to root-owned
files it can see. The workspace tree is chowned to that uid when the sandbox starts, and files
written through `Sandbox.write_file` get that owner; files the caller adds later by other means
stay read-only to the sandbox. For the same reason, the workspace's parent directories must be
searchable by others (the default temp dir is; pytest's ``tmp_path`` is not). Running as a
normal user, the sandbox's root is that user. If unprivileged user namespaces are disabled,
root falls back to mapping the sandbox to host root and logs that ``max_processes`` is not
enforced.

No process outlives its episode: the server is pid 1 of the sandbox's pid namespace (its exit
kills everything in it), it exits when the host end of its control socket closes (for
instance when the host process is killed), bwrap runs with ``--die-with-parent``, ``unshare``
with ``--kill-child``, and `Sandbox.close` / a `weakref.finalize` hook (also run at exit) shut
it down. ``--die-with-parent`` is tied to the *thread* that opened the sandbox: if that thread
exits, the sandbox is killed and restarted by the next `exec`. Each open sandbox holds about
ten file descriptors in the host process.

File operations (`Sandbox.read_file` etc.) act on the host directory directly (no round trip),
confined to the workspace: absolute paths outside it, ``..`` that leaves it, symlinks that
point out of it, NUL bytes and non-regular files are refused with `SandboxError`, whose
message can be shown to the model. Relative paths resolve against the workspace root; paths
under ``/workspace`` (as seen inside) are mapped to the host directory. Each operation walks
the path component by component with ``O_NOFOLLOW`` so a symlink swapped in concurrently by a
sandboxed process cannot redirect it.
"""

from __future__ import annotations

import array
import contextlib
import functools
import glob
import inspect
import json
import logging
import math
import os
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BACKENDS",
    "MAX_MOUNTS",
    "SANDBOX_HOST_UID",
    "WORKSPACE_MOUNT",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxMount",
    "SandboxUnavailableError",
    "Workspace",
    "available_backends",
    "open_sandbox",
]

logger = logging.getLogger(__name__)

WORKSPACE_MOUNT = "/workspace"
"""Where the workspace appears inside the sandbox (bwrap and unshare backends)."""

SANDBOX_HOST_UID = 65534
"""Host uid (``nobody``) the sandbox's root user maps to when harnessrl itself runs as root."""

BACKENDS = ("bwrap", "unshare", "none")
"""Backend names in order of preference; ``none`` is never chosen by ``auto``."""

MAX_COMMAND_BYTES = 1 << 20
"""Longest command `Sandbox.exec` accepts (UTF-8 bytes); longer ones get an error result."""

_OUTPUT_GRACE_S = 0.1  # how long output pipes may stay open after the shell exited
_START_TIMEOUT_S = 20.0  # waiting for the server to start, or to offer a shell
_REPLY_SLACK_S = 10.0  # waiting for the server to finish a kill or clear request
_TIMEOUT_EXIT_CODE = 124  # like coreutils `timeout`
_LOST_EXIT_CODE = -1  # the server died while running the command

# Secrets under /etc that a sandbox must not read even when the host user could. Masked only if
# present and readable by the sandbox's host uid (unreadable ones are protected by permissions).
_ETC_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/pip.conf",
    "/etc/netrc",
    "/etc/krb5.keytab",
    "/etc/ipsec.secrets",
    "/etc/ppp",
    "/etc/wireguard",
    "/etc/NetworkManager/system-connections",
    "/etc/letsencrypt",
    "/etc/docker",
    "/etc/containers/auth.json",
    "/etc/credstore",
    "/etc/credstore.encrypted",
)
_ETC_SECRET_GLOBS = ("/etc/ssh/ssh_host_*key",)
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
    """

    timeout_s: float = 30.0
    cpu_s: int = 60
    memory_mb: int = 2048
    max_processes: int = 128
    file_size_mb: int = 64
    output_bytes: int = 65536

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout_s, int | float) and math.isfinite(self.timeout_s)
                and self.timeout_s > 0):
            raise ValueError(f"SandboxLimits.timeout_s must be a positive number, got {self.timeout_s!r}")
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
_RESERVED_TARGETS = ("/usr", "/etc", "/proc", "/dev", "/tmp", *("/" + n for n in _SYSTEM_LINKS))
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
            if _is_within(target, reserved) or _is_within(reserved, target):
                raise ValueError(
                    f"SandboxMount target {target!r} overlaps {reserved}, which the sandbox builds"
                    " itself; mount somewhere else, e.g. under /opt or /run")
        if not os.path.isdir(self.source):
            raise ValueError(f"SandboxMount source {self.source!r} is not a directory")


def _checked_env(env: dict[str, str] | None) -> dict[str, str]:
    """Returns ``env`` after checking that names and values can go into an environment."""
    out: dict[str, str] = {}
    for name, value in (env or {}).items():
        if not name or name[0].isdigit() or not set(name) <= _ENV_NAME_CHARS:
            raise ValueError(f"sandbox environment variable name {name!r} is not a valid name")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"sandbox environment variable {name} must be a str without NUL bytes")
        out[name] = value
    return out


# --------------------------------------------------------------------------------------------
# Workspace
# --------------------------------------------------------------------------------------------


def _remove_tree(path: str) -> None:
    """Delete a directory tree, fixing permissions a sandboxed process may have removed."""

    def fix_and_retry(func: Any, failed: str, _exc_info: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
            func(failed)

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=fix_and_retry)
    if os.path.lexists(path):
        logger.warning("sandbox: could not remove workspace %s completely", path)


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class Workspace:
    """A fresh directory for one episode, removed on `close` unless ``keep`` is set.

    The caller lays out the task's files under `root` (before opening a sandbox on it, or later
    through `Sandbox.write_file`); inside the sandbox the directory is `WORKSPACE_MOUNT`.
    """

    def __init__(self, base_dir: str | Path | None = None, prefix: str = "ws-", keep: bool = False) -> None:
        base = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        self.root: Path = Path(os.path.realpath(tempfile.mkdtemp(prefix=prefix, dir=base)))
        self.keep = keep
        self._finalizer = weakref.finalize(self, _remove_tree, str(self.root))
        if keep:
            self._finalizer.detach()

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """Return the host path for ``path``, refusing anything that leaves the workspace.

        Accepts paths relative to the workspace root, absolute host paths inside it and absolute
        paths under `WORKSPACE_MOUNT`. Symlinks are resolved; the result must stay inside.
        Raises `SandboxError` with a model-facing message otherwise.
        """
        text = os.fspath(path)
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if "\x00" in text:
            raise SandboxError("path contains a NUL byte")
        root = str(self.root)
        shown = text or "."
        if os.path.isabs(text):
            if _is_within(os.path.normpath(text), root):
                joined = text
            elif text == WORKSPACE_MOUNT or text.startswith(WORKSPACE_MOUNT + "/"):
                joined = os.path.join(root, text[len(WORKSPACE_MOUNT):].lstrip("/"))
            else:
                raise SandboxError(f"path '{shown}' is outside the workspace")
        else:
            joined = os.path.join(root, text)
        if not _is_within(os.path.normpath(joined), root):
            raise SandboxError(f"path '{shown}' is outside the workspace")
        real = os.path.realpath(joined)  # resolves each symlink before any ".." after it
        if not _is_within(real, root):
            raise SandboxError(
                f"path '{shown}' is outside the workspace (a symlink on the way points outside)"
            )
        return Path(real)

    def close(self) -> None:
        """Remove the directory (unless ``keep``); safe to call twice."""
        if self.keep:
            self._finalizer.detach()
            return
        self._finalizer()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r}, keep={self.keep})"


# --------------------------------------------------------------------------------------------
# The command server (runs inside the sandbox)
# --------------------------------------------------------------------------------------------

_SERVER_IMPORTS = (
    "from __future__ import annotations\n"
    "import array, json, os, resource, select, signal, socket, time\n"
)

# The server is started as `python3 -I -S -c _SERVER_BOOTSTRAP` with a SOCK_SEQPACKET socket as
# stdin; its first packet is the server's source. So the sandbox's `ps` shows a short line.
_SERVER_BOOTSTRAP = "import os;exec(compile(os.read(0,1<<22),'harnessrl-sandbox-server','exec'))"


class _CommandServer:
    """Prepares, tracks and kills the shells of one sandbox; started once per episode.

    Shipped to the sandbox as source (`_server_source`) and run by the system ``python3 -I -S``,
    so it may use only the stdlib names in ``_SERVER_IMPORTS`` and no other name of this module,
    and must run on Python >= 3.8. It is pid 1 of the sandbox's pid namespace.

    The server stays off each command's critical path. It keeps one *spare* shell ready for the
    host. Spares are forked by a long-lived *master* bash (forking an initialized bash costs a
    fraction of starting one): the master has job control on, so each spare is its own process
    group, with the limits the master set with ``ulimit``. For each spare the server makes the
    pipes (stdout, stderr, a report pipe, a go pipe) and a memfd for the command, and tells the
    master their fd numbers; the master opens them through ``/proc/<server>/fd``, forks the
    spare and answers with its pid. The host-side ends travel to the host over the control
    socket (SCM_RIGHTS). The spare blocks reading one byte from fd 99. The host writes ``cwd NUL
    command`` into the memfd and then the byte, and reads the output itself. The spare writes
    ``r NUL`` to the report pipe (fd 97) once it has the command (a spare that dies before that
    never ran it: the host retries on the next one), ``cd``s, traps EXIT to write ``s<status>
    NUL <pwd> NUL`` there and ``eval``s the command. When a spare ends without that report (it
    ``exec``ed, or was killed) the host asks for its status, which the master shell still has
    (``wait <pid>``).

    Control messages are JSON packets. Server to host: ``ready``; ``shell`` (with the fds);
    ``cleared`` (after ``kill`` or ``clear``); ``status``. Host to server: ``started`` or
    ``dead`` (the host took a spare, or found it dead: prepare the next one); ``status`` (the
    exit status of a spare that did not report one); ``kill`` (kill the command's process
    group and whatever holds its output: the timeout); ``clear`` (kill whatever still holds the
    output after the command finished). EOF on the socket ends the server and, as pid 1, every
    process in the sandbox.
    """

    def __init__(self, config: dict, control) -> None:
        self.control = control
        self.root = config["root"]  # the workspace as commands see it
        self.shell = config["shell"]
        self.env = config["env"]
        self.limits = config["limits"]
        self.harden = bool(config["harden"])
        self.null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.master = None  # {"pid", "pidfd", "slots", "acks", "jobs"}
        self.pgids: set = set()
        self.next_sid = 0
        self.poller = select.poll()

    @classmethod
    def main(cls) -> None:
        control = socket.socket(fileno=0)
        config = json.loads(control.recv(1 << 20).decode("utf-8"))
        cls(config, control).serve()

    def serve(self) -> None:
        if self.harden:
            self.drop_privileges()
        os.chdir(self.root)
        self.poller.register(0, select.POLLIN)
        self.send({"ready": True, "pid": os.getpid()})
        self.offer_shell()
        while True:
            for fd, _event in self.poller.poll(1000):
                if fd == 0:
                    self.handle_message()
                elif self.master is not None and fd == self.master["pidfd"]:
                    self.drop_master()
            self.reap()

    def send(self, message: dict, fds=()) -> None:
        data = json.dumps(message).encode("utf-8")
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self.control.sendmsg([data], ancillary)
        except OSError:  # the host is gone
            self.shutdown()

    def handle_message(self) -> None:
        try:
            data = self.control.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.shutdown()
        message = json.loads(data.decode("utf-8"))
        if "started" in message or "dead" in message:
            self.offer_shell()
        elif "status" in message:
            running, code = self.job_status(message["pgid"])
            self.send({"status": True, "sid": message.get("sid"), "code": code, "running": running})
        elif "kill" in message or "clear" in message:
            if "kill" in message:
                self.kill_group(message["pgid"])
            self.kill_holders(message["pgid"], message["inodes"])
            self.send({"cleared": True, "sid": message.get("sid")})

    def shutdown(self) -> None:
        for pgid in self.pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                continue
        os._exit(0)

    # ---- the master bash and its spares ----
    def master_script(self) -> str:
        def capped(which: int, value: int) -> int:
            hard = resource.getrlimit(which)[1]
            return value if hard == resource.RLIM_INFINITY else min(value, hard)

        limits = self.limits
        cpu = capped(resource.RLIMIT_CPU, limits["cpu_s"])
        cpu_hard = capped(resource.RLIMIT_CPU, limits["cpu_s"] + 1)
        memory_kb = capped(resource.RLIMIT_AS, limits["memory_mb"] << 20) >> 10
        processes = capped(resource.RLIMIT_NPROC, limits["max_processes"])
        file_kb = capped(resource.RLIMIT_FSIZE, limits["file_size_mb"] << 20) >> 10
        fd_dir = "/proc/" + str(os.getpid()) + "/fd/"
        spare = "; ".join([
            "unset __o __e __r __s __g",
            "read -r -n 1 -u 99 __harnessrl_go || exit 0",
            "unset __harnessrl_go",
            "exec 99<&-",
            "IFS= read -r -d '' -u 98 __harnessrl_cwd",
            "IFS= read -r -d '' -u 98 __harnessrl_cmd",
            "exec 98<&-",
            "printf 'r\\0' 2>/dev/null >&97",
            'cd -- "$__harnessrl_cwd" 2>/dev/null || cd -- ' + self.quote(self.root),
            "trap 'printf \"s%s\\0%s\\0\" \"$?\" \"$PWD\" 2>/dev/null >&97' EXIT",
            'eval "unset __harnessrl_cwd __harnessrl_cmd; $__harnessrl_cmd"',
        ])
        opened = " ".join(
            f'{fd}{mode}"{fd_dir}${name}"'
            for fd, mode, name in ((90, ">", "__o"), (91, ">", "__e"), (92, ">", "__r"),
                                   (93, "<", "__s"), (94, "<", "__g"))
        )
        return " ".join([  # one line too: bash counts lines from the start of the script
            f"ulimit -S -t {cpu} && ulimit -H -t {cpu_hard} && ulimit -v {memory_kb}"
            f" && ulimit -u {processes} && ulimit -f {file_kb} && ulimit -c 0"
            " || { echo 'harnessrl sandbox: cannot apply resource limits' >&2; exit 126; };",
            "set -m;",
            "while read -r -u 3 __o __e __r __s __g; do",
            # "? <pid>": the exit status of a spare that ended without reporting it (exec, kill).
            'if [ "$__o" = "?" ]; then wait "$__e"; echo "$?" >&4; continue; fi;',
            f"exec {opened} || {{ echo 0 >&4; continue; }};",
            "(" + spare + ") 1>&90 2>&91 97>&92 98<&93 99<&94 90>&- 91>&- 92>&- 93<&- 94<&-"
            " 3<&- 4>&- </dev/null &",
            "exec 90>&- 91>&- 92>&- 93<&- 94<&-;",
            'echo "$!" >&4;',
            "done",
        ])

    def start_master(self) -> dict:
        slots_r, slots_w = os.pipe()
        acks_r, acks_w = os.pipe()
        argv = [self.shell, "-c", self.master_script()]
        pairs = ((self.null, 0), (self.null, 1), (self.null, 2), (slots_r, 3), (acks_w, 4))
        try:
            pid = os.posix_spawn(
                self.shell, argv, self.env, setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                file_actions=[(os.POSIX_SPAWN_DUP2, src, dst) for src, dst in pairs],
            )
        except (AttributeError, NotImplementedError, TypeError):
            pid = os.fork()  # no posix_spawn with setsid (old libc): the slow, equivalent path
            if pid == 0:
                try:
                    os.setsid()
                    for src, dst in pairs:
                        os.dup2(src, dst)
                    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
                        signal.signal(signum, signal.SIG_DFL)
                    os.execve(self.shell, argv, self.env)
                finally:
                    os._exit(127)
        os.close(slots_r)
        os.close(acks_w)
        pidfd = -1
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(pid)
                self.poller.register(pidfd, select.POLLIN)
            except OSError:
                pidfd = -1
        self.track_group(pid)
        return {"pid": pid, "pidfd": pidfd, "slots": slots_w, "acks": acks_r, "jobs": {}}

    def drop_master(self) -> None:
        master, self.master = self.master, None
        if master is None:
            return
        if master["pidfd"] >= 0:
            self.poller.unregister(master["pidfd"])
            os.close(master["pidfd"])
        os.close(master["slots"])
        os.close(master["acks"])
        try:
            os.kill(master["pid"], signal.SIGKILL)
        except OSError:
            return

    def ask_master(self, line: str, timeout_s: float):
        """Send one line to the master shell; its one-line answer as an int, or None."""
        master = self.master
        if master is None:
            return None
        try:
            os.write(master["slots"], (line + "\n").encode())
            answer = b""
            while not answer.endswith(b"\n"):
                ready = select.select([master["acks"]], [], [], timeout_s)[0]
                chunk = os.read(master["acks"], 64) if ready else b""
                if not chunk:
                    raise OSError("the master shell did not answer")
                answer += chunk
            return int(answer)
        except (OSError, ValueError):
            self.drop_master()
            return None

    def fork_spare(self, fds: list):
        """Have the master fork a spare on these fds (ours); its pid, or None if it failed."""
        if self.master is None:
            self.master = self.start_master()
        master = self.master
        pid = self.ask_master(" ".join(str(fd) for fd in fds), 10.0)
        if pid is None or pid <= 0:
            return None
        master["jobs"][pid] = None  # an ordered set: bash remembers only recent statuses
        if len(master["jobs"]) > 256:
            del master["jobs"][next(iter(master["jobs"]))]
        return pid

    def job_status(self, pid: int):
        """(still running, exit status) of a spare; the status comes from the master that
        forked it, None if unknown."""
        try:
            with open("/proc/" + str(int(pid)) + "/stat") as stat_file:
                state = stat_file.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "gone"
        if state not in ("Z", "X", "gone"):
            return True, None  # exec'ed into something that closed the report pipe
        if self.master is None or pid not in self.master["jobs"]:
            return False, None
        del self.master["jobs"][pid]
        return False, self.ask_master("? " + str(int(pid)), 10.0)

    def offer_shell(self) -> None:
        """Prepare the next command's shell and hand its pipe ends to the host."""
        for _attempt in range(3):
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            report_r, report_w = os.pipe()
            go_r, go_w = os.pipe()
            script_fd = os.memfd_create("harnessrl-command", os.MFD_CLOEXEC)
            pid = self.fork_spare([out_w, err_w, report_w, script_fd, go_r])
            for fd in (out_w, err_w, report_w, go_r):
                os.close(fd)
            host_ends = [go_w, script_fd, out_r, err_r, report_r]
            if pid is not None:
                self.track_group(pid)
                self.send({"shell": True, "sid": self.next_sid, "pid": pid}, host_ends)
                self.next_sid += 1
            for fd in host_ends:
                os.close(fd)
            if pid is not None:
                return
        self.send({"error": "cannot prepare a shell"})

    def track_group(self, pgid: int) -> None:
        """Remember a process group to kill at shutdown; forget the ones that are gone."""
        self.pgids.add(pgid)
        if len(self.pgids) > 256:
            alive = set()
            for group in self.pgids:
                try:
                    os.killpg(group, 0)
                except OSError:
                    continue
                alive.add(group)
            self.pgids = alive

    def reap(self) -> None:
        """Collect exited children and orphans (we are pid 1); notice a dead master."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.master is not None and pid == self.master["pid"]:
                self.drop_master()

    def kill_group(self, pgid: int) -> None:
        """SIGKILL a process group until it is gone (its zombies reaped), for up to 2 s."""
        deadline = time.monotonic() + 2.0
        while True:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                return
            self.reap()
            if time.monotonic() > deadline:
                return
            time.sleep(0.001)

    def kill_holders(self, pgid: int, inodes: list) -> None:
        """SIGKILL every process holding one of these pipes; if some keep reappearing (a fork
        bomb), kill the command's whole process group as well."""
        targets = {"pipe:[" + str(inode) + "]" for inode in inodes}
        me = str(os.getpid())
        for _round in range(20):
            holders = []
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid == me:
                    continue
                try:
                    for fd in os.listdir("/proc/" + pid + "/fd"):
                        if os.readlink("/proc/" + pid + "/fd/" + fd) in targets:
                            holders.append(int(pid))
                            break
                except OSError:
                    continue
            if not holders:
                return
            for pid in holders:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
            self.reap()
            time.sleep(0.002)
        self.kill_group(pgid)

    # ---- helpers ----
    def quote(self, text: str) -> str:
        return "'" + text.replace("'", "'\\''") + "'"

    def drop_privileges(self) -> None:
        """unshare backend: bring up loopback, then make sure no command gets capabilities."""
        import ctypes
        import fcntl

        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                name = b"lo".ljust(16, b"\0")
                flags = int.from_bytes(fcntl.ioctl(sock, 0x8913, name + b"\0" * 24)[16:18], "little")
                fcntl.ioctl(sock, 0x8914, name + (flags | 0x1).to_bytes(2, "little") + b"\0" * 22)
        except OSError:
            pass
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):  # PR_CAPBSET_DROP until the kernel says EINVAL
            if libc.prctl(24, cap, 0, 0, 0) != 0:
                break
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        # Drop our own capabilities too (capset v3, all zero): the master shell must be able to
        # open /proc/<server>/fd, which the kernel refuses to a process with fewer capabilities.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        libc.capset(header, data)


@functools.lru_cache(maxsize=1)
def _server_source() -> bytes:
    """Python source of the in-sandbox command server (the first packet on its socket)."""
    return (
        _SERVER_IMPORTS + inspect.getsource(_CommandServer) + "\n_CommandServer.main()\n"
    ).encode("utf-8")


# --------------------------------------------------------------------------------------------
# Host-side plumbing
# --------------------------------------------------------------------------------------------


def _sandbox_env(home: str, user: str = "root") -> dict[str, str]:
    """The complete environment of sandboxed commands; nothing of the parent's leaks in."""
    return {
        "PATH": _SANDBOX_PATH,
        "HOME": home,
        "TMPDIR": "/tmp",
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "DEBIAN_FRONTEND": "noninteractive",
        "GIT_AUTHOR_NAME": "agent",
        "GIT_AUTHOR_EMAIL": "agent@sandbox",
        "GIT_COMMITTER_NAME": "agent",
        "GIT_COMMITTER_EMAIL": "agent@sandbox",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
    }


@functools.lru_cache(maxsize=1)
def _python_inside() -> tuple[str, str | None]:
    """The interpreter that runs the server inside, and a prefix to bind if it is not in /usr."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate, None
    interpreter = os.path.realpath(sys.executable)
    return interpreter, os.path.realpath(sys.base_prefix)


def _shell_path() -> str:
    """bash, which runs every command (the sandbox's /bin is the host's /usr/bin or /bin)."""
    for candidate in ("/bin/bash", "/usr/bin/bash"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailableError("bash is required to run sandboxed commands; install bash")


def _give_tree(root: str, host_uid: int) -> None:
    """Make ``host_uid`` own ``root`` and everything under it (symlinks themselves, not targets)."""
    os.lchown(root, host_uid, host_uid)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                os.lchown(os.path.join(parent, name), host_uid, host_uid)


def _others_can_search(path: str) -> str | None:
    """Return the first directory above ``path`` that others cannot traverse, or None."""
    current = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return current
        if not mode & stat.S_IXOTH:
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _visible_to(path: str, host_uid: int | None) -> bool:
    """Could a process running as ``host_uid`` (None: this process) read ``path``?"""
    if host_uid is None:
        return os.access(path, os.R_OK)
    if _others_can_search(path) is not None:
        return False
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def _mount_plan(workspace: str, host_uid: int | None,
                mounts: tuple[SandboxMount, ...] = ()) -> list[tuple[str, ...]]:
    """The sandbox's filesystem, as ("ro"|"bind"|"symlink"|"mask_file"|"mask_dir"|"proc"|
    "dev"|"tmp"|"extra_ro"|"extra_rw", ...) steps shared by the bwrap and unshare backends; the
    ``extra_*`` steps are the caller's `SandboxMount` directories."""
    plan: list[tuple[str, ...]] = [("ro", "/usr", "/usr")]
    for name in _SYSTEM_LINKS:
        path = "/" + name
        if os.path.islink(path):
            plan.append(("symlink", os.readlink(path), path))
        elif os.path.isdir(path):
            plan.append(("ro", path, path))
    plan.append(("ro", "/etc", "/etc"))
    secrets = list(_ETC_SECRETS)
    for pattern in _ETC_SECRET_GLOBS:
        secrets.extend(sorted(glob.glob(pattern)))
    for secret in secrets:
        if os.path.islink(secret) or not os.path.exists(secret) or not _visible_to(secret, host_uid):
            continue
        plan.append(("mask_dir" if os.path.isdir(secret) else "mask_file", secret))
    _interpreter, prefix = _python_inside()
    if prefix is not None and not _is_within(prefix, "/usr"):
        plan.append(("ro", prefix, prefix))
    plan += [("proc", "/proc"), ("dev", "/dev"), ("tmp", "/tmp"), ("bind", workspace, WORKSPACE_MOUNT)]
    plan += [("extra_rw" if m.writable else "extra_ro", os.path.realpath(m.source), m.target)
             for m in mounts]
    return plan


@functools.lru_cache(maxsize=1)
def _bwrap_options() -> frozenset[str]:
    try:
        text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(word for word in text.split() if word.startswith("--"))


def _bwrap_argv(plan: list[tuple[str, ...]], tmp_bytes: int) -> list[str]:
    options = _bwrap_options()
    argv = [
        "bwrap", "--unshare-user", "--uid", "0", "--gid", "0",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--hostname", "sandbox", "--die-with-parent", "--new-session", "--as-pid-1",
    ]
    if "--unshare-cgroup-try" in options:
        argv.append("--unshare-cgroup-try")
    if "--disable-userns" in options:
        argv.append("--disable-userns")
    for step in plan:
        kind = step[0]
        if kind == "ro":
            argv += ["--ro-bind", step[1], step[2]]
        elif kind == "bind":
            argv += ["--bind", step[1], step[2]]
        elif kind in ("extra_ro", "extra_rw"):
            argv += ["--ro-bind" if kind == "extra_ro" else "--bind", step[1], step[2]]
        elif kind == "symlink":
            argv += ["--symlink", step[1], step[2]]
        elif kind == "mask_file":
            argv += ["--ro-bind", "/dev/null", step[1]]
        elif kind == "mask_dir":
            argv += ["--tmpfs", step[1], "--remount-ro", step[1]]
        elif kind == "proc":
            argv += ["--proc", step[1]]
        elif kind == "dev":
            # /dev itself read-only; /dev/shm a private writable tmpfs (POSIX semaphores need it).
            size = ["--size", str(tmp_bytes)] if "--size" in options else []
            argv += ["--dev", step[1], *size, "--tmpfs", step[1] + "/shm", "--remount-ro", step[1]]
        elif kind == "tmp":
            if "--size" in options:
                argv += ["--size", str(tmp_bytes)]
            argv += ["--tmpfs", step[1]]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE_MOUNT, "--"]
    return argv


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _unshare_setup_script(plan: list[tuple[str, ...]], tmp_bytes: int) -> str:
    """Shell script run as pid 1 of fresh namespaces: build the new root, pivot, exec "$@"."""
    new_root = "/tmp"  # a fresh tmpfs over /tmp in our private mount namespace
    lines = ["set -e"]
    workspace_fd = ""
    extra_fds = iter(range(3, 3 + MAX_MOUNTS))
    extra_fd: dict[str, int] = {}
    for step in plan:
        if step[0] == "bind":
            # Opened before /tmp is covered: the workspace usually lives under it.
            lines.append(f"exec 9<{_q(step[1])}")
            workspace_fd = "/proc/self/fd/9"
        elif step[0] in ("extra_ro", "extra_rw"):
            extra_fd[step[2]] = next(extra_fds)
            lines.append(f"exec {extra_fd[step[2]]}<{_q(step[1])}")
    lines.append(f"mount -t tmpfs -o mode=0755 harnessrl-root {new_root}")
    for step in plan:
        kind = step[0]
        target = new_root + step[-1]
        if kind == "ro":
            lines += [
                f"mkdir -p {_q(target)}",
                f"mount --rbind {_q(step[1])} {_q(target)}",
                f"mount -o remount,bind,ro {_q(target)} 2>/dev/null"
                f" || mount -o remount,bind,ro,nosuid,nodev {_q(target)} 2>/dev/null || true",
            ]
        elif kind == "symlink":
            lines.append(f"ln -s {_q(step[1])} {_q(new_root + step[2])}")
        elif kind == "mask_file":
            lines.append(f"mount --bind /dev/null {_q(target)}")
        elif kind == "mask_dir":
            lines.append(f"mount -t tmpfs -o mode=0755,size=65536,ro harnessrl-mask {_q(target)}")
        elif kind == "proc":
            lines += [f"mkdir -p {target}", f"mount -t proc proc {target}"]
        elif kind == "dev":
            lines += [f"mkdir -p {target}", f"mount -t tmpfs -o mode=0755,size=1048576 harnessrl-dev {target}"]
            for device in _DEVICES:
                lines.append(
                    f"if [ -e /dev/{device} ]; then touch {target}/{device};"
                    f" mount --bind /dev/{device} {target}/{device}; fi"
                )
            for index, name in enumerate(("stdin", "stdout", "stderr")):
                lines.append(f"ln -s /proc/self/fd/{index} {target}/{name}")
            lines += [
                f"ln -s /proc/self/fd {target}/fd",
                f"mkdir {target}/shm",
                f"mount -t tmpfs -o mode=1777,size={tmp_bytes} harnessrl-shm {target}/shm",
                f"mount -o remount,bind,ro {target}",
            ]
        elif kind == "tmp":
            lines += [f"mkdir -p {target}", f"mount -t tmpfs -o mode=1777,size={tmp_bytes} harnessrl-tmp {target}"]
        elif kind == "bind":
            lines += [
                f"mkdir -p {_q(target)}",
                f"mount --no-canonicalize --bind {workspace_fd} {_q(target)}",
                "exec 9<&-",
            ]
        elif kind in ("extra_ro", "extra_rw"):
            fd = extra_fd[step[2]]
            lines += [
                f"mkdir -p {_q(target)}",
                f"mount --no-canonicalize --bind /proc/self/fd/{fd} {_q(target)}",
                f"exec {fd}<&-",
            ]
            if kind == "extra_ro":  # not best effort: fail rather than leave it writable
                lines.append(f"mount -o remount,bind,ro {_q(target)} 2>/dev/null"
                             f" || mount -o remount,bind,ro,nosuid,nodev {_q(target)}")
    lines += [
        f"mkdir {new_root}/.oldroot",
        f"cd {new_root}",
        "pivot_root . .oldroot",
        "umount -l /.oldroot",
        "rmdir /.oldroot",
        "mount -o remount,bind,ro / 2>/dev/null || true",
        "hostname sandbox 2>/dev/null || true",
        f"cd {WORKSPACE_MOUNT}",
        'exec "$@"',
    ]
    return "\n".join(lines) + "\n"


class _ServerGone(Exception):
    """The sandbox's server died or stopped answering."""


@dataclass
class _Shell:
    """Host-side ends of one pre-started shell (see `_CommandServer`)."""

    sid: int
    pgid: int  # the shell's pid inside the sandbox, leader of the command's process group
    go: int
    script: int
    stdout: int
    stderr: int
    report: int

    def close(self) -> None:
        for name in ("go", "script", "stdout", "stderr", "report"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)


class _OutputCapture:
    """Keeps the first and the last ``limit / 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.omitted = 0

    def feed(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                self.omitted += excess
                del self.tail[:excess]

    def text(self) -> tuple[str, bool]:
        """The captured text (undecodable bytes replaced) and whether anything was cut."""
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if not self.omitted:
            return head + tail, False
        return f"{head}\n[... output truncated: {self.omitted} bytes omitted ...]\n{tail}", True


class _Report:
    """What a shell writes to its report pipe: ``r NUL`` when it has taken the command, then
    ``s<status> NUL <pwd> NUL`` from its EXIT trap (see `_CommandServer`)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.started = False
        self.status: int | None = None
        self.cwd: str | None = None

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        fields = self.buffer.split(b"\0")
        if fields[0] == b"r" and len(fields) >= 2:
            self.started = True
            fields = fields[1:]
        if self.started and self.status is None and len(fields) >= 3 and fields[0][:1] == b"s" \
                and fields[0][1:].isdigit():
            self.status = int(fields[0][1:])
            self.cwd = fields[1].decode("utf-8", "surrogateescape")


class _Server:
    """Host-side handle of one running `_CommandServer`: process, control socket, spare shells."""

    def __init__(self, process: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.process = process
        self.control = control
        self.ready = False
        self.spares: list[_Shell] = []
        self.active_sid = -1
        self.cleared = False  # the server finished a kill/clear for the active shell
        self.status_reply: tuple[bool, int | None] | None = None  # answer to "status": (running, code)

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.control.send(json.dumps(message).encode("utf-8"))
        except OSError as exc:
            raise _ServerGone(str(exc)) from exc

    def receive(self, timeout_s: float) -> bool:
        """Handle one control message if one arrives within ``timeout_s``; False if none did."""
        poller = select.poll()
        poller.register(self.control, select.POLLIN)
        if not poller.poll(max(timeout_s, 0.0) * 1000.0):
            return False
        try:
            data, ancillary, _flags, _address = self.control.recvmsg(
                1 << 16, socket.CMSG_SPACE(8 * 4), socket.MSG_CMSG_CLOEXEC)
        except OSError as exc:
            raise _ServerGone(str(exc)) from exc
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[: len(payload) - len(payload) % 4]))
        if not data:
            for fd in fds:
                os.close(fd)
            raise _ServerGone("the sandbox server closed its control socket")
        message = json.loads(data.decode("utf-8"))
        sid = message.get("sid")
        if "shell" in message and len(fds) == 5:
            self.spares.append(_Shell(sid, message["pid"], *fds))
            return True
        for fd in fds:
            os.close(fd)
        if "ready" in message:
            self.ready = True
        elif "error" in message:
            raise _ServerGone(str(message["error"]))
        elif "cleared" in message and sid == self.active_sid:
            self.cleared = True
        elif "status" in message and sid == self.active_sid:
            code = message.get("code")
            self.status_reply = (bool(message.get("running")), code if isinstance(code, int) else None)
        return True

    def take_shell(self, deadline: float) -> _Shell:
        """The next spare shell, waiting for the server to offer one if needed."""
        while self.receive(0.0):
            pass
        while not self.spares:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _ServerGone("the sandbox server offered no shell in time")
            self.receive(remaining)
        shell = self.spares.pop(0)
        self.active_sid, self.cleared, self.status_reply = shell.sid, False, None
        return shell

    def stop(self) -> None:
        """Close the control socket (the server then ends every sandboxed process); make sure."""
        with contextlib.suppress(OSError):
            self.control.close()
        for shell in self.spares:
            shell.close()
        self.spares.clear()
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5.0)


def _stop_servers(holder: list[_Server]) -> None:
    while holder:
        holder.pop().stop()


# --------------------------------------------------------------------------------------------


class Sandbox(ABC):
    """Runs untrusted commands in a `Workspace` under isolation and `SandboxLimits`.

    File operations work on the host directory (no round trip) with the confinement rules of
    `Workspace.resolve`; relative paths are relative to the workspace root, not to the shell's
    current directory. Every method raises `SandboxError` for a refused or failed operation.
    """

    workspace: Workspace
    limits: SandboxLimits
    backend: str

    def __init__(self, workspace: Workspace, limits: SandboxLimits, owns_workspace: bool = False) -> None:
        self.workspace = workspace
        self.limits = limits
        self._owns_workspace = owns_workspace
        self._file_owner: int | None = None  # host uid for files created through write_file

    @abstractmethod
    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with bash in the sandbox and return its result.

        The working directory persists across calls (like one shell session); environment
        changes do not. ``timeout`` overrides ``limits.timeout_s`` for this call.
        """

    @abstractmethod
    def close(self) -> None:
        """Stop every process of this sandbox; close the workspace if the sandbox created it."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- confined file operations ----
    def _open(self, path: str, flags: int, *, create: bool = False, directory: bool = False) -> int:
        """Open ``path`` inside the workspace without following any symlink on the way."""
        shown = os.fspath(path) or "."
        resolved = str(self.workspace.resolve(path))
        root = str(self.workspace.root)
        relative = os.path.relpath(resolved, root)
        parts = [] if relative == "." else relative.split(os.sep)
        dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            current = os.open(root, dir_flags)
        except OSError as exc:
            raise SandboxError(f"the workspace is not available ({exc.strerror})") from None
        try:
            if not parts:
                if not directory:
                    raise SandboxError(f"'{shown}' is a directory")
                return os.dup(current)
            for part in parts[:-1]:
                try:
                    child = os.open(part, dir_flags, dir_fd=current)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=current)
                    if self._file_owner is not None:
                        os.chown(part, self._file_owner, self._file_owner, dir_fd=current,
                                 follow_symlinks=False)
                    child = os.open(part, dir_flags, dir_fd=current)
                os.close(current)
                current = child
            final_flags = (dir_flags if directory else flags) | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(parts[-1], final_flags, 0o644, dir_fd=current)
        except OSError as exc:
            raise self._os_error(exc, shown) from None
        finally:
            os.close(current)

    @staticmethod
    def _os_error(exc: OSError, shown: str) -> SandboxError:
        import errno

        messages = {
            errno.ENOENT: f"no such file or directory: '{shown}'",
            errno.ENOTDIR: f"not a directory: '{shown}'",
            errno.EISDIR: f"'{shown}' is a directory",
            errno.ELOOP: f"path '{shown}' is outside the workspace (it goes through a symlink)",
            errno.EACCES: f"permission denied: '{shown}'",
            errno.EPERM: f"permission denied: '{shown}'",
            errno.ENXIO: f"'{shown}' is not a regular file",
            errno.EFBIG: f"file too large: '{shown}'",
            errno.ENOSPC: f"no space left on device while writing '{shown}'",
        }
        return SandboxError(messages.get(exc.errno or 0, f"{exc.strerror or exc}: '{shown}'"))

    def _open_regular(self, path: str, flags: int, create: bool = False) -> int:
        shown = os.fspath(path) or "."
        fd = self._open(path, flags | os.O_NONBLOCK, create=create)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise SandboxError(f"'{shown}' is {kind}")
        return fd

    def read_bytes(self, path: str) -> bytes:
        """Return the raw content of a regular file in the workspace."""
        fd = self._open_regular(path, os.O_RDONLY)
        try:
            os.set_blocking(fd, True)
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise self._os_error(exc, path) from None
        finally:
            os.close(fd)

    def read_file(self, path: str) -> str:
        """Return a workspace file's content as text (UTF-8, undecodable bytes replaced)."""
        return self.read_bytes(path).decode("utf-8", "replace")

    def write_file(self, path: str, content: str | bytes) -> None:
        """Create or overwrite a workspace file (and its parent directories) with ``content``."""
        if isinstance(content, str):
            try:
                data = content.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                data = content.encode("utf-8", "replace")
        else:
            data = bytes(content)
        fd = self._open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, create=True)
        try:
            if self._file_owner is not None:
                os.fchown(fd, self._file_owner, self._file_owner)
            os.set_blocking(fd, True)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            raise self._os_error(exc, path) from None
        finally:
            os.close(fd)

    def list_dir(self, path: str = ".") -> list[str]:
        """Return the sorted entry names of a workspace directory; directories end with "/"."""
        fd = self._open(path, os.O_RDONLY, directory=True)
        try:
            with os.scandir(fd) as entries:
                names = [e.name + "/" if e.is_dir(follow_symlinks=False) else e.name for e in entries]
        except OSError as exc:
            raise self._os_error(exc, path) from None
        finally:
            os.close(fd)
        return sorted(names)

    def edit_file(self, path: str, old: str, new: str, count: int | None = 1) -> int:
        """Replace ``old`` with ``new`` in a workspace file and return the number of replacements.

        ``count`` is how many occurrences must exist (default: exactly one); ``None`` replaces
        every occurrence (at least one). Zero matches, or a different number than ``count``,
        raise `SandboxError` and leave the file unchanged.
        """
        if not old:
            raise SandboxError("the text to replace must not be empty")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise SandboxError(f"count must be a positive integer or None, got {count!r}")
        text = self.read_bytes(path).decode("utf-8", "surrogateescape")
        found = text.count(old)
        if found == 0:
            raise SandboxError(f"the text to replace was not found in '{path}'")
        if count is not None and found != count:
            raise SandboxError(
                f"the text to replace occurs {found} times in '{path}', expected {count}; "
                "include more surrounding text to make it unique"
                + (" or pass count" if count == 1 else "")
            )
        self.write_file(path, text.replace(old, new))
        return found

    def exists(self, path: str) -> bool:
        """True if ``path`` exists in the workspace (SandboxError if it points outside)."""
        return os.path.lexists(self.workspace.resolve(path))


def _error_result(message: str, duration_s: float, exit_code: int = 2, timed_out: bool = False) -> ExecResult:
    return ExecResult(exit_code=exit_code, stdout="", stderr=message + "\n", duration_s=duration_s,
                      timed_out=timed_out)


class _ServerSandbox(Sandbox):
    """Shared machinery: one `_CommandServer` per sandbox, restarted when it dies."""

    backend = ""

    def __init__(self, workspace: Workspace, limits: SandboxLimits, owns_workspace: bool,
                 host_uid: int | None, mounts: tuple[SandboxMount, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        super().__init__(workspace, limits, owns_workspace)
        self._host_uid = host_uid
        self._mounts = tuple(mounts)
        self._extra_env = _checked_env(env)
        self._file_owner = host_uid
        self._lock = threading.Lock()
        self._servers: list[_Server] = []  # at most one; shared with the finalizer
        self._closed = False
        self._cwd = self._inside_root()
        self._finalizer = weakref.finalize(self, _stop_servers, self._servers)
        if host_uid is not None:
            self._prepare_workspace_for(host_uid)
            for mount in self._mounts:
                blocked = _others_can_search(os.path.realpath(mount.source))
                if blocked is not None:
                    raise SandboxUnavailableError(
                        f"the mount source {mount.source} is not reachable by the sandbox user"
                        f" (host uid {host_uid}): {blocked} is not searchable by others; keep it"
                        " under a world-searchable folder")
                if mount.writable:
                    _give_tree(mount.source, host_uid)
        self._start()

    @property
    def inside_root(self) -> str:
        """Returns the workspace directory as commands inside the sandbox see it."""
        return self._inside_root()

    # ---- backend specifics ----
    def _inside_root(self) -> str:
        return WORKSPACE_MOUNT

    def _home(self) -> str:
        return "/tmp"

    def _user(self) -> str:
        return "root"

    @abstractmethod
    def _launch_argv(self) -> list[str]:
        """The argv that starts the server (the interpreter's argv is appended)."""

    def _harden(self) -> bool:
        return False

    def _launch_cwd(self) -> str:
        return "/"

    # ---- lifecycle ----
    def _prepare_workspace_for(self, host_uid: int) -> None:
        root = str(self.workspace.root)
        blocked = _others_can_search(root)
        if blocked is not None:
            raise SandboxUnavailableError(
                f"the workspace {root} is not reachable by the sandbox user (host uid {host_uid}):"
                f" {blocked} is not searchable by others; use a base_dir under"
                f" {tempfile.gettempdir()} or make the parents world-searchable"
            )
        _give_tree(root, host_uid)

    def _server_config(self) -> dict[str, Any]:
        return {
            "root": self._inside_root(),
            "shell": _shell_path(),
            "env": {**_sandbox_env(self._home(), self._user()), **self._extra_env},
            "limits": asdict(self.limits),
            "harden": self._harden(),
        }

    def _start(self) -> _Server:
        interpreter, _prefix = _python_inside()
        argv = [*self._launch_argv(), interpreter, "-I", "-S", "-c", _SERVER_BOOTSTRAP]
        identity: dict[str, Any] = {}
        if self._host_uid is not None:
            identity = {"user": self._host_uid, "group": self._host_uid, "extra_groups": []}
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with tempfile.TemporaryFile() as diagnostics:
            try:
                process = subprocess.Popen(
                    argv, stdin=server_end.fileno(), stdout=subprocess.DEVNULL, stderr=diagnostics,
                    env=_sandbox_env(self._home()), cwd=self._launch_cwd(), close_fds=True,
                    start_new_session=True, **identity,
                )
            except OSError as exc:
                host_end.close()
                raise SandboxUnavailableError(f"{self.backend}: cannot start: {exc}") from exc
            finally:
                server_end.close()
            server = _Server(process, host_end)
            self._servers.append(server)
            deadline = time.monotonic() + _START_TIMEOUT_S
            try:
                host_end.send(_server_source())
                host_end.send(json.dumps(self._server_config()).encode("utf-8"))
                while not (server.ready and server.spares):
                    if not server.receive(deadline - time.monotonic()):
                        raise _ServerGone("timed out")
            except (_ServerGone, OSError, ValueError) as exc:
                _stop_servers(self._servers)
                diagnostics.seek(0)
                detail = diagnostics.read().decode("utf-8", "replace").strip()[-2000:]
                raise SandboxUnavailableError(
                    f"{self.backend}: the sandbox server did not start ({exc})"
                    + (f": {detail}" if detail else "")
                ) from None
        return server

    def _drop_server(self) -> None:
        _stop_servers(self._servers)

    def close(self) -> None:
        """Stop the server and every process it started; close an owned workspace."""
        self._closed = True
        if not self._lock.acquire(timeout=0.5):
            # A command is running in another thread: end the sandbox under it, then wait.
            for server in list(self._servers):
                with contextlib.suppress(OSError):
                    server.process.kill()
            self._lock.acquire()
        try:
            self._finalizer()
        finally:
            self._lock.release()
        if self._owns_workspace:
            self.workspace.close()

    # ---- commands ----
    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with bash in the sandbox and return its result (see `Sandbox.exec`)."""
        started = time.monotonic()
        if not isinstance(command, str):
            raise TypeError(f"command must be a str, got {type(command).__name__}")
        limit_s = self.limits.timeout_s if timeout is None else float(timeout)
        if not math.isfinite(limit_s) or limit_s <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        try:
            encoded = command.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            encoded = command.encode("utf-8", "replace")
        if b"\x00" in encoded:
            return _error_result("harnessrl sandbox: the command contains a NUL byte; it was not run",
                                 time.monotonic() - started)
        if len(encoded) > MAX_COMMAND_BYTES:
            return _error_result(
                f"harnessrl sandbox: the command is {len(encoded)} bytes long, more than the"
                f" {MAX_COMMAND_BYTES} allowed; it was not run (write long content to a file"
                " with a file tool instead)", time.monotonic() - started)
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            try:
                return self._run(encoded, started, limit_s)
            except SandboxUnavailableError as exc:
                return _error_result(f"harnessrl sandbox: the sandbox could not be restarted: {exc}",
                                     time.monotonic() - started, exit_code=_LOST_EXIT_CODE)
            except _ServerGone:
                self._drop_server()
                if self._closed:
                    raise SandboxError("the sandbox was closed while the command ran") from None
                return _error_result(
                    "harnessrl sandbox: the sandbox's shell session died while running this"
                    " command; it is restarted for the next command (background processes were"
                    " lost)", time.monotonic() - started, exit_code=_LOST_EXIT_CODE)

    def _run(self, encoded: bytes, started: float, limit_s: float) -> ExecResult:
        servers = self._servers
        if not servers or servers[-1].process.poll() is not None:
            self._drop_server()
            self._start()
        server = servers[-1]
        payload = self._cwd.encode("utf-8", "surrogateescape") + b"\0" + encoded
        for _attempt in range(5):
            shell = server.take_shell(time.monotonic() + _START_TIMEOUT_S)
            try:
                try:
                    os.pwrite(shell.script, payload, 0)
                    os.write(shell.go, b"x")
                except OSError:  # it was killed while waiting (by a background job): next one
                    server.send({"dead": True, "sid": shell.sid})
                    continue
                for name in ("go", "script"):
                    os.close(getattr(shell, name))
                    setattr(shell, name, -1)
                server.send({"started": True, "sid": shell.sid})
                result = self._supervise(server, shell, started, limit_s)
                if result is not None:
                    return result
                # It died before taking the command (it was being killed): run it on the next.
            finally:
                shell.close()
        raise _ServerGone("no shell could take the command")

    def _supervise(self, server: _Server, shell: _Shell, started: float,
                   limit_s: float) -> ExecResult | None:
        """Collect the command's output until its shell exited and the output pipes closed;
        None if the shell died before it took the command."""
        deadline = started + limit_s
        captures = {shell.stdout: _OutputCapture(self.limits.output_bytes),
                    shell.stderr: _OutputCapture(self.limits.output_bytes)}
        inodes = [os.fstat(fd).st_ino for fd in captures]
        open_outputs = set(captures)
        report = _Report()
        report_open = True
        code: int | None = None
        timed_out = False
        finished_at = 0.0
        pending: str | None = None  # the request to the server in flight: kill, clear, status
        pending_deadline = 0.0
        next_status_query = 0.0
        poller = select.poll()
        for fd in (shell.stdout, shell.stderr, shell.report, server.control.fileno()):
            poller.register(fd, select.POLLIN)

        def ask(request: str) -> None:
            nonlocal pending, pending_deadline
            server.cleared, server.status_reply = False, None
            server.send({request: True, "sid": shell.sid, "pgid": shell.pgid, "inodes": inodes})
            pending, pending_deadline = request, time.monotonic() + _REPLY_SLACK_S

        while True:
            now = time.monotonic()
            if pending == "status" and server.status_reply is not None:
                running, answer = server.status_reply
                pending = None
                if running:  # exec'ed into a program that closed the report pipe: wait on
                    next_status_query = now + 0.05
                elif code is None:
                    code = answer if answer is not None else 128 + signal.SIGKILL
                    finished_at = now
            elif pending in ("kill", "clear") and server.cleared:
                break
            if pending is not None and now >= pending_deadline:
                raise _ServerGone("the sandbox server stopped answering")
            if pending in ("kill", "clear"):
                wait = pending_deadline - now
            elif code is None and now >= deadline:
                timed_out = True
                ask("kill")
                continue
            elif code is not None:
                if not open_outputs:
                    break
                if now >= finished_at + _OUTPUT_GRACE_S:
                    # Background processes still hold the output: they end with the command.
                    ask("clear")
                    continue
                wait = finished_at + _OUTPUT_GRACE_S - now
            elif not report_open and pending is None and now >= next_status_query:
                # The shell ended without a report (it exec'ed, or was killed): ask the server.
                ask("status")
                continue
            else:
                wait = deadline - now
                if pending == "status":
                    wait = min(wait, pending_deadline - now)
                elif not report_open:
                    wait = min(wait, next_status_query - now)
            for fd, _event in poller.poll(max(wait, 0.0) * 1000.0):
                if fd == shell.report:
                    chunk = os.read(fd, 1 << 16)
                    if chunk:
                        report.feed(chunk)
                    else:
                        report_open = False
                        poller.unregister(fd)
                        if not report.started and not timed_out:
                            return None
                    if code is None and report.status is not None:
                        code, finished_at = report.status, time.monotonic()
                elif fd in captures:
                    chunk = os.read(fd, 1 << 16)
                    if chunk:
                        captures[fd].feed(chunk)
                    else:
                        open_outputs.discard(fd)
                        poller.unregister(fd)
                else:
                    server.receive(0.0)
        for fd in open_outputs:  # what is left after the kill
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError):
                while chunk := os.read(fd, 1 << 16):
                    captures[fd].feed(chunk)
        if report.cwd:
            self._cwd = report.cwd
        stdout, cut_out = captures[shell.stdout].text()
        stderr, cut_err = captures[shell.stderr].text()
        return ExecResult(
            exit_code=_TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else _LOST_EXIT_CODE),
            stdout=stdout, stderr=stderr, duration_s=time.monotonic() - started,
            timed_out=timed_out, truncated=cut_out or cut_err,
        )


class _BwrapSandbox(_ServerSandbox):
    """bubblewrap backend (see the module docstring for what it isolates)."""

    backend = "bwrap"

    def _launch_argv(self) -> list[str]:
        plan = _mount_plan(str(self.workspace.root), self._host_uid, self._mounts)
        return _bwrap_argv(plan, self.limits.memory_mb << 20)


class _UnshareSandbox(_ServerSandbox):
    """util-linux unshare backend (see the module docstring for what it does not isolate)."""

    backend = "unshare"

    def _launch_argv(self) -> list[str]:
        plan = _mount_plan(str(self.workspace.root), self._host_uid, self._mounts)
        script = _unshare_setup_script(plan, self.limits.memory_mb << 20)
        return [
            "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
            "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts",
            "--", "/bin/sh", "-c", script, "harnessrl-setup",
        ]

    def _harden(self) -> bool:
        return True


class _UnsandboxedSandbox(_ServerSandbox):
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


_BACKEND_CLASSES: dict[str, type[_ServerSandbox]] = {
    "bwrap": _BwrapSandbox,
    "unshare": _UnshareSandbox,
}

# The only module-level mutable state: per backend, how it runs here (the host uid to run the
# sandbox as) or why it cannot. Probed once per process, under a lock.
_PROBE_LOCK = threading.Lock()
_PROBES: dict[str, tuple[bool, int | None, str]] = {}


def _probe(backend: str) -> tuple[bool, int | None, str]:
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
    return [name for name in ("bwrap", "unshare") if _probe(name)[0]] + ["none"]


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
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"unknown sandbox backend {backend!r}; choose one of auto, {', '.join(BACKENDS)}")
    limits = limits if limits is not None else SandboxLimits()
    mounts = tuple(mounts)
    env = _checked_env(env)
    targets = [mount.target for mount in mounts]
    for index, target in enumerate(targets):
        if any(_is_within(target, other) or _is_within(other, target) for other in targets[:index]):
            raise ValueError(f"SandboxMount targets overlap: {target!r} and another mount")
    if len(mounts) > MAX_MOUNTS:
        raise ValueError(f"a sandbox takes at most {MAX_MOUNTS} extra mounts, got {len(mounts)}")
    if mounts and backend == "none":
        raise ValueError("sandbox backend 'none' cannot show extra mounts; use bwrap or unshare")
    chosen, host_uid = backend, None
    if backend == "auto":
        reasons = []
        for name in ("bwrap", "unshare"):
            usable, host_uid, reason = _probe(name)
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
        usable, host_uid, reason = _probe(backend)
        if not usable:
            raise SandboxUnavailableError(f"sandbox backend {backend!r} does not work here: {reason}")
    owns = workspace is None
    workspace = workspace if workspace is not None else Workspace()
    try:
        if chosen == "none":
            return _UnsandboxedSandbox(workspace, limits, owns, env=env)
        return _BACKEND_CLASSES[chosen](workspace, limits, owns, host_uid, mounts=mounts, env=env)
    except BaseException:
        if owns:
            workspace.close()
        raise
