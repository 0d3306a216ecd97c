"""`ServerSandbox`: the machinery both real backends share, one `CommandServer` per sandbox,
started, supervised per command and restarted when it dies."""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from harnessrl.sandbox.api import (
    MAX_COMMAND_BYTES,
    WORKSPACE_MOUNT,
    ExecResult,
    SandboxError,
    SandboxLimits,
    SandboxMount,
    SandboxUnavailableError,
    check_mounts,
    checked_env,
)
from harnessrl.sandbox.base import Sandbox
from harnessrl.sandbox.isolation import (
    VERIFICATION_ENV,
    give_tree,
    others_can_search,
    python_inside,
    sandbox_env,
    shell_path,
)
from harnessrl.sandbox.link import (
    SERVER_BOOTSTRAP,
    MalformedMessage,
    OutputCapture,
    ServerGone,
    ServerLink,
    ShellReport,
    SpareShell,
    server_source,
    stop_servers,
)
from harnessrl.sandbox.workspace import Workspace

_OUTPUT_GRACE_S = 0.1  # how long output pipes may stay open after the shell exited
_START_TIMEOUT_S = 20.0  # waiting for the server to start, or to offer a shell
_REPLY_SLACK_S = 10.0  # waiting for the server to finish a kill or clear request
_RESTART_GRACE_S = 10.0  # waiting for a sandbox's processes to end before a restart
_TIMEOUT_EXIT_CODE = 124  # like coreutils `timeout`
_LOST_EXIT_CODE = -1  # the server died while running the command


def error_result(message: str, duration_s: float, exit_code: int = 2, timed_out: bool = False) -> ExecResult:
    return ExecResult(exit_code=exit_code, stdout="", stderr=message + "\n", duration_s=duration_s,
                      timed_out=timed_out)


