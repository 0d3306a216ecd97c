"""Writes that a full disk cannot leave half done, and `DiskFull`, the clear error a full disk
becomes.

`write_text_atomic` writes a file through a rename (a reader sees the old file or the new one,
never a prefix); `append_text` appends one piece and, when the write fails, cuts the file back
to its old length (a ``.jsonl`` keeps whole lines only). `is_disk_full` says whether an error is
a full disk or an exhausted quota (``ENOSPC``, ``EDQUOT``, or a library's wrapping of one, such
as safetensors' ``SafetensorError``); `DiskFull` names the folder, the space left in it and,
when known, the space the write needed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

_FULL = {errno.ENOSPC, errno.EDQUOT}
_FULL_TEXT = ("no space left on device", "disk quota exceeded")


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a full disk or quota."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        if any(text in str(exc).lower() for text in _FULL_TEXT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def free_bytes(folder: str | Path) -> int | None:
    """Returns the bytes free in the filesystem of ``folder`` (or its nearest existing parent)."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


class DiskFull(OSError):
    """A write that failed because ``folder``'s filesystem is full: the message names the
    folder, what is free there and, when given, what the write ``needed``; ``hint`` says how
    to go on (a trainer: resume from its last checkpoint)."""

    def __init__(self, folder: str | Path, needed: int | None = None, hint: str = "") -> None:
        free = free_bytes(folder)
        message = f"no space left on the device of {folder}" + (
            f" ({_size(free)} free" if free is not None else " (") + (
            f", about {_size(needed)} needed)" if needed else ")")
        super().__init__(errno.ENOSPC, message + (f": {hint}" if hint else ""))
        self.folder, self.needed, self.free = Path(folder), needed, free

    def __str__(self) -> str:
        return str(self.strerror)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename; on failure the old
    file is intact, the temporary file removed, and a full disk is a `DiskFull`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # A name of its own: two processes writing one file (experiment workers writing the
        # shared experiment.json) must not rename each other's temporary file away.
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide a run's files from its other readers
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if is_disk_full(exc):
            raise DiskFull(path.parent, needed=len(text.encode("utf-8"))) from exc
        raise


def append_text(path: str | Path, text: str) -> None:
    """Appends ``text`` to ``path`` in unbuffered writes; when one fails the file is cut back
    to its old length (whole records only), and a full disk is a `DiskFull`."""
    path = Path(path)
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            if is_disk_full(exc):
                raise DiskFull(path.parent, needed=len(data)) from exc
            raise
    finally:
        os.close(fd)
