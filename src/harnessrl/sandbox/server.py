"""The in-sandbox command server: prepares, tracks and kills the shells of one sandbox.

It runs INSIDE the sandbox, started by the host as ``python3 -I -S -c SERVER_BOOTSTRAP`` with
this file's source as the first packet on its control socket (see `harnessrl.sandbox.link`).
So it imports only the standard library, uses no other module of harnessrl and must run on
Python >= 3.8 (the sandbox's system interpreter).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import resource
import select
import signal
import socket
import time


class CommandServer:
    """Prepares, tracks and kills the shells of one sandbox; started once per session.

    Shipped to the sandbox as this file's source (`harnessrl.sandbox.link.server_source`) and
    run by the system ``python3 -I -S``, so it may import only the standard library and must
    run on Python >= 3.8. It is pid 1 of the sandbox's pid namespace, and not dumpable
    (``PR_SET_DUMPABLE`` 0): the commands it runs, which have no capabilities, can neither
    trace it, nor open its ``/proc/1/mem`` or ``/proc/1/fd``, nor take its control socket with
    ``pidfd_getfd``.

    The server stays off each command's critical path: it keeps one *spare* shell ready for
    the host, started ahead of time as its own child (``bash -c`` with the limits applied by
    ``ulimit``, in its own session and process group). For each spare the server makes the
    pipes (stdout, stderr, a report pipe, a go pipe) and a memfd for the command; the host-side
    ends travel to the host over the control socket (SCM_RIGHTS). The spare blocks reading one
    byte from fd 99. The host writes ``cwd NUL command`` into the memfd and then the byte, and
    reads the output itself. The spare writes ``r NUL`` to the report pipe (fd 97) once it has
    the command (a spare that dies before that never ran it: the host retries on the next
    one), ``cd``s, traps EXIT to write ``d<pwd> NUL`` there and ``eval``s the command. The exit
    status never comes from that pipe, which any sandboxed process can open through
    ``/proc/<pid>/fd``: the server waits for its child and sends the status itself.

    Control messages are JSON packets. Server to host: ``ready``; ``shell`` (with the fds);
    ``exited`` (a shell's exit status); ``cleared`` (after ``kill`` or ``clear``). Host to
    server: ``started`` or ``dead`` (the host took a spare, or found it dead: prepare the next
    one); ``kill`` (kill the command's process group and whatever holds its output: the
    timeout); ``clear`` (kill whatever still holds the output after the command finished).
    EOF, or anything that is not such a message, ends the server and, as pid 1, every process
    in the sandbox.
    """

    def __init__(self, config: dict, control) -> None:
        self.control = control
        self.root = config["root"]  # the workspace as commands see it
        self.shell = config["shell"]
        self.env = config["env"]
        self.limits = config["limits"]
        self.harden = bool(config["harden"])
        self.null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.spares: dict = {}  # pid -> sid of every shell not reaped yet
        self.pgids: set = set()
        self.next_sid = 0
        self.poller = select.poll()
        self.wakeup = os.pipe()  # SIGCHLD wakes the poll through this pipe
        self.script = ""

    @classmethod
    def main(cls) -> None:
        control = socket.socket(fileno=0)
        config = json.loads(control.recv(1 << 20).decode("utf-8"))
        cls(config, control).serve()

    def serve(self) -> None:
        if self.harden:
            self.drop_privileges()
        self.make_undumpable()
        os.chdir(self.root)
        self.script = self.spare_script()
        for fd in self.wakeup:
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wakeup[1])
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self.poller.register(0, select.POLLIN)
        self.poller.register(self.wakeup[0], select.POLLIN)
        self.send({"ready": True, "pid": os.getpid()})
        self.offer_shell()
        while True:
            for fd, _event in self.poller.poll(1000):
                if fd == 0:
                    self.handle_message()
                elif fd == self.wakeup[0]:
                    with contextlib.suppress(OSError):
                        os.read(fd, 4096)
            self.reap()

    def send(self, message: dict, fds=()) -> None:
        data = json.dumps(message).encode("utf-8")
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self.control.sendmsg([data], ancillary)
        except OSError:  # the host is gone
            self.shutdown()

    def handle_message(self) -> None:
        try:
            data = self.control.recv(1 << 16)
        except OSError:
            data = b""
        try:
            message = json.loads(data.decode("utf-8"))
            if not isinstance(message, dict):
                raise ValueError("not a message")
            if "started" in message or "dead" in message:
                self.offer_shell()
            elif "kill" in message or "clear" in message:
                pgid, inodes = int(message["pgid"]), [int(inode) for inode in message["inodes"]]
                if "kill" in message:
                    self.kill_group(pgid)
                self.kill_holders(pgid, inodes)
                self.send({"cleared": True, "sid": message.get("sid")})
        except (ValueError, KeyError, TypeError):  # EOF or not a message: the link is gone
            self.shutdown()

    def shutdown(self) -> None:
        for pgid in self.pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                continue
        os._exit(0)

    # ---- the spare shells ----
    def spare_script(self) -> str:
        def capped(which: int, value: int) -> int:
            hard = resource.getrlimit(which)[1]
            return value if hard == resource.RLIM_INFINITY else min(value, hard)

        limits = self.limits
        cpu = capped(resource.RLIMIT_CPU, limits["cpu_s"])
        cpu_hard = capped(resource.RLIMIT_CPU, limits["cpu_s"] + 1)
        memory_kb = capped(resource.RLIMIT_AS, limits["memory_mb"] << 20) >> 10
        processes = capped(resource.RLIMIT_NPROC, limits["max_processes"])
        file_kb = capped(resource.RLIMIT_FSIZE, limits["file_size_mb"] << 20) >> 10
        return "; ".join([  # one line: bash counts lines from the start of the script
            f"ulimit -S -t {cpu} && ulimit -H -t {cpu_hard} && ulimit -v {memory_kb}"
            f" && ulimit -u {processes} && ulimit -f {file_kb} && ulimit -c 0"
            " || { echo 'harnessrl sandbox: cannot apply resource limits' >&2; exit 126; }",
            "read -r -n 1 -u 99 __harnessrl_go || exit 0",
            "unset __harnessrl_go",
            "exec 99<&-",
            "IFS= read -r -d '' -u 98 __harnessrl_cwd",
            "IFS= read -r -d '' -u 98 __harnessrl_cmd",
            "exec 98<&-",
            "printf 'r\\0' 2>/dev/null >&97",
            'cd -- "$__harnessrl_cwd" 2>/dev/null || cd -- ' + self.quote(self.root),
            "trap 'printf \"d%s\\0\" \"$PWD\" 2>/dev/null >&97' EXIT",
            'eval "unset __harnessrl_cwd __harnessrl_cmd; $__harnessrl_cmd"',
        ])

    def start_spare(self, fds: list):
        """Start a spare shell on these fds (ours: stdout, stderr, report, script, go); its
        pid, or None if it could not start."""
        argv = [self.shell, "-c", self.script]
        pairs = ((self.null, 0), (fds[0], 1), (fds[1], 2), (fds[2], 97), (fds[3], 98), (fds[4], 99))
        try:
            return os.posix_spawn(
                self.shell, argv, self.env, setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                file_actions=[(os.POSIX_SPAWN_DUP2, src, dst) for src, dst in pairs],
            )
        except (AttributeError, NotImplementedError, TypeError):
            pass  # no posix_spawn with setsid (old libc): the slow, equivalent path below
        except OSError:
            return None
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                for src, dst in pairs:
                    os.dup2(src, dst)
                for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                os.execve(self.shell, argv, self.env)
            finally:
                os._exit(127)
        return pid

    def offer_shell(self) -> None:
        """Prepare the next command's shell and hand its pipe ends to the host."""
        for _attempt in range(3):
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            report_r, report_w = os.pipe()
            go_r, go_w = os.pipe()
            script_fd = os.memfd_create("harnessrl-command", os.MFD_CLOEXEC)
            pid = self.start_spare([out_w, err_w, report_w, script_fd, go_r])
            for fd in (out_w, err_w, report_w, go_r):
                os.close(fd)
            host_ends = [go_w, script_fd, out_r, err_r, report_r]
            if pid is not None:
                self.spares[pid] = self.next_sid
                self.track_group(pid)
                self.send({"shell": True, "sid": self.next_sid, "pid": pid}, host_ends)
                self.next_sid += 1
            for fd in host_ends:
                os.close(fd)
            if pid is not None:
                return
        self.send({"error": "cannot prepare a shell"})

    def track_group(self, pgid: int) -> None:
        """Remember a process group to kill at shutdown; forget the ones that are gone."""
        self.pgids.add(pgid)
        if len(self.pgids) > 256:
            alive = set()
            for group in self.pgids:
                try:
                    os.killpg(group, 0)
                except OSError:
                    continue
                alive.add(group)
            self.pgids = alive

    def reap(self) -> None:
        """Collect exited children and orphans (we are pid 1); report each shell's status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            sid = self.spares.pop(pid, None)
            if sid is not None:
                if os.WIFSIGNALED(status):
                    code = 128 + os.WTERMSIG(status)
                else:
                    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
                self.send({"exited": True, "sid": sid, "code": code})

    def kill_group(self, pgid: int) -> None:
        """SIGKILL a process group until it is gone (its zombies reaped), for up to 2 s."""
        deadline = time.monotonic() + 2.0
        while True:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                return
            self.reap()
            if time.monotonic() > deadline:
                return
            time.sleep(0.001)

    def kill_holders(self, pgid: int, inodes: list) -> None:
        """SIGKILL every process holding one of these pipes; if some keep reappearing (a fork
        bomb), kill the command's whole process group as well."""
        targets = {"pipe:[" + str(inode) + "]" for inode in inodes}
        me = str(os.getpid())
        for _round in range(20):
            holders = []
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid == me:
                    continue
                try:
                    for fd in os.listdir("/proc/" + pid + "/fd"):
                        if os.readlink("/proc/" + pid + "/fd/" + fd) in targets:
                            holders.append(int(pid))
                            break
                except OSError:
                    continue
            if not holders:
                return
            for pid in holders:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
            self.reap()
            time.sleep(0.002)
        self.kill_group(pgid)

    # ---- helpers ----
    def make_undumpable(self) -> None:
        """PR_SET_DUMPABLE 0, before any command runs: without CAP_SYS_PTRACE (no command has
        it) no process can ptrace us, read or write our memory, or take our descriptors."""
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")

    def quote(self, text: str) -> str:
        return "'" + text.replace("'", "'\\''") + "'"

    def drop_privileges(self) -> None:
        """unshare backend: bring up loopback, then make sure no command gets capabilities."""
        import ctypes
        import fcntl

        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                name = b"lo".ljust(16, b"\0")
                flags = int.from_bytes(fcntl.ioctl(sock, 0x8913, name + b"\0" * 24)[16:18], "little")
                fcntl.ioctl(sock, 0x8914, name + (flags | 0x1).to_bytes(2, "little") + b"\0" * 22)
        except OSError:
            pass
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):  # PR_CAPBSET_DROP until the kernel says EINVAL
            if libc.prctl(24, cap, 0, 0, 0) != 0:
                break
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        # Drop our own capabilities too (capset v3, all zero): nothing we start gets any.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        libc.capset(header, data)


if __name__ == "__main__":
    CommandServer.main()
