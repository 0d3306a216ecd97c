"""What a sandbox can see: the mount plan shared by both backends, bwrap's argv, the unshare
setup script, and the fixed environment of sandboxed commands (see docs/sandbox.md)."""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import stat
import subprocess
import sys

from harnessrl.sandbox.api import (
    MAX_MOUNTS,
    SYSTEM_LINKS,
    WORKSPACE_MOUNT,
    SandboxMount,
    SandboxUnavailableError,
    is_within,
)

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
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_env(home: str, user: str = "root") -> dict[str, str]:
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


NO_PYCACHE = "/dev/null/harnessrl-no-pycache"
"""A ``pycache_prefix`` under which no file can exist or be created: an interpreter given it
compiles every module from its source and never reads a ``__pycache__`` of the workspace."""

VERIFICATION_ENV = {"PYTHONPYCACHEPREFIX": NO_PYCACHE, "PYTHONNOUSERSITE": "1"}
"""Added to the commands' environment in a verification session: no Python there reads
bytecode the policy left (a forged ``__pycache__`` of a protected module) or a user site."""


@functools.lru_cache(maxsize=1)
def python_inside() -> tuple[str, str | None]:
    """The interpreter that runs the server inside, and a prefix to bind if it is not in /usr."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate, None
    interpreter = os.path.realpath(sys.executable)
    return interpreter, os.path.realpath(sys.base_prefix)


def shell_path() -> str:
    """bash, which runs every command (the sandbox's /bin is the host's /usr/bin or /bin)."""
    for candidate in ("/bin/bash", "/usr/bin/bash"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailableError("bash is required to run sandboxed commands; install bash")


def give_tree(root: str, host_uid: int) -> None:
    """Make ``host_uid`` own ``root`` and everything under it (symlinks themselves, not targets)."""
    os.lchown(root, host_uid, host_uid)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                os.lchown(os.path.join(parent, name), host_uid, host_uid)


def others_can_search(path: str) -> str | None:
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
    if others_can_search(path) is not None:
        return False
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def mount_plan(workspace: str, host_uid: int | None,
                mounts: tuple[SandboxMount, ...] = ()) -> list[tuple[str, ...]]:
    """The sandbox's filesystem, as ("ro"|"bind"|"symlink"|"mask_file"|"mask_dir"|"proc"|
    "dev"|"tmp"|"extra_ro"|"extra_rw", ...) steps shared by the bwrap and unshare backends; the
    ``extra_*`` steps are the caller's `SandboxMount` directories."""
    plan: list[tuple[str, ...]] = [("ro", "/usr", "/usr")]
    for name in SYSTEM_LINKS:
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
    _interpreter, prefix = python_inside()
    if prefix is not None and not is_within(prefix, "/usr"):
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


def bwrap_sizes_tmpfs() -> bool:
    """Whether this bwrap sizes the tmpfs it mounts (``--size``: bubblewrap 0.8.0 and later)."""
    return "--size" in _bwrap_options()


def bwrap_argv(plan: list[tuple[str, ...]], tmp_bytes: int, scratch: str | None = None) -> list[str]:
    """The bwrap argv of ``plan``: the private ``/tmp`` and ``/dev/shm`` are tmpfs of ``tmp_bytes``
    each, or, with ``scratch`` (for a bwrap without ``--size``), its host folders ``tmp`` and
    ``shm`` bound there (``backends._BwrapSandbox`` sizes them)."""
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
    size = ["--size", str(tmp_bytes)] if "--size" in options else []
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
            shm = ["--bind", os.path.join(scratch, "shm")] if scratch else [*size, "--tmpfs"]
            argv += ["--dev", step[1], *shm, step[1] + "/shm", "--remount-ro", step[1]]
        elif kind == "tmp":
            argv += ["--bind", os.path.join(scratch, "tmp"), step[1]] if scratch else [*size, "--tmpfs", step[1]]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE_MOUNT, "--"]
    return argv


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def unshare_setup_script(plan: list[tuple[str, ...]], tmp_bytes: int) -> str:
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
