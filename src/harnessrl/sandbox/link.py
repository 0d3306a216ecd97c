"""The host side of the control link to one in-sandbox `CommandServer`: its socket, the spare
shells it offers, and what a shell reports."""

from __future__ import annotations

import array
import contextlib
import functools
import json
import os
import select
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The server is started as `python3 -I -S -c SERVER_BOOTSTRAP` with a SOCK_SEQPACKET socket as
# stdin; its first packet is the server's source. So the sandbox's `ps` shows a short line.
SERVER_BOOTSTRAP = "import os;exec(compile(os.read(0,1<<22),'harnessrl-sandbox-server','exec'))"

_SERVER_FILE = Path(__file__).with_name("server.py")


@functools.lru_cache(maxsize=1)
def server_source() -> bytes:
    """Returns the Python source of the in-sandbox command server (the first packet on its
    socket): the file server.py as it is, which runs `CommandServer.main` as ``__main__``."""
    return _SERVER_FILE.read_bytes()


class ServerGone(Exception):
    """The sandbox's server died or stopped answering."""


@dataclass
class SpareShell:
    """Host-side ends of one pre-started shell (see `CommandServer`)."""

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


class OutputCapture:
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


class ShellReport:
    """What a shell writes to its report pipe: ``r NUL`` when it has taken the command, then
    ``s<status> NUL <pwd> NUL`` from its EXIT trap (see `CommandServer`). Any sandboxed process
    can write there too: the status is a fast answer for the policy's own commands, never the
    answer of a check (the server's ``exited`` message is)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.started = False
        self.status: int | None = None
        self.cwd: str | None = None

    def feed(self, chunk: bytes) -> None:
        if self.status is not None or len(self.buffer) > _REPORT_BYTES:
            return
        self.buffer += chunk
        fields = self.buffer.split(b"\0")
        if fields[0] == b"r" and len(fields) >= 2:
            self.started = True
            fields = fields[1:]
        if self.started and len(fields) >= 3 and fields[0][:1] == b"s" and fields[0][1:].isdigit():
            self.status = int(fields[0][1:])
            self.cwd = fields[1].decode("utf-8", "surrogateescape")


_REPORT_BYTES = 1 << 16  # what a report may hold: a path, and whatever else got written there
_MAX_SPARES = 2  # the server offers one shell at a time; more is not the server speaking
_MAX_EXITS = 16  # exit statuses kept for shells the host has not taken yet


class MalformedMessage(ServerGone):
    """The control link carried something the server never sends: the link is not trusted."""


def _int_field(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedMessage(f"field {name!r} is {value!r}, not an integer")
    return value


class ServerLink:
    """Host-side handle of one running `CommandServer`: process, control socket, spare shells.

    Every message is checked against what the server sends; anything else (undecodable bytes,
    JSON that is not such a message, a shell offer without its five descriptors, too many
    offers) raises `MalformedMessage`, and the caller stops this server.
    """

    def __init__(self, process: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.process = process
        self.control = control
        self.ready = False
        self.spares: list[SpareShell] = []
        self.active_sid = -1
        self.cleared = False  # the server finished a kill/clear for the active shell
        self.exit_codes: dict[int, int] = {}  # sid -> exit status, from the server
        self.running_reply = False  # the server answered "status" for the active shell: running

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.control.send(json.dumps(message).encode("utf-8"))
        except OSError as exc:
            raise ServerGone(str(exc)) from exc

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
            raise ServerGone(str(exc)) from exc
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[: len(payload) - len(payload) % 4]))
        try:
            self._handle(data, fds)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        return True

    def _handle(self, data: bytes, fds: list[int]) -> None:
        """Act on one message; ``fds`` are closed by the caller unless a spare took them."""
        if not data:
            raise ServerGone("the sandbox server closed its control socket")
        try:
            message = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise MalformedMessage(f"undecodable message ({exc})") from None
        if not isinstance(message, dict):
            raise MalformedMessage(f"a {type(message).__name__} instead of a message")
        if "shell" in message:
            if len(fds) != 5 or len(self.spares) >= _MAX_SPARES:
                raise MalformedMessage(f"a shell offer with {len(fds)} descriptors")
            self.spares.append(SpareShell(_int_field(message, "sid"), _int_field(message, "pid"), *fds))
            fds.clear()
            return
        if fds:
            raise MalformedMessage("descriptors with a message that carries none")
        if "ready" in message:
            self.ready = True
        elif "error" in message:
            raise ServerGone(str(message["error"])[:500])
        elif "exited" in message:
            self.exit_codes[_int_field(message, "sid")] = _int_field(message, "code")
            while len(self.exit_codes) > _MAX_EXITS:
                del self.exit_codes[next(iter(self.exit_codes))]
        elif "running" in message:
            if _int_field(message, "sid") == self.active_sid:
                self.running_reply = True
        elif "cleared" in message:
            if _int_field(message, "sid") == self.active_sid:
                self.cleared = True
        else:
            raise MalformedMessage(f"unknown message {sorted(message)[:5]}")

    def take_shell(self, deadline: float) -> SpareShell:
        """The next spare shell, waiting for the server to offer one if needed."""
        while self.receive(0.0):
            pass
        while not self.spares:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerGone("the sandbox server offered no shell in time")
            self.receive(remaining)
        shell = self.spares.pop(0)
        self.active_sid, self.cleared, self.running_reply = shell.sid, False, False
        return shell

    def stop(self, grace_s: float = 2.0) -> bool:
        """Close the control socket (the server then ends every sandboxed process); make sure.

        Returns True when the launched process exited by itself within ``grace_s``: pid 1 of a
        pid namespace is reaped only after every other process in it is gone, so then nothing
        of the sandbox is left. False when it had to be killed (its namespace then dies
        shortly after, without a guarantee of when)."""
        with contextlib.suppress(OSError):
            self.control.close()
        for shell in self.spares:
            shell.close()
        self.spares.clear()
        try:
            self.process.wait(timeout=grace_s)
            return True
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5.0)
            return False


def stop_servers(holder: list[ServerLink], grace_s: float = 2.0) -> bool:
    """Stop every server in ``holder``; True when each ended by itself (see `ServerLink.stop`)."""
    ended = True
    while holder:
        ended = holder.pop().stop(grace_s) and ended
    return ended
