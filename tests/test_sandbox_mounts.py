"""Extra sandbox mounts and environment, and the relay that is an agent's only way out.

An external agent runs in the sandbox with its install folder (read-only), a state folder
(writable) and the server's folder (read-only, holding a Unix socket) mounted, and reaches the
server only through the relay on the sandbox's own loopback. These tests pin that down on each
real backend that works here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import socketserver
import tempfile
import threading
from pathlib import Path

import pytest

from conftest import usable_backend_or_skip
from harnessrl.external.relay import __file__ as RELAY_FILE
from harnessrl.sandbox import (
    MAX_MOUNTS,
    SandboxMount,
    SandboxUnavailableError,
    open_sandbox,
)


@pytest.fixture(params=("bwrap", "unshare"))
def backend(request: pytest.FixtureRequest) -> str:
    return usable_backend_or_skip(request.param)


@pytest.fixture
def shared_dir():
    """A world-searchable host folder (the sandbox user may be ``nobody``)."""
    folder = tempfile.mkdtemp(prefix="harnessrl-test-mount-")
    os.chmod(folder, 0o755)
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _folder(parent: Path, name: str, mode: int = 0o755) -> Path:
    path = parent / name
    path.mkdir()
    os.chmod(path, mode)
    return path


def test_mounts_are_read_only_unless_writable(backend: str, shared_dir: Path) -> None:
    tool = _folder(shared_dir, "tool")
    (tool / "version.txt").write_text("tool 1.0\n")
    os.chmod(tool / "version.txt", 0o644)
    state = _folder(shared_dir, "state", 0o700)
    mounts = [SandboxMount(str(tool), "/opt/tool"), SandboxMount(str(state), "/state", writable=True)]
    with open_sandbox(backend=backend, mounts=mounts) as box:
        assert box.exec("cat /opt/tool/version.txt").stdout == "tool 1.0\n"
        write_tool = box.exec("echo changed > /opt/tool/version.txt")
        assert write_tool.exit_code != 0 and "Read-only" in write_tool.stderr
        assert box.exec("touch /opt/tool/new").exit_code != 0
        assert box.exec("mkdir -p /state/home && echo kept > /state/home/log").ok
    assert (tool / "version.txt").read_text() == "tool 1.0\n"
    assert not (tool / "new").exists()
    assert (state / "home" / "log").read_text() == "kept\n"


def test_extra_environment_reaches_commands(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_TEST_PARENT_ONLY", "leak")
    env = {"AGENT_KEY": "k-123", "HOME": "/state/home", "PATH": "/opt/tool/bin:/usr/bin:/bin"}
    with open_sandbox(backend=backend, env=env) as box:
        out = box.exec('echo "$AGENT_KEY|$HOME|$PATH|${HARNESSRL_TEST_PARENT_ONLY:-unset}"').stdout
    assert out == "k-123|/state/home|/opt/tool/bin:/usr/bin:/bin|unset\n"


@pytest.mark.parametrize("target", ["/usr/local/agent", "/etc", "/tmp/agent", "/workspace", "/workspace/x",
                                    "/", "relative", "/opt/../usr", "/proc/x", "/bin"])
def test_mount_targets_the_sandbox_builds_itself_are_refused(target: str, shared_dir: Path) -> None:
    with pytest.raises(ValueError, match="SandboxMount target"):
        SandboxMount(str(shared_dir), target)


def test_bad_mount_and_environment_requests_are_clear_errors(shared_dir: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        SandboxMount(str(shared_dir / "missing"), "/opt/x")
    with pytest.raises(ValueError, match="overlap"):
        open_sandbox(mounts=[SandboxMount(str(shared_dir), "/opt/a"), SandboxMount(str(shared_dir), "/opt/a/b")])
    many = [SandboxMount(str(shared_dir), f"/opt/m{i}") for i in range(MAX_MOUNTS + 1)]
    with pytest.raises(ValueError, match="at most"):
        open_sandbox(mounts=many)
    with pytest.raises(ValueError, match="'none' cannot"):
        open_sandbox(backend="none", mounts=[SandboxMount(str(shared_dir), "/opt/a")])
    with pytest.raises(ValueError, match="not a valid name"):
        open_sandbox(env={"BAD-NAME": "x"})
    with pytest.raises(ValueError, match="NUL"):
        open_sandbox(env={"GOOD": "a\0b"})


@pytest.mark.skipif(os.geteuid() != 0, reason="only root maps the sandbox to another user")
def test_mount_source_the_sandbox_user_cannot_reach_is_refused(backend: str, shared_dir: Path) -> None:
    private = _folder(shared_dir, "private", 0o700)
    tool = _folder(private, "tool")
    with pytest.raises(SandboxUnavailableError, match="not searchable by others"):
        open_sandbox(backend=backend, mounts=[SandboxMount(str(tool), "/opt/tool")])


class _EchoHandler(socketserver.StreamRequestHandler):
    """Reads until EOF, then answers with the sha256 of what it read and its length."""

    def handle(self) -> None:
        data = self.rfile.read()
        self.wfile.write(f"{hashlib.sha256(data).hexdigest()} {len(data)}\n".encode())


_RELAY_PROBE = r"""
import hashlib, os, socket, sys
port, host_port = int(sys.argv[1]), int(sys.argv[2])
payload = os.urandom(3 << 20)
conn = socket.create_connection(("127.0.0.1", port), timeout=10)
conn.sendall(payload)
conn.shutdown(socket.SHUT_WR)
reply = b""
while chunk := conn.recv(65536):
    reply += chunk
expected = f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode()
print("relay", "ok" if reply == expected else f"mismatch {reply[:80]!r}")
try:
    socket.create_connection(("127.0.0.1", host_port), timeout=2)
    print("host loopback reachable")
except OSError as exc:
    print("host loopback unreachable", type(exc).__name__)
with open("/proc/net/dev") as dev:
    names = [line.split(":")[0].strip() for line in dev.read().splitlines()[2:]]
print("interfaces", ",".join(sorted(names)))
"""


def test_relay_reaches_the_host_socket_and_nothing_else(backend: str, shared_dir: Path) -> None:
    serve = _folder(shared_dir, "serve")
    shutil.copyfile(RELAY_FILE, serve / "relay.py")
    (serve / "probe.py").write_text(_RELAY_PROBE)
    for name in ("relay.py", "probe.py"):
        os.chmod(serve / name, 0o644)
    socket_path = serve / "serve.sock"
    unix_server = socketserver.ThreadingUnixStreamServer(str(socket_path), _EchoHandler)
    os.chmod(socket_path, 0o666)
    threading.Thread(target=unix_server.serve_forever, daemon=True).start()
    host_listener = socket.socket()
    host_listener.bind(("127.0.0.1", 0))
    host_listener.listen(4)
    host_port = host_listener.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", host_port), timeout=2).close()  # reachable from the host
        with open_sandbox(backend=backend, mounts=[SandboxMount(str(serve), "/run/harnessrl")]) as box:
            started = box.exec("python3 -I -S /run/harnessrl/relay.py 127.0.0.1 18080 /run/harnessrl/serve.sock")
            assert started.ok, started
            probe = box.exec(f"python3 /run/harnessrl/probe.py 18080 {host_port}", timeout=60)
    finally:
        unix_server.shutdown()
        unix_server.server_close()
        host_listener.close()
    lines = probe.stdout.splitlines()
    assert "relay ok" in lines, probe
    assert any(line.startswith("host loopback unreachable") for line in lines), probe
    assert "interfaces lo" in lines, probe


def test_relay_refuses_bad_arguments() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, RELAY_FILE, "127.0.0.1"], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "usage" in result.stderr
