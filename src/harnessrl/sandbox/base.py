"""`Sandbox`: the one interface every backend implements, with its confined file operations."""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Sequence

from harnessrl.sandbox.api import ExecResult, SandboxError, SandboxLimits, SandboxMount
from harnessrl.sandbox.workspace import Workspace


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
    def restart(self, mounts: Sequence[SandboxMount] = (), verification: bool = False) -> None:
        """End every process of this sandbox, then start a fresh session over the same workspace.

        What the episode left running (background jobs, daemons) is gone when this returns, the
        shell starts again in the workspace root, and the new session also shows ``mounts``
        (read-only unless asked) until the next restart. With ``verification`` the session
        takes each command's exit status only from the sandbox's server (which waited for the
        shell), never from a pipe a sandboxed process could write to: `verify_task` restarts
        so before any check runs. Raises `SandboxError` when the old processes cannot be shown
        to be gone.
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

