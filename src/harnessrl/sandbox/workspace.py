"""`Workspace`: the fresh host directory of one episode, and confinement of paths to it.

A workspace that is removed on close holds an exclusive ``flock`` on a lock file beside it
(``<root>.harnessrl-workspace.lock``, outside the workspace, so the policy never sees it) for
as long as its process lives. A process ended by SIGKILL removes nothing, but its locks go
with it: `remove_stale_workspaces` (run when a trainer starts) removes every workspace whose
lock nobody holds, whatever PID namespace its owner ran in; only files with that suffix are
considered, so no other program's lock is taken for one of ours.
"""

from __future__ import annotations

import contextlib
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
    """

    def __init__(self, base_dir: str | Path | None = None, prefix: str = "ws-", keep: bool = False) -> None:
        base = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        self.root: Path = Path(os.path.realpath(tempfile.mkdtemp(prefix=prefix, dir=base)))
        self.keep = keep
        lock_fd = None
        if not keep:  # a kept workspace is for a person to read: no sweep may take it
            lock_fd = os.open(str(self.root) + LOCK_SUFFIX, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            os.set_inheritable(lock_fd, False)
        self._finalizer = weakref.finalize(self, _release, str(self.root), lock_fd)
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

