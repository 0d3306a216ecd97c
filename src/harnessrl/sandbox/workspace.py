"""`Workspace`: the fresh host directory of one episode, and confinement of paths to it.

A workspace that is removed on close holds an exclusive ``flock`` on a lock file beside it
(``<root>.harnessrl-workspace.lock``, outside the workspace, so the policy never sees it) for
as long as its process lives. A process ended by SIGKILL removes nothing, but its locks go
with it: `remove_stale_workspaces` (run when a trainer starts) removes every workspace whose
lock nobody holds, whatever PID namespace its owner ran in; only files with that suffix are
considered, so no other program's lock is taken for one of ours.

A workspace with a quota (``quota_mb``: `SandboxLimits.disk_mb` for the workspaces
`open_sandbox` makes) is a size-limited tmpfs mounted on its directory, where this process may
mount (root): an episode that fills it gets `ENOSPC` in its own commands and nobody else's disk
fills. Elsewhere the quota is not applied (`quota_applied` says which) and a warning says so once.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from harnessrl.sandbox.api import WORKSPACE_MOUNT, SandboxError, is_within

logger = logging.getLogger(__name__)


_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV = 2, 4
QUOTA_SOURCE = "harnessrl-quota"  # the tmpfs source name of every quota mount, in /proc/mounts
_quota_warned = False


FIXED_FILE_TIME = 1_767_225_600.0
"""2026-01-01 00:00:00 UTC: the time a deterministic episode's starting files show (``Workspace.freeze_times``)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount_quota(root: str, quota_mb: int) -> bool:
    """Mounts a tmpfs of ``quota_mb`` MiB on ``root`` (owner and mode kept); whether it could."""
    global _quota_warned
    info = os.stat(root)
    options = f"size={quota_mb}m,mode={info.st_mode & 0o7777:o},uid={info.st_uid},gid={info.st_gid}"
    if os.geteuid() == 0 and _libc().mount(QUOTA_SOURCE.encode(), root.encode(), b"tmpfs",
                                           _MS_NOSUID | _MS_NODEV, options.encode()) == 0:
        return True
    if not _quota_warned:
        _quota_warned = True
        reason = "not root" if os.geteuid() != 0 else os.strerror(ctypes.get_errno() or errno.EPERM)
        logger.warning("sandbox: no per-episode disk quota here (%s): an episode that fills the disk can fail "
                       "its neighbours' checks (docs/security.md)", reason)
    return False


def _unmount_quota(path: str) -> None:
    """Detaches a quota tmpfs mounted on ``path`` (ours: its source is ``QUOTA_SOURCE``)."""
    with contextlib.suppress(OSError):
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        target = os.path.realpath(path)
        if any(line.split()[:2] == [QUOTA_SOURCE, target] for line in mounts):
            _libc().umount2(target.encode(), _MNT_DETACH)


def _remove_tree(path: str) -> None:
    """Delete a directory tree, fixing permissions a sandboxed process may have removed (a
    quota tmpfs on it is detached first: its files go with it)."""
    _unmount_quota(path)
    top = os.path.realpath(path)

    def fix_and_retry(func: Any, failed: str, _exc_info: Any) -> None:
        with contextlib.suppress(OSError):
            parent = os.path.realpath(os.path.dirname(failed))
            if os.path.commonpath([top, parent]) == top:  # never a folder outside the tree (/tmp itself)
                os.chmod(parent, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
            func(failed)

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=fix_and_retry)
    if os.path.lexists(path):
        logger.warning("sandbox: could not remove workspace %s completely", path)


def _release(root: str, lock_fd: int | None) -> None:
    """Removes a workspace, then its lock file, then lets the lock go."""
    _remove_tree(root)
    if lock_fd is not None:
        with contextlib.suppress(OSError):
            os.unlink(root + LOCK_SUFFIX)
        with contextlib.suppress(OSError):
            os.close(lock_fd)


LOCK_SUFFIX = ".harnessrl-workspace.lock"  # no other program's lock file is taken for one of ours
STALE_AFTER_S = 60.0  # an unheld lock this new may be one its owner has created and not yet taken


def remove_stale_workspaces(base_dir: str | Path | None = None) -> int:
    """Removes the workspaces under ``base_dir`` (default: the temporary folder) that a dead
    process left (its lock file is there and nobody holds it); returns how many."""
    base = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
    removed = 0
    with contextlib.suppress(OSError):
        for lock in base.glob(f"*{LOCK_SUFFIX}"):
            root = str(lock)[: -len(LOCK_SUFFIX)]
            try:
                fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if time.time() - os.fstat(fd).st_mtime < STALE_AFTER_S:  # its owner may be taking the lock
                    raise BlockingIOError
            except OSError:  # held: its owner is alive
                os.close(fd)
                continue
            if os.path.isdir(root) and not os.path.islink(root):
                _remove_tree(root)
                removed += 1
            _release(root, fd)
    if removed:
        logger.info("sandbox: removed %d workspace(s) a killed process left in %s", removed, base)
    return removed


class Workspace:
    """A fresh directory for one episode, removed on `close` unless ``keep`` is set.

    The caller lays out the task's files under `root` (before opening a sandbox on it, or later
    through `Sandbox.write_file`); inside the sandbox the directory is `WORKSPACE_MOUNT`.
    ``quota_mb`` bounds its total size where this process may mount a tmpfs (module docstring;
    ``quota_applied``); a kept workspace gets none (it outlives the mount's owner).
    """

    def __init__(self, base_dir: str | Path | None = None, prefix: str = "ws-", keep: bool = False,
                 quota_mb: int | None = None) -> None:
        base = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        self.root: Path = Path(os.path.realpath(tempfile.mkdtemp(prefix=prefix, dir=base)))
        self.keep = keep
        self.quota_mb = quota_mb
        lock_fd = None
        if not keep:  # a kept workspace is for a person to read: no sweep may take it
            lock_fd = os.open(str(self.root) + LOCK_SUFFIX, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            os.set_inheritable(lock_fd, False)
        self._finalizer = weakref.finalize(self, _release, str(self.root), lock_fd)
        if keep:
            self._finalizer.detach()
        # Mounted once the lock is held: a killed owner's mount is found by the stale sweep.
        self.quota_applied = bool(quota_mb) and not keep and _mount_quota(str(self.root), int(quota_mb or 0))

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
            if is_within(os.path.normpath(text), root):
                joined = text
            elif text == WORKSPACE_MOUNT or text.startswith(WORKSPACE_MOUNT + "/"):
                joined = os.path.join(root, text[len(WORKSPACE_MOUNT):].lstrip("/"))
            else:
                raise SandboxError(f"path '{shown}' is outside the workspace")
        else:
            joined = os.path.join(root, text)
        if not is_within(os.path.normpath(joined), root):
            raise SandboxError(f"path '{shown}' is outside the workspace")
        real = os.path.realpath(joined)  # resolves each symlink before any ".." after it
        if not is_within(real, root):
            raise SandboxError(
                f"path '{shown}' is outside the workspace (a symlink on the way points outside)"
            )
        return Path(real)

    def freeze_times(self, when: float = FIXED_FILE_TIME) -> int:
        """Sets the access and modification time of the workspace and everything in it (symlinks
        themselves, not their targets) to ``when``, so that a listing (``ls -l``, ``stat``) shows
        the same dates whenever the episode runs; returns how many entries it set."""
        count = 0
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in [*dirnames, *filenames]:
                os.utime(os.path.join(dirpath, name), (when, when), follow_symlinks=False)
                count += 1
        os.utime(self.root, (when, when))
        return count + 1

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