class ServerSandbox(Sandbox):
    """Shared machinery: one `CommandServer` per sandbox, restarted when it dies."""

    backend = ""

    def __init__(self, workspace: Workspace, limits: SandboxLimits, owns_workspace: bool,
                 host_uid: int | None, mounts: tuple[SandboxMount, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        super().__init__(workspace, limits, owns_workspace)
        self._host_uid = host_uid
        self._base_mounts = tuple(mounts)  # the caller's; a restart may add more for a while
        self._mounts = self._base_mounts
        self._extra_env = checked_env(env)
        self._file_owner = host_uid
        self._lock = threading.Lock()
        self._servers: list[ServerLink] = []  # at most one; shared with the finalizer
        self._closed = False
        self._checked = False  # a verification session: exit statuses only from the server
        self._cwd = self._inside_root()
        self._finalizer = weakref.finalize(self, stop_servers, self._servers)
        if host_uid is not None:
            self._prepare_workspace_for(host_uid)
        self._admit_mounts(self._mounts)
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
        blocked = others_can_search(root)
        if blocked is not None:
            raise SandboxUnavailableError(
                f"the workspace {root} is not reachable by the sandbox user (host uid {host_uid}):"
                f" {blocked} is not searchable by others; use a base_dir under"
                f" {tempfile.gettempdir()} or make the parents world-searchable"
            )
        give_tree(root, host_uid)

    def _admit_mounts(self, mounts: tuple[SandboxMount, ...]) -> None:
        """Check that the sandbox user can reach each mount; give it the writable ones."""
        if self._host_uid is None:
            return
        for mount in mounts:
            blocked = others_can_search(os.path.realpath(mount.source))
            if blocked is not None:
                raise SandboxUnavailableError(
                    f"the mount source {mount.source} is not reachable by the sandbox user"
                    f" (host uid {self._host_uid}): {blocked} is not searchable by others; keep"
                    " it under a world-searchable folder")
            if mount.writable:
                give_tree(mount.source, self._host_uid)

    def _server_config(self) -> dict[str, Any]:
        return {
            "root": self._inside_root(),
            "shell": shell_path(),
            "env": {**sandbox_env(self._home(), self._user()), **self._extra_env,
                    **(VERIFICATION_ENV if self._checked else {})},
            "limits": asdict(self.limits),
            "harden": self._harden(),
            "direct": self._checked,
        }

    def _start(self) -> ServerLink:
        interpreter, _prefix = python_inside()
        argv = [*self._launch_argv(), interpreter, "-I", "-S", "-c", SERVER_BOOTSTRAP]
        identity: dict[str, Any] = {}
        if self._host_uid is not None:
            identity = {"user": self._host_uid, "group": self._host_uid, "extra_groups": []}
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with tempfile.TemporaryFile() as diagnostics:
            try:
                process = subprocess.Popen(
                    argv, stdin=server_end.fileno(), stdout=subprocess.DEVNULL, stderr=diagnostics,
                    env=sandbox_env(self._home()), cwd=self._launch_cwd(), close_fds=True,
                    start_new_session=True, **identity,
                )
            except OSError as exc:
                host_end.close()
                raise SandboxUnavailableError(f"{self.backend}: cannot start: {exc}") from exc
            finally:
                server_end.close()
            server = ServerLink(process, host_end)
            self._servers.append(server)
            deadline = time.monotonic() + _START_TIMEOUT_S
            try:
                host_end.send(server_source())
                host_end.send(json.dumps(self._server_config()).encode("utf-8"))
                while not (server.ready and server.spares):
                    if not server.receive(deadline - time.monotonic()):
                        raise ServerGone("timed out")
            except (ServerGone, OSError, ValueError) as exc:
                stop_servers(self._servers)
                diagnostics.seek(0)
                detail = diagnostics.read().decode("utf-8", "replace").strip()[-2000:]
                raise SandboxUnavailableError(
                    f"{self.backend}: the sandbox server did not start ({exc})"
                    + (f": {detail}" if detail else "")
                ) from None
        return server

    def _drop_server(self) -> None:
        stop_servers(self._servers)

    def restart(self, mounts: Sequence[SandboxMount] = (), verification: bool = False) -> None:
        """End every process of this sandbox, then start a fresh session over the same
        workspace (see `Sandbox.restart`)."""
        extra = tuple(mounts)
        check_mounts((*self._base_mounts, *extra))
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            if not stop_servers(self._servers, grace_s=_RESTART_GRACE_S):
                raise SandboxError(
                    "the sandbox's processes did not end within"
                    f" {_RESTART_GRACE_S:.0f} s; the sandbox was killed instead, so it cannot"
                    " promise that none of them is left")
            self._admit_mounts(extra)
            self._mounts = (*self._base_mounts, *extra)
            self._checked = verification
            self._cwd = self._inside_root()
            self._start()

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
            return error_result("harnessrl sandbox: the command contains a NUL byte; it was not run",
                                 time.monotonic() - started)
        if len(encoded) > MAX_COMMAND_BYTES:
            return error_result(
                f"harnessrl sandbox: the command is {len(encoded)} bytes long, more than the"
                f" {MAX_COMMAND_BYTES} allowed; it was not run (write long content to a file"
                " with a file tool instead)", time.monotonic() - started)
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            try:
                return self._run(encoded, started, limit_s)
            except SandboxUnavailableError as exc:
                return error_result(f"harnessrl sandbox: the sandbox could not be restarted: {exc}",
                                     time.monotonic() - started, exit_code=_LOST_EXIT_CODE)
            except MalformedMessage as exc:
                self._drop_server()
                raise SandboxError(
                    f"the sandbox's control link carried a malformed message ({exc}); its"
                    " server was stopped (with every process in the sandbox) and a fresh one"
                    " runs the next command") from None
            except ServerGone:
                self._drop_server()
                if self._closed:
                    raise SandboxError("the sandbox was closed while the command ran") from None
                return error_result(
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
        raise ServerGone("no shell could take the command")

    def _supervise(self, server: ServerLink, shell: SpareShell, started: float,
                   limit_s: float) -> ExecResult | None:
        """Collect the command's output until its shell exited and the output pipes closed;
        None if the shell died before it took the command.

        The exit status comes from the shell's report, or from the server when the shell
        ended without one; in a verification session only from the server."""
        deadline = started + limit_s
        captures = {shell.stdout: OutputCapture(self.limits.output_bytes),
                    shell.stderr: OutputCapture(self.limits.output_bytes)}
        inodes = [os.fstat(fd).st_ino for fd in captures]
        open_outputs = set(captures)
        report = ShellReport()
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
            server.cleared, server.running_reply = False, False
            server.send({request: True, "sid": shell.sid, "pgid": shell.pgid, "inodes": inodes})
            pending, pending_deadline = request, time.monotonic() + _REPLY_SLACK_S

        while True:
            now = time.monotonic()
            if code is None and shell.sid in server.exit_codes:
                code, finished_at = server.exit_codes.pop(shell.sid), now
            elif code is None and report.status is not None and not self._checked:
                code, finished_at = report.status, now
            if pending == "status" and (code is not None or server.running_reply):
                pending = None
                if code is None:  # exec'ed into a program that closed the report pipe: wait on
                    next_status_query = now + 0.05
            elif pending in ("kill", "clear") and server.cleared:
                break
            if pending is not None and now >= pending_deadline:
                raise ServerGone("the sandbox server stopped answering")
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
                elif fd in captures:
                    chunk = os.read(fd, 1 << 16)
                    if chunk:
                        captures[fd].feed(chunk)
                    else:
                        open_outputs.discard(fd)
                        poller.unregister(fd)
                else:
                    server.receive(0.0)
        for fd, capture in ((shell.report, report), *captures.items()):  # what is left after the kill
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError):
                while chunk := os.read(fd, 1 << 16):
                    capture.feed(chunk)
        if not report.started and not timed_out:
            return None  # it died (killed by a background process) before it took the command
        if report.cwd:
            self._cwd = report.cwd
        stdout, cut_out = captures[shell.stdout].text()
        stderr, cut_err = captures[shell.stderr].text()
        return ExecResult(
            exit_code=_TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else _LOST_EXIT_CODE),
            stdout=stdout, stderr=stderr, duration_s=time.monotonic() - started,
            timed_out=timed_out, truncated=cut_out or cut_err,
        )
