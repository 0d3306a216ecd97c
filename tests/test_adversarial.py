"""The policy as an attacker: attacks on the reward, the control link and the host, run on both
real sandbox backends (bwrap, unshare); each test is one attack that must fail.

In CI a backend that cannot run fails these tests instead of skipping them (see
`conftest.required_backend`). docs/security.md says what is contained and how.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import pytest

from conftest import required_backend
from harnessrl.sandbox import SandboxError, SandboxLimits, open_sandbox, others_can_search
from harnessrl.tasks import (
    Action,
    AllOf,
    CommandExit,
    PytestPasses,
    PythonCheck,
    Task,
    prepare_workspace,
    python_check,
    verify_task,
)


@pytest.fixture(params=("bwrap", "unshare"))
def backend(request: pytest.FixtureRequest) -> str:
    return required_backend(request.param)


@pytest.fixture
def sandbox(backend: str):
    with open_sandbox(backend=backend, limits=SandboxLimits(timeout_s=30.0)) as box:
        yield box


HIDDEN_FAILING_TEST = "def test_hidden():\n    assert 1 == 2\n"


def _task(verifier, protected: dict[str, str] | None = None) -> Task:
    return Task(id="adversarial", instruction="make the hidden test pass", verifier=verifier,
                gold=[Action.submit()], protected_files=protected or {})


def _hidden_test_task() -> Task:
    """A task no policy can solve: its protected test asserts 1 == 2, and a second check
    runs a command that exits 1."""
    return _task(AllOf(checks=(PytestPasses("test_hidden.py"), CommandExit("exit 1"))),
                 {"test_hidden.py": HIDDEN_FAILING_TEST})


def _argv0_pids(marker: str) -> list[int]:
    """Host pids whose argv[0] is ``marker`` (set with bash's ``exec -a``)."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0] == marker.encode():
                found.append(int(entry))
    return found


def _start_in_background(sandbox, script_name: str, script: str) -> None:
    """Writes ``script`` (Python) and starts it detached, as a policy would before submitting."""
    sandbox.write_file(script_name, script)
    assert sandbox.exec(f"nohup python3 {script_name} > /dev/null 2>&1 < /dev/null &").ok


# --------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------

FORGER = textwrap.dedent(
    """
    import os, time
    seen = set()
    stop = time.time() + 120
    while time.time() < stop:
        for pid in os.listdir('/proc'):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            path = '/proc/' + pid + '/fd/97'
            try:
                inode = os.stat(path).st_ino
                if inode in seen:
                    continue
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.write(fd, b"r\\0s0\\0/workspace\\0")
            except OSError:
                pass
            os.close(fd)
            seen.add(inode)
        time.sleep(0.001)
    """
)


def test_forged_report_pipes_cannot_pass_a_failing_check(sandbox) -> None:
    task = _hidden_test_task()
    prepare_workspace(task, sandbox)
    _start_in_background(sandbox, "forge.py", FORGER)
    time.sleep(0.5)  # the forger has found the spare shell's report pipe
    verdict = verify_task(task, sandbox)
    assert not verdict.passed, verdict.explain()
    assert [result.passed for result in verdict.results] == [False, False], verdict.explain()


def test_a_check_command_cannot_forge_its_own_exit_status(sandbox) -> None:
    """The policy's program, run by a check, writes a success report on the shell's side pipe."""
    sandbox.write_file("solution.py", "import os\nos.write(97, b's0\\0/workspace\\0')\nraise SystemExit(1)\n")
    verdict = verify_task(_task(CommandExit("python3 solution.py")), sandbox)
    assert not verdict.passed, verdict.explain()
    assert sandbox.exec("python3 solution.py").exit_code == 1


REWRITER = textwrap.dedent(
    """
    import os, time
    stop = time.time() + 120
    while time.time() < stop:
        with open('.rewrite', 'w') as out:
            out.write('def test_hidden():\\n    pass\\n')
        os.replace('.rewrite', 'test_hidden.py')
    """
)


def test_background_rewrites_of_protected_files_do_not_pass_the_hidden_test(sandbox) -> None:
    task = _task(PytestPasses("test_hidden.py"), {"test_hidden.py": HIDDEN_FAILING_TEST})
    prepare_workspace(task, sandbox)
    _start_in_background(sandbox, "rewrite.py", REWRITER)
    time.sleep(0.3)
    assert "pass" in sandbox.read_file("test_hidden.py")
    verdict = verify_task(task, sandbox)
    assert not verdict.passed, verdict.explain()
    assert sandbox.read_file("test_hidden.py") == HIDDEN_FAILING_TEST


def test_no_process_of_the_episode_is_alive_when_checks_run(sandbox) -> None:
    marker = f"harnessrl-survivor-{uuid.uuid4().hex[:12]}"
    sandbox.exec(
        f"(exec -a {marker} sleep 600) > /dev/null 2>&1 & "
        f"setsid bash -c 'exec -a {marker} sleep 600' > /dev/null 2>&1 < /dev/null & "
        f"nohup bash -c 'exec -a {marker} sleep 600' > /dev/null 2>&1 < /dev/null &"
    )
    deadline = time.monotonic() + 10
    while len(_argv0_pids(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_argv0_pids(marker)) == 3
    # Inside, during verification: no process whose argv[0] is the marker.
    alive = (f"for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\" 2>/dev/null; echo; done"
             f" | grep -c '^{marker} '")
    verdict = verify_task(_task(CommandExit(alive, code=1, stdout="0")), sandbox)
    assert verdict.passed, verdict.explain()
    assert _argv0_pids(marker) == []


# --------------------------------------------------------------------------------------------
# The control link
# --------------------------------------------------------------------------------------------

TRACER = textwrap.dedent(
    """
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    reached = {}
    attached = libc.ptrace(16, 1, None, None) == 0  # PTRACE_ATTACH to the server (pid 1)
    reached['ptrace'] = attached
    if attached:
        os.waitpid(1, 0x40000000)  # __WALL
        libc.ptrace(17, 1, None, None)  # PTRACE_DETACH
    pidfd = libc.syscall(434, 1, 0)  # pidfd_open
    control = libc.syscall(438, pidfd, 0, 0) if pidfd >= 0 else -1  # pidfd_getfd: fd 0
    reached['pidfd_getfd'] = control >= 0
    if control >= 0:
        os.write(control, b'\\xff\\xfe garbage')
    for path in ('/proc/1/mem', '/proc/1/fd/0'):
        try:
            os.close(os.open(path, os.O_RDWR))
            reached[path] = True
        except OSError:
            reached[path] = False
    print(json.dumps(reached))
    """
)


def test_the_server_cannot_be_traced_or_its_control_socket_taken(sandbox) -> None:
    sandbox.write_file("trace.py", TRACER)
    result = sandbox.exec("python3 trace.py")
    reached = json.loads(result.stdout)
    assert not any(reached.values()), reached
    assert sandbox.exec("echo alive").stdout == "alive\n"


def _server_host_pid(sandbox) -> int:
    """The host pid of the in-sandbox command server (a descendant of the launched process)."""
    pending = [sandbox._servers[-1].process.pid]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError):
            if b"harnessrl-sandbox-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                pending += [int(child) for child in (task / "children").read_text().split()]
    raise AssertionError("the sandbox server process was not found")


def _send_as_the_server(sandbox, payload: bytes) -> None:
    """Writes ``payload`` into the control socket from the server's end, as a process that
    took that end would (the host may: it is root or owns the sandbox's user namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(_server_host_pid(sandbox))
    try:
        fd = libc.syscall(438, pidfd, 0, 0)  # pidfd_getfd
        assert fd >= 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(pidfd)
    with socket.socket(fileno=fd) as server_end:
        server_end.send(payload)


@pytest.mark.parametrize("payload", [
    b"\xff\xfe garbage", b"{not json", b"[1, 2]", b'"ready"', b'{"sid": {}}',
    b'{"shell": true, "sid": 7, "pid": 1}',  # a shell offer without its descriptors
])
def test_garbage_on_the_control_link_is_a_sandbox_error(backend: str, payload: bytes) -> None:
    with open_sandbox(backend=backend) as box:
        assert box.exec("echo up").ok
        _send_as_the_server(box, payload)
        with pytest.raises(SandboxError, match="control link"):
            box.exec("echo after")
        assert box.exec("echo again").stdout == "again\n"  # a fresh server took over


def test_garbage_during_verification_is_a_recorded_failed_check(sandbox) -> None:
    def inject_then_run(ctx) -> bool:
        _send_as_the_server(ctx.sandbox, b"\xff\xfe garbage")
        return ctx.sandbox.exec("true").ok

    check = PythonCheck(inject_then_run, name=f"inject-{uuid.uuid4().hex[:8]}", on_host=True)
    with pytest.warns(RuntimeWarning, match="ON THE HOST"):
        verdict = verify_task(_task(check), sandbox)
    assert not verdict.passed
    assert "SandboxError" in verdict.explain() and "control link" in verdict.explain()


def test_a_protected_path_replaced_by_a_symlink_gets_the_real_file(sandbox) -> None:
    task = _task(PytestPasses("tests/test_hidden.py"), {"tests/test_hidden.py": HIDDEN_FAILING_TEST})
    sandbox.write_file("elsewhere/test_ok.py", "def test_hidden():\n    pass\n")
    assert sandbox.exec("mkdir -p tests && ln -sf ../elsewhere/test_ok.py tests/test_hidden.py").ok
    verdict = verify_task(task, sandbox)
    assert not verdict.passed, verdict.explain()
    assert sandbox.read_file("tests/test_hidden.py") == HIDDEN_FAILING_TEST


# --------------------------------------------------------------------------------------------
# Python checks
# --------------------------------------------------------------------------------------------

CHECK_MODULE = textwrap.dedent(
    """
    import subprocess

    def hello_prints_hello(ctx):
        root = getattr(ctx, "workspace", None) or ctx.sandbox.workspace.root
        out = subprocess.run(["python3", "hello.py"], cwd=str(root), capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip() == "Hello"
    """
)


@pytest.fixture(params=(0o755, 0o700), ids=("readable", "private"))
def check_module(request):
    """A suite's check module imported by name, in a folder the sandbox user can read, or in
    one it cannot (a checkout in a mode-700 home folder: the check runs from a copy)."""
    folder = tempfile.mkdtemp(prefix="harnessrl-check-module-")
    os.chmod(folder, request.param)
    name = f"harnessrl_adversarial_check_{uuid.uuid4().hex[:8]}"
    Path(folder, f"{name}.py").write_text(CHECK_MODULE)
    os.chmod(Path(folder, f"{name}.py"), 0o644)
    sys.path.insert(0, folder)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(folder)
        sys.modules.pop(name, None)
        shutil.rmtree(folder)


def test_python_checks_run_the_policys_code_inside_the_sandbox(sandbox, check_module) -> None:
    marker = Path(tempfile.gettempdir(), f"harnessrl-host-marker-{uuid.uuid4().hex}")
    beside = sandbox.workspace.root.parent / f"{marker.name}-beside"
    sandbox.write_file("hello.py", textwrap.dedent(f"""
        for path in ({str(marker)!r}, {str(beside)!r}):
            try:
                open(path, "w").write("the policy's code ran here")
            except OSError:
                pass
        print("Hello")
        """))
    try:
        verdict = verify_task(_task(PythonCheck(check_module.hello_prints_hello, name="hello")), sandbox)
        assert verdict.passed, verdict.explain()
        assert not marker.exists() and not beside.exists()
    finally:
        marker.unlink(missing_ok=True)
        beside.unlink(missing_ok=True)
    sandbox.write_file("hello.py", "print('Goodbye')\n")
    assert not verify_task(_task(PythonCheck(check_module.hello_prints_hello)), sandbox).passed


def test_an_unreadable_import_root_is_copied_where_the_sandbox_user_can_read_it(tmp_path) -> None:
    private = tmp_path / "home"
    (private / "pkg" / "__pycache__").mkdir(parents=True)
    (private / ".git").mkdir()
    (private / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (private / "pkg" / "data.txt").write_text("kept\n")
    (private / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    (private / ".git" / "HEAD").write_text("ref\n")
    (private / "pkg" / "big.bin").write_bytes(b"\0" * ((1 << 20) + 1))
    os.chmod(private, 0o700)
    copy = python_check.reachable_root(private)
    assert copy != private and python_check.reachable_root(private) == copy  # once per process
    assert others_can_search(str(copy / "pkg" / "__init__.py")) is None
    assert os.stat(copy / "pkg" / "__init__.py").st_mode & 0o004
    assert sorted(p.name for p in copy.rglob("*")) == ["__init__.py", "data.txt", "pkg"]
    only = python_check.reachable_root(private, "pkg")
    assert sorted(p.name for p in only.iterdir()) == ["pkg"]
    assert python_check.reachable_root(copy) == copy  # readable: mounted as it is


def test_an_import_root_too_large_to_copy_is_mounted_as_it_is(tmp_path, monkeypatch) -> None:
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    for index in range(3):
        (private / f"m{index}.py").write_text("x = 1\n")
    monkeypatch.setattr(python_check, "_COPY_FILES", 2)
    assert python_check.reachable_root(private) == private
    assert not list(Path(tempfile.gettempdir()).glob("harnessrl-check-root-*/root/m2.py"))


def test_host_python_checks_must_be_marked_and_warn_once(sandbox) -> None:
    with pytest.raises(ValueError, match="on_host=True"):
        PythonCheck(lambda ctx: True, name="closure")
    name = f"host-check-{uuid.uuid4().hex[:8]}"
    host_check = PythonCheck(lambda ctx: ctx.sandbox.exists("hello.py"), name=name, on_host=True)
    sandbox.write_file("hello.py", "")
    with pytest.warns(RuntimeWarning, match="ON THE HOST"):
        assert verify_task(_task(host_check), sandbox).passed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert verify_task(_task(host_check), sandbox).passed  # said once, not per episode


# --------------------------------------------------------------------------------------------
# The host: secrets, writes, network, survivors, exhaustion
# --------------------------------------------------------------------------------------------


def test_host_files_outside_the_workspace_cannot_be_read_or_written(sandbox) -> None:
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-host-secret-"))
    os.chmod(folder, 0o755)
    secret = folder / "secret.txt"
    secret.write_text("hunter2")
    os.chmod(secret, 0o644)
    try:
        attempt = sandbox.exec(
            f"cat {secret} /etc/shadow 2>/dev/null; echo owned > {folder}/planted;"
            f" echo owned > /usr/planted; echo owned > /etc/planted; ls {folder}")
        assert "hunter2" not in attempt.stdout and "owned" not in attempt.stdout
        assert sorted(os.listdir(folder)) == ["secret.txt"]
        assert not Path("/usr/planted").exists() and not Path("/etc/planted").exists()
    finally:
        shutil.rmtree(folder)


def test_the_network_is_out_of_reach(sandbox) -> None:
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    try:
        reach = sandbox.exec(
            "python3 -c \"import socket\nfor host in ('10.255.255.1', '8.8.8.8', socket.gethostname()):\n"
            f"    try: socket.create_connection((host, {port}), timeout=2); print('reached', host)\n"
            "    except OSError: pass\"", timeout=20)
        assert "reached" not in reach.stdout, reach
        interfaces = sandbox.exec("python3 -c 'import socket; print(*sorted(n for _, n in socket.if_nameindex()))'")
        assert interfaces.stdout.split() == ["lo"]
    finally:
        listener.close()


def test_no_process_survives_close(backend: str) -> None:
    marker = f"harnessrl-after-close-{uuid.uuid4().hex[:12]}"
    box = open_sandbox(backend=backend)
    box.exec(f"setsid nohup bash -c 'exec -a {marker} sleep 600' > /dev/null 2>&1 < /dev/null &")
    deadline = time.monotonic() + 10
    while not _argv0_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _argv0_pids(marker)
    box.close()
    deadline = time.monotonic() + 10
    while _argv0_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _argv0_pids(marker) == []


def test_exhaustion_stays_inside(backend: str) -> None:
    limits = SandboxLimits(max_processes=48, memory_mb=256, file_size_mb=2, timeout_s=8.0)
    with open_sandbox(backend=backend, limits=limits) as box:
        box.exec("bomb(){ bomb|bomb& }; bomb", timeout=5.0)
        hog = box.exec("python3 -c 'x = bytearray(1 << 30)'")
        disk = box.exec("head -c 10000000 /dev/zero > fill.bin")
        assert hog.exit_code != 0 and disk.exit_code != 0
        assert (box.workspace.root / "fill.bin").stat().st_size <= 2 << 20
        assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks
        assert box.exec("echo alive").stdout == "alive\n"


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def test_unknown_backends_and_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown sandbox backend 'docker'.*bwrap"):
        open_sandbox(backend="docker")
    from harnessrl.sandbox import check_backend_name

    assert check_backend_name("auto") == "auto"
    with pytest.raises(ValueError, match="docker"):
        check_backend_name("docker")
    for bad in ({"timeout_s": True}, {"timeout_s": float("nan")}, {"memory_mb": 1.5}):
        with pytest.raises(ValueError, match="SandboxLimits"):
            SandboxLimits(**bad)
