"""Behaviour of harnessrl.sandbox: isolation, limits, confinement and session semantics.

Every adversarial test runs against each real backend (bwrap, unshare) that works on this
machine; a backend that cannot run here is skipped with the probe's reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import usable_backend_or_skip
from harnessrl import sandbox as sandbox_module
from harnessrl.sandbox import (
    WORKSPACE_MOUNT,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxLimits,
    Workspace,
    available_backends,
    open_sandbox,
)

REAL_BACKENDS = ("bwrap", "unshare")


@pytest.fixture(params=REAL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return usable_backend_or_skip(request.param)


@pytest.fixture
def sandbox(backend: str):
    with open_sandbox(backend=backend, limits=SandboxLimits(timeout_s=20.0)) as box:
        yield box


def _processes_named(marker: str) -> list[int]:
    """Host pids whose argv[0] is ``marker`` (set with bash's ``exec -a``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv0 = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0", 1)[0]
            if argv0 == marker.encode():
                found.append(int(entry))
    return found


def _wait_until_gone(marker: str, within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := _processes_named(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _host_address() -> str | None:
    """A non-loopback address of this host, if it has one."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent for UDP connect
        address = probe.getsockname()[0]
        if not address.startswith("127."):
            return address
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            if not info[4][0].startswith("127."):
                return info[4][0]
    return None


# --------------------------------------------------------------------------------------------
# Commands: output, session, bad input
# --------------------------------------------------------------------------------------------


def test_exec_reports_output_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.exec("echo out; echo err >&2; exit 3")
    assert isinstance(result, ExecResult)
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert not result.ok and not result.timed_out and not result.truncated
    assert sandbox.exec("true").ok
    # Exit codes that no EXIT trap reports: a shell replaced by exec, a shell killed.
    assert sandbox.exec("exec sh -c 'exit 5'").exit_code == 5
    assert sandbox.exec("kill -9 $BASHPID").exit_code == 128 + signal.SIGKILL
    assert sandbox.exec("python3 -c 'import os; os.kill(os.getpid(), 15)'").exit_code == 128 + 15
    # exec'ed into a program that closes every pipe, then runs on: waited for, not lost.
    closer = "import os, time; [os.close(fd) for fd in (1, 2, 97)]; time.sleep(1); os._exit(4)"
    assert sandbox.exec(f'exec python3 -c "{closer}"', timeout=15).exit_code == 4


def test_working_directory_persists_across_commands(sandbox: Sandbox) -> None:
    assert sandbox.exec("pwd").stdout == WORKSPACE_MOUNT + "\n"
    assert sandbox.exec("mkdir -p a/b && cd a/b").ok
    assert sandbox.exec("pwd").stdout == f"{WORKSPACE_MOUNT}/a/b\n"
    assert sandbox.exec("cd ..; exit 4").exit_code == 4  # `exit` still records the cwd
    assert sandbox.exec("pwd").stdout == f"{WORKSPACE_MOUNT}/a\n"
    # A failed cd leaves it; a removed directory falls back to the workspace root.
    assert not sandbox.exec("cd /does/not/exist").ok
    assert sandbox.exec("pwd").stdout == f"{WORKSPACE_MOUNT}/a\n"
    sandbox.exec(f"cd {WORKSPACE_MOUNT} && rm -rf a && mkdir gone && cd gone && rmdir ../gone")
    assert sandbox.exec("pwd").stdout == WORKSPACE_MOUNT + "\n"


def test_environment_changes_do_not_persist(sandbox: Sandbox) -> None:
    assert sandbox.exec("export HARNESSRL_FOO=1; echo $HARNESSRL_FOO").stdout == "1\n"
    assert sandbox.exec("echo ${HARNESSRL_FOO:-unset}").stdout == "unset\n"


def test_bad_commands_become_results_not_crashes(sandbox: Sandbox) -> None:
    assert sandbox.exec("").exit_code == 0
    assert sandbox.exec("   \n\t").exit_code == 0
    nul = sandbox.exec("echo a\x00b")
    assert nul.exit_code != 0 and "NUL" in nul.stderr
    huge = sandbox.exec("echo " + "a" * (sandbox_module.MAX_COMMAND_BYTES + 1))
    assert huge.exit_code != 0 and "bytes long" in huge.stderr
    # Longer than the kernel's 128 KiB argv string limit, still accepted.
    long_ok = sandbox.exec("x='" + "b" * 300_000 + "'; echo ${#x}")
    assert long_ok.stdout == "300000\n"
    syntax = sandbox.exec("echo before; if then fi")
    assert syntax.exit_code == 2 and "syntax error" in syntax.stderr
    binary = sandbox.exec(r"printf 'ok\377\376\n'")
    assert binary.stdout == "ok\ufffd\ufffd\n"
    assert sandbox.exec("echo héllo ✓").stdout == "héllo ✓\n"
    assert sandbox.exec("echo \udcff").exit_code == 0  # lone surrogate from a bad decode
    assert sandbox.exec("echo still fine").stdout == "still fine\n"


def test_stdin_is_empty_so_reading_commands_do_not_hang(sandbox: Sandbox) -> None:
    result = sandbox.exec("cat; read line; echo done", timeout=10)
    assert not result.timed_out and result.stdout == "done\n"


# --------------------------------------------------------------------------------------------
# Isolation
# --------------------------------------------------------------------------------------------


def test_network_is_unreachable_except_own_loopback(sandbox: Sandbox) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    port = server.getsockname()[1]
    try:
        targets = [("127.0.0.1", port), ("1.1.1.1", 53)]
        if (address := _host_address()) is not None:
            targets.append((address, port))
        for host, target_port in targets:
            # The host can reach its own server: the sandbox's failure is the sandbox's doing.
            if host != "1.1.1.1":
                socket.create_connection((host, target_port), timeout=2).close()
            probe = sandbox.exec(
                "python3 -c \"import socket; socket.create_connection("
                f"('{host}', {target_port}), timeout=2); print('connected')\"",
                timeout=15,
            )
            assert "connected" not in probe.stdout, (host, probe)
            assert probe.exit_code != 0
    finally:
        server.close()
    loopback = sandbox.exec(
        "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1);"
        " socket.create_connection(s.getsockname(), timeout=2); print('loopback ok')\""
    )
    assert loopback.stdout == "loopback ok\n"


def test_writes_outside_the_workspace_fail_or_stay_private(sandbox: Sandbox) -> None:
    name = f"harnessrl-{uuid.uuid4().hex}"
    for target in (f"/etc/{name}", f"/usr/{name}", f"/{name}", f"/proc/{name}", f"/dev/{name}"):
        result = sandbox.exec(f"echo x > {target}")
        assert result.exit_code != 0, target
    assert not os.path.exists(f"/etc/{name}") and not os.path.exists(f"/usr/{name}")
    assert not os.path.exists(f"/{name}")
    private = sandbox.exec(f"echo secret > /tmp/{name} && cat /tmp/{name}")
    assert private.stdout == "secret\n"
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), name))
    assert not os.path.exists(f"/tmp/{name}")
    assert sandbox.exec(f"echo inside > {name}").ok
    assert (sandbox.workspace.root / name).read_text() == "inside\n"


def test_home_directories_of_the_host_are_invisible(sandbox: Sandbox) -> None:
    token = uuid.uuid4().hex
    markers = []
    for parent in {os.path.expanduser("~"), "/root"}:
        if not os.access(parent, os.W_OK):
            continue
        directory = tempfile.mkdtemp(dir=parent, prefix="harnessrl-marker-")
        marker = os.path.join(directory, "marker.txt")
        Path(marker).write_text(token)
        markers.append(directory)
    if not markers:
        pytest.skip("cannot create a marker in the home directory")
    try:
        for directory in markers:
            result = sandbox.exec(f"cat {directory}/marker.txt; ls {directory}")
            assert token not in result.stdout and result.exit_code != 0
        assert sandbox.exec("ls /root").exit_code != 0
    finally:
        for directory in markers:
            subprocess.run(["rm", "-rf", directory], check=False)


def test_parent_environment_is_not_inherited(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_SECRET_TEST", "hunter2-" + uuid.uuid4().hex)
    with open_sandbox(backend=backend) as box:
        env = box.exec("env").stdout
    assert "HARNESSRL_SECRET_TEST" not in env and "hunter2" not in env
    lines = set(env.splitlines())
    assert {"LANG=C.UTF-8", "TERM=dumb", "PYTHONDONTWRITEBYTECODE=1"} <= lines
    assert any(line.startswith("HOME=") and line in ("HOME=/tmp", f"HOME={WORKSPACE_MOUNT}")
               for line in lines)


def test_system_secrets_are_not_readable(sandbox: Sandbox) -> None:
    if not os.path.exists("/etc/shadow"):
        pytest.skip("no /etc/shadow here")
    result = sandbox.exec("cat /etc/shadow")
    assert result.stdout == ""  # masked, or unreadable by the sandbox user


def test_rm_rf_root_leaves_the_host_untouched(sandbox: Sandbox) -> None:
    sentinel_dir = tempfile.mkdtemp(prefix="harnessrl-sentinel-")
    sentinel = Path(sentinel_dir, "keep.txt")
    sentinel.write_text("still here")
    try:
        sandbox.write_file("victim.txt", "bye")
        sandbox.exec("rm -rf --no-preserve-root / >/dev/null 2>&1", timeout=120)
        assert sentinel.read_text() == "still here"
        assert os.path.exists("/usr/bin/env") and os.path.exists("/etc/passwd")
        assert not sandbox.exists("victim.txt")  # its own workspace may be emptied
        assert sandbox.exec("echo alive").stdout == "alive\n"
    finally:
        subprocess.run(["rm", "-rf", sentinel_dir], check=False)


# --------------------------------------------------------------------------------------------
# Limits
# --------------------------------------------------------------------------------------------


def test_timeout_kills_the_whole_process_tree(sandbox: Sandbox) -> None:
    marker = f"harnessrl-sleep-{uuid.uuid4().hex}"
    result = sandbox.exec(
        f"(exec -a {marker} sleep 1000) & (exec -a {marker} sleep 1000); echo never", timeout=1.0
    )
    assert result.timed_out and not result.ok
    assert result.exit_code == 124 and "never" not in result.stdout
    assert _wait_until_gone(marker) == []
    assert sandbox.exec("echo next").stdout == "next\n"


def test_endless_output_is_truncated(backend: str) -> None:
    limits = SandboxLimits(output_bytes=1000, timeout_s=20.0)
    with open_sandbox(backend=backend, limits=limits) as box:
        finite = box.exec("head -c 100000 /dev/zero | tr '\\0' a; echo tail-end")
        assert finite.truncated and not finite.timed_out and finite.ok
        assert "[... output truncated: 99009 bytes omitted ...]" in finite.stdout
        assert finite.stdout.startswith("a" * 500) and finite.stdout.endswith("tail-end\n")
        endless = box.exec("yes", timeout=2.0)
        assert endless.truncated and endless.timed_out
        assert len(endless.stdout) < 1200 and endless.stdout.startswith("y\ny\n")
        assert not box.exec("echo short").truncated


def test_fork_bomb_is_contained(backend: str) -> None:
    limits = SandboxLimits(max_processes=64, timeout_s=10.0)
    with open_sandbox(backend=backend, limits=limits) as box:
        bomb = box.exec(":(){ :|:& };:", timeout=10.0)
        assert isinstance(bomb, ExecResult)
        assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks
        after = box.exec("echo alive; ls /proc | grep -c '^[0-9]'")
        assert after.stdout.startswith("alive\n")
        assert int(after.stdout.split()[1]) < 10  # the bomb is gone, not just throttled


def test_process_limit_is_enforced(backend: str) -> None:
    # Python's fork fails at once at the limit (bash would retry for seconds).
    forker = textwrap.dedent(
        """
        import errno, os, time
        children = []
        try:
            for _ in range(200):
                pid = os.fork()
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                children.append(pid)
        except OSError as exc:
            print(len(children), errno.errorcode[exc.errno])
        for pid in children:
            os.kill(pid, 9)
        """
    )
    limits = SandboxLimits(max_processes=24, timeout_s=20.0)
    with open_sandbox(backend=backend, limits=limits) as box:
        box.write_file("forker.py", forker)
        result = box.exec("python3 forker.py")
    forked, error = result.stdout.split()
    assert error == "EAGAIN" and 5 < int(forked) < 24


def test_cpu_time_limit_kills_busy_processes(backend: str) -> None:
    with open_sandbox(backend=backend, limits=SandboxLimits(cpu_s=1, timeout_s=30.0)) as box:
        result = box.exec("python3 -c 'while True: pass'")
    assert not result.timed_out
    assert result.exit_code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)


def test_memory_limit_stops_large_allocations(backend: str) -> None:
    with open_sandbox(backend=backend, limits=SandboxLimits(memory_mb=256)) as box:
        small = box.exec("python3 -c 'b = bytearray(32 * 1024 * 1024); print(len(b))'")
        large = box.exec("python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'")
    assert small.stdout == f"{32 * 1024 * 1024}\n"
    assert large.exit_code != 0 and "MemoryError" in large.stderr


def test_file_size_limit_stops_large_writes(backend: str) -> None:
    with open_sandbox(backend=backend, limits=SandboxLimits(file_size_mb=1)) as box:
        result = box.exec("head -c 3000000 /dev/zero > big.bin")
        size = (box.workspace.root / "big.bin").stat().st_size
    assert result.exit_code != 0
    assert size <= 1 << 20


def fill(box: Sandbox, folder: str) -> ExecResult:
    """Writes files of 32 MiB into ``folder`` until one fails (eight at most: 256 MiB); prints the
    folder's size in MiB."""
    return box.exec(f"for i in 1 2 3 4 5 6 7 8; do head -c 33554432 /dev/zero > {folder}/f$i || break; done; "
                    f"du -sm {folder} | cut -f1")


@pytest.mark.parametrize("folder", ["/tmp", "/dev/shm"])
def test_private_tmp_and_shm_are_bounded_by_the_memory_limit(backend: str, folder: str) -> None:
    """The sandbox's private /tmp and /dev/shm are tmpfs of ``memory_mb``: files of 32 MiB each,
    written until the folder is full, stop at ENOSPC at 96 MiB, never at the 256 MiB tried."""
    with open_sandbox(backend=backend, limits=SandboxLimits(memory_mb=96, file_size_mb=64, timeout_s=60.0)) as box:
        result = fill(box, folder)
    assert "No space left on device" in result.stderr, result
    assert int(result.stdout.split()[-1]) <= 96


def test_bwrap_without_size_bounds_tmp_and_shm_in_a_scratch_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """bubblewrap before 0.8.0 has no ``--size``: its tmpfs would take up to half the machine's
    memory. The real bwrap, with ``--size`` hidden from harnessrl, gets /tmp and /dev/shm from a
    scratch folder of the sandbox's own instead, bounded as the workspace is (a tmpfs of
    ``memory_mb`` for both where the host may mount: CI runs as root) and removed with the
    sandbox. Without the scratch folder (the unsized tmpfs) all eight files fit."""
    usable_backend_or_skip("bwrap")
    from harnessrl.sandbox import isolation

    options = isolation._bwrap_options()
    monkeypatch.setattr(isolation, "_bwrap_options", lambda: options - {"--size"})
    with open_sandbox(backend="bwrap", limits=SandboxLimits(memory_mb=96, file_size_mb=64, timeout_s=60.0)) as box:
        scratch = box._scratch
        assert scratch is not None
        assert box.exec("echo seen > /tmp/where && echo seen > /dev/shm/where").exit_code == 0
        assert [(scratch.root / name / "where").read_text() for name in ("tmp", "shm")] == ["seen\n"] * 2
        if not scratch.quota_applied:
            message = "no root here: the scratch folder is on disk, limited per file (docs/security.md)"
            if os.environ.get("HARNESSRL_REQUIRE_SANDBOX_BACKENDS") == "1":  # CI runs as root
                pytest.fail(message)
            pytest.skip(message)
        box.exec("rm /tmp/where /dev/shm/where")
        shm = fill(box, "/dev/shm")
        tmp = fill(box, "/tmp")
        assert "No space left on device" in tmp.stderr, tmp
        assert int(tmp.stdout.split()[-1]) + int(shm.stdout.split()[-1]) <= 96  # one tmpfs for both
        assert box.exec("rm -f /tmp/f* /dev/shm/f* && echo room > /tmp/note && cat /tmp/note").stdout == "room\n"
    assert not scratch.root.exists()


# --------------------------------------------------------------------------------------------
# Process lifetime
# --------------------------------------------------------------------------------------------


def test_background_jobs_holding_output_end_with_the_command(sandbox: Sandbox) -> None:
    holder = f"harnessrl-holder-{uuid.uuid4().hex}"
    detached = f"harnessrl-detached-{uuid.uuid4().hex}"
    result = sandbox.exec(
        f"(exec -a {holder} sleep 1000) & "
        f"(exec -a {detached} sleep 1000) > /dev/null 2>&1 & echo started"
    )
    assert result.stdout == "started\n" and not result.timed_out
    assert _wait_until_gone(holder) == []
    assert _processes_named(detached)  # redirected background jobs keep running
    listing = sandbox.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'")
    assert detached in listing.stdout
    sandbox.close()
    assert _wait_until_gone(detached) == []


def test_kill_all_inside_does_not_break_the_session(sandbox: Sandbox) -> None:
    sandbox.exec("cd /tmp")
    result = sandbox.exec("kill -9 -1; echo after")
    assert "after" in result.stdout or result.exit_code == 137
    assert sandbox.exec("echo ok; pwd").stdout == "ok\n/tmp\n"


def test_killed_server_is_restarted_transparently(sandbox: Sandbox) -> None:
    assert sandbox.exec("mkdir -p keep && cd keep").ok
    marker = f"harnessrl-restart-{uuid.uuid4().hex}"
    outcome: list[ExecResult] = []
    runner = threading.Thread(
        target=lambda: outcome.append(sandbox.exec(f"exec -a {marker} sleep 1000", timeout=60))
    )
    runner.start()
    deadline = time.monotonic() + 10
    while not _processes_named(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_named(marker)
    sandbox._servers[-1].process.kill()  # the outer process (bwrap / unshare)
    runner.join(timeout=30)
    assert not runner.is_alive()
    lost = outcome[0]
    assert not lost.ok and "restarted" in lost.stderr
    assert _wait_until_gone(marker) == []
    after = sandbox.exec("pwd")
    assert after.stdout == f"{WORKSPACE_MOUNT}/keep\n"  # the working directory survives


_ORPHAN_CHILD = textwrap.dedent(
    """
    import sys, time
    from harnessrl.sandbox import open_sandbox
    backend, marker = sys.argv[1], sys.argv[2]
    box = open_sandbox(backend=backend)
    print(box.workspace.root, flush=True)
    box.exec(
        f"(exec -a {marker} sleep 1000) > /dev/null 2>&1 & "
        f"setsid bash -c 'exec -a {marker} sleep 1000' > /dev/null 2>&1 < /dev/null &"
    )
    print("ready", flush=True)
    time.sleep(1000)
    """
)


def test_killing_the_parent_leaves_no_orphans(backend: str) -> None:
    marker = f"harnessrl-orphan-{uuid.uuid4().hex}"
    child = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_CHILD, backend, marker],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        workspace_root = child.stdout.readline().strip()
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(_processes_named(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_processes_named(marker)) == 2
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert _wait_until_gone(marker) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    subprocess.run(["rm", "-rf", workspace_root], check=False)


def test_many_sandboxes_run_concurrently(backend: str) -> None:
    errors: list[str] = []

    def episode(index: int) -> None:
        try:
            with open_sandbox(backend=backend) as box:
                box.write_file("id.txt", f"sandbox-{index}\n")
                for step in range(5):
                    result = box.exec(f"cat id.txt; echo step-{step} >> log.txt; wc -l < log.txt")
                    expected = f"sandbox-{index}\n{step + 1}\n"
                    if result.stdout != expected:
                        errors.append(f"{index}/{step}: {result!r}")
        except Exception as exc:
            errors.append(f"{index}: {exc!r}")

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


# --------------------------------------------------------------------------------------------
# Tools and files
# --------------------------------------------------------------------------------------------


def test_tools_work_inside(sandbox: Sandbox) -> None:
    script = (
        "python3 -c 'import json, sqlite3; print(json.dumps([1]))' && "
        "sqlite3 db.sqlite 'create table t(x); insert into t values (41); select x + 1 from t;' && "
        "printf 'b 2\\na 1\\n' > f.txt && awk '{s += $2} END {print s}' f.txt && "
        "sed -n 's/^a /A=/p' f.txt && grep -c . f.txt && sort f.txt | head -1 && "
        "git init -q repo && cd repo && echo hi > x && git add x && git commit -qm init && "
        "git log --format=%s"
    )
    result = sandbox.exec(script)
    assert result.ok, result.stderr
    assert result.stdout == "[1]\n42\n3\nA=1\n2\na 1\ninit\n"


def test_file_operations_round_trip(sandbox: Sandbox) -> None:
    sandbox.write_file("pkg/mod.py", "x = 1\ny = 1\n")
    sandbox.write_file(f"{WORKSPACE_MOUNT}/pkg/data.bin", b"\x00\xff")
    assert sandbox.read_file("pkg/mod.py") == "x = 1\ny = 1\n"
    assert sandbox.read_bytes("pkg/data.bin") == b"\x00\xff"
    assert sandbox.read_file("pkg/data.bin") == "\x00\ufffd"
    assert sandbox.exists("pkg") and not sandbox.exists("nope")
    sandbox.exec("mkdir pkg/sub && echo made > pkg/made.txt")
    assert sandbox.list_dir("pkg") == ["data.bin", "made.txt", "mod.py", "sub/"]
    assert sandbox.list_dir() == ["pkg/"]
    assert sandbox.read_file(str(sandbox.workspace.root / "pkg/made.txt")) == "made\n"
    # Files written from the host stay writable from inside.
    assert sandbox.exec("echo z = 3 >> pkg/mod.py && cat pkg/mod.py").stdout == "x = 1\ny = 1\nz = 3\n"
    with pytest.raises(SandboxError, match="no such file"):
        sandbox.read_file("missing.txt")
    with pytest.raises(SandboxError, match="is a directory"):
        sandbox.read_file("pkg")
    with pytest.raises(SandboxError, match="not a directory"):
        sandbox.list_dir("pkg/mod.py")
    sandbox.exec("mkfifo pipe")
    with pytest.raises(SandboxError, match="not a regular file"):
        sandbox.read_file("pipe")


def test_edit_file_replaces_exactly_the_requested_occurrences(sandbox: Sandbox) -> None:
    sandbox.write_file("a.py", "x = 1\ny = 1\n")
    assert sandbox.edit_file("a.py", "x = 1", "x = 2") == 1
    assert sandbox.read_file("a.py") == "x = 2\ny = 1\n"
    with pytest.raises(SandboxError, match="not found"):
        sandbox.edit_file("a.py", "z = 9", "z = 0")
    sandbox.write_file("b.py", "a\na\na\n")
    with pytest.raises(SandboxError, match="3 times"):
        sandbox.edit_file("b.py", "a", "b")
    assert sandbox.read_file("b.py") == "a\na\na\n"  # unchanged after a refused edit
    with pytest.raises(SandboxError, match="3 times"):
        sandbox.edit_file("b.py", "a", "b", count=2)
    assert sandbox.edit_file("b.py", "a", "b", count=3) == 3
    assert sandbox.edit_file("b.py", "b\n", "c\n", count=None) == 3
    assert sandbox.read_file("b.py") == "c\nc\nc\n"
    with pytest.raises(SandboxError, match="must not be empty"):
        sandbox.edit_file("b.py", "", "x")


def test_symlink_escapes_are_refused(sandbox: Sandbox) -> None:
    name = f"harnessrl-{uuid.uuid4().hex}"
    assert sandbox.exec("ln -s /etc/passwd link && ln -s / root && ln -s .. up").ok
    with pytest.raises(SandboxError, match="outside the workspace"):
        sandbox.read_file("link")
    with pytest.raises(SandboxError, match="outside the workspace"):
        sandbox.write_file(f"root/tmp/{name}", "x")
    assert not os.path.exists(f"/tmp/{name}")
    with pytest.raises(SandboxError, match="outside the workspace"):
        sandbox.list_dir("root")
    with pytest.raises(SandboxError, match="outside the workspace"):
        sandbox.edit_file("link", "root", "toor")
    with pytest.raises(SandboxError, match="outside the workspace"):
        sandbox.read_file("up/" + sandbox.workspace.root.name + "/../x")
    # A symlink that stays inside is fine.
    sandbox.exec("echo target > real.txt && ln -s real.txt alias.txt")
    assert sandbox.read_file("alias.txt") == "target\n"


def test_paths_outside_the_workspace_are_refused(sandbox: Sandbox) -> None:
    outside = Path(tempfile.gettempdir(), f"harnessrl-{uuid.uuid4().hex}")
    for path in ("../evil", "a/../../evil", str(outside), f"{WORKSPACE_MOUNT}/../evil"):
        with pytest.raises(SandboxError, match="outside the workspace"):
            sandbox.write_file(path, "x")
    assert not outside.exists()
    with pytest.raises(SandboxError, match="path '/etc/passwd' is outside the workspace"):
        sandbox.read_file("/etc/passwd")
    with pytest.raises(SandboxError, match="NUL"):
        sandbox.read_file("a\x00b")


# --------------------------------------------------------------------------------------------
# Workspace, backends, configuration (no sandbox process needed)
# --------------------------------------------------------------------------------------------


def test_workspace_resolve_maps_and_confines_paths() -> None:
    with Workspace() as workspace:
        root = workspace.root
        assert workspace.resolve("a/b.txt") == root / "a" / "b.txt"
        assert workspace.resolve(f"{WORKSPACE_MOUNT}/a/../b") == root / "b"
        assert workspace.resolve(WORKSPACE_MOUNT) == root
        assert workspace.resolve(str(root / "c")) == root / "c"
        assert workspace.resolve("") == root
        for bad in ("..", "../x", "/etc/passwd", f"{WORKSPACE_MOUNT}/../etc", f"{WORKSPACE_MOUNT}x"):
            with pytest.raises(SandboxError, match="outside the workspace"):
                workspace.resolve(bad)
        (root / "out").symlink_to("/etc")
        with pytest.raises(SandboxError, match="outside the workspace"):
            workspace.resolve("out/passwd")


def test_workspace_is_removed_on_close_unless_kept() -> None:
    with Workspace(prefix="harnessrl-test-") as workspace:
        (workspace.root / "f").write_text("x")
        assert workspace.root.name.startswith("harnessrl-test-")
    assert not workspace.root.exists()
    kept = Workspace(keep=True)
    kept.close()
    try:
        assert kept.root.exists()
    finally:
        subprocess.run(["rm", "-rf", str(kept.root)], check=False)


def test_open_sandbox_closes_only_the_workspace_it_created(backend: str) -> None:
    box = open_sandbox(backend=backend)
    created = box.workspace.root
    box.close()
    assert not created.exists()
    with Workspace() as workspace:
        (workspace.root / "task.txt").write_text("laid out by the caller\n")
        with open_sandbox(workspace, backend=backend) as box:
            assert box.exec("cat task.txt && echo more >> task.txt").ok
        assert workspace.root.exists()
        assert (workspace.root / "task.txt").read_text() == "laid out by the caller\nmore\n"


def test_auto_backend_and_available_backends() -> None:
    backends = available_backends()
    assert backends[-1] == "none"
    real = [name for name in backends if name != "none"]
    if not real:
        with pytest.raises(sandbox_module.SandboxUnavailableError, match="backend='none'"):
            open_sandbox()
        return
    with open_sandbox() as box:
        assert box.backend == real[0]
        assert box.exec("echo auto").stdout == "auto\n"
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        open_sandbox(backend="docker")


def test_none_backend_must_be_explicit_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="harnessrl.sandbox"), \
            pytest.warns(RuntimeWarning, match="WITHOUT ANY ISOLATION"):
        box = open_sandbox(backend="none")
    try:
        assert "WITHOUT ANY ISOLATION" in caplog.text
        assert box.backend == "none"
        assert box.exec("echo $HARNESSRL_SECRET_TEST; pwd").stdout == f"\n{box.workspace.root}\n"
    finally:
        box.close()


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="max_processes"):
        SandboxLimits(max_processes=0)
    assert SandboxLimits().timeout_s == 30.0


def test_removing_a_workspace_never_changes_the_mode_of_the_folder_that_holds_it(tmp_path, monkeypatch):
    """A workspace whose own removal fails (here: simulated for its top folder) must not take the
    permissions of its parent (a workspace directly in /tmp once left /tmp at 0700, and every
    sandbox user after it could no longer reach its workspace)."""
    import shutil as shutil_module
    import stat

    from harnessrl.sandbox import workspace as workspace_module

    holder = tmp_path / "holder"
    tree = holder / "ws"
    (tree / "locked").mkdir(parents=True)
    (tree / "locked" / "file").write_text("x")
    os.chmod(tree / "locked", 0)  # what a sandboxed process may leave behind
    os.chmod(holder, 0o1777)
    real_rmtree = shutil_module.rmtree

    def rmtree_failing_on_top(path, onerror):
        onerror(os.rmdir, str(path), None)  # the top folder's removal fails first, as with EBUSY
        real_rmtree(path, onerror=onerror)

    monkeypatch.setattr(workspace_module.shutil, "rmtree", rmtree_failing_on_top)
    workspace_module._remove_tree(str(tree))
    assert not tree.exists()
    assert stat.S_IMODE(holder.stat().st_mode) == 0o1777
