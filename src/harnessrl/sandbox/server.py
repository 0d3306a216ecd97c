"""The in-sandbox command server: prepares, tracks and kills the shells of one sandbox.

It runs INSIDE the sandbox, started by the host as ``python3 -I -S -c SERVER_BOOTSTRAP`` with
this file's source as the first packet on its control socket (see `harnessrl.sandbox.link`).
So it imports only the standard library, uses no other module of harnessrl and must run on
Python >= 3.8 (the sandbox's system interpreter).
"""

from __future__ import annotations

import array
import json
import os
import resource
import select
import signal
import socket
import time


class CommandServer:
    """Prepares, tracks and kills the shells of one sandbox; started once per episode.

    Shipped to the sandbox as this file's source (`harnessrl.sandbox.link.server_source`) and
    run by the system ``python3 -I -S``, so it may import only the standard library and must
    run on Python >= 3.8. It is pid 1 of the sandbox's pid namespace.

    The server stays off each command's critical path. It keeps one *spare* shell ready for the
    host. Spares are forked by a long-lived *master* bash (forking an initialized bash costs a
    fraction of starting one): the master has job control on, so each spare is its own process
    group, with the limits the master set with ``ulimit``. For each spare the server makes the
    pipes (stdout, stderr, a report pipe, a go pipe) and a memfd for the command, and tells the
    master their fd numbers; the master opens them through ``/proc/<server>/fd``, forks the
    spare and answers with its pid. The host-side ends travel to the host over the control
    socket (SCM_RIGHTS). The spare blocks reading one byte from fd 99. The host writes ``cwd NUL
    command`` into the memfd and then the byte, and reads the output itself. The spare writes
    ``r NUL`` to the report pipe (fd 97) once it has the command (a spare that dies before that
    never ran it: the host retries on the next one), ``cd``s, traps EXIT to write ``s<status>
    NUL <pwd> NUL`` there and ``eval``s the command. When a spare ends without that report (it
    ``exec``ed, or was killed) the host asks for its status, which the master shell still has
    (``wait <pid>``).

    Control messages are JSON packets. Server to host: ``ready``; ``shell`` (with the fds);
    ``cleared`` (after ``kill`` or ``clear``); ``status``. Host to server: ``started`` or
    ``dead`` (the host took a spare, or found it dead: prepare the next one); ``status`` (the
    exit status of a spare that did not report one); ``kill`` (kill the command's process
    group and whatever holds its output: the timeout); ``clear`` (kill whatever still holds the
    output after the command finished). EOF on the socket ends the server and, as pid 1, every
    process in the sandbox.
    """

    def __init__(self, config: dict, control) -> None:
        self.control = control
        self.root = config["root"]  # the workspace as commands see it
        self.shell = config["shell"]
        self.env = config["env"]
        self.limits = config["limits"]
        self.harden = bool(config["harden"])
        self.null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.master = None  # {"pid", "pidfd", "slots", "acks", "jobs"}
        self.pgids: set = set()
        self.next_sid = 0
        self.poller = select.poll()

    @classmethod
    def main(cls) -> None:
        control = socket.socket(fileno=0)
        config = json.loads(control.recv(1 << 20).decode("utf-8"))
        cls(config, control).serve()

    def serve(self) -> None:
        if self.harden:
            self.drop_privileges()
        os.chdir(self.root)
        self.poller.register(0, select.POLLIN)
        self.send({"ready": True, "pid": os.getpid()})
        self.offer_shell()
        while True:
            for fd, _event in self.poller.poll(1000):
                if fd == 0:
                    self.handle_message()
                elif self.master is not None and fd == self.master["pidfd"]:
                    self.drop_master()
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
        if not data:
            self.shutdown()
        message = json.loads(data.decode("utf-8"))
        if "started" in message or "dead" in message:
            self.offer_shell()
        elif "status" in message:
            running, code = self.job_status(message["pgid"])
            self.send({"status": True, "sid": message.get("sid"), "code": code, "running": running})
        elif "kill" in message or "clear" in message:
            if "kill" in message:
                self.kill_group(message["pgid"])
            self.kill_holders(message["pgid"], message["inodes"])
            self.send({"cleared": True, "sid": message.get("sid")})

    def shutdown(self) -> None:
        for pgid in self.pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                continue
        os._exit(0)

    # ---- the master bash and its spares ----
    def master_script(self) -> str:
        def capped(which: int, value: int) -> int:
            hard = resource.getrlimit(which)[1]
            return value if hard == resource.RLIM_INFINITY else min(value, hard)

        limits = self.limits
        cpu = capped(resource.RLIMIT_CPU, limits["cpu_s"])
        cpu_hard = capped(resource.RLIMIT_CPU, limits["cpu_s"] + 1)
        memory_kb = capped(resource.RLIMIT_AS, limits["memory_mb"] << 20) >> 10
        processes = capped(resource.RLIMIT_NPROC, limits["max_processes"])
        file_kb = capped(resource.RLIMIT_FSIZE, limits["file_size_mb"] << 20) >> 10
        fd_dir = "/proc/" + str(os.getpid()) + "/fd/"
        spare = "; ".join([
            "unset __o __e __r __s __g",
            "read -r -n 1 -u 99 __harnessrl_go || exit 0",
            "unset __harnessrl_go",
            "exec 99<&-",
            "IFS= read -r -d '' -u 98 __harnessrl_cwd",
            "IFS= read -r -d '' -u 98 __harnessrl_cmd",
            "exec 98<&-",
            "printf 'r\\0' 2>/dev/null >&97",
            'cd -- "$__harnessrl_cwd" 2>/dev/null || cd -- ' + self.quote(self.root),
            "trap 'printf \"s%s\\0%s\\0\" \"$?\" \"$PWD\" 2>/dev/null >&97' EXIT",
            'eval "unset __harnessrl_cwd __harnessrl_cmd; $__harnessrl_cmd"',
        ])
        opened = " ".join(
            f'{fd}{mode}"{fd_dir}${name}"'
            for fd, mode, name in ((90, ">", "__o"), (91, ">", "__e"), (92, ">", "__r"),
                                   (93, "<", "__s"), (94, "<", "__g"))
        )
        return " ".join([  # one line too: bash counts lines from the start of the script
            f"ulimit -S -t {cpu} && ulimit -H -t {cpu_hard} && ulimit -v {memory_kb}"
            f" && ulimit -u {processes} && ulimit -f {file_kb} && ulimit -c 0"
            " || { echo 'harnessrl sandbox: cannot apply resource limits' >&2; exit 126; };",
            "set -m;",
            "while read -r -u 3 __o __e __r __s __g; do",
            # "? <pid>": the exit status of a spare that ended without reporting it (exec, kill).
            'if [ "$__o" = "?" ]; then wait "$__e"; echo "$?" >&4; continue; fi;',
            f"exec {opened} || {{ echo 0 >&4; continue; }};",
            "(" + spare + ") 1>&90 2>&91 97>&92 98<&93 99<&94 90>&- 91>&- 92>&- 93<&- 94<&-"
            " 3<&- 4>&- </dev/null &",
            "exec 90>&- 91>&- 92>&- 93<&- 94<&-;",
            'echo "$!" >&4;',
            "done",
        ])

    def start_master(self) -> dict:
        slots_r, slots_w = os.pipe()
        acks_r, acks_w = os.pipe()
        argv = [self.shell, "-c", self.master_script()]
        pairs = ((self.null, 0), (self.null, 1), (self.null, 2), (slots_r, 3), (acks_w, 4))
        try:
            pid = os.posix_spawn(
                self.shell, argv, self.env, setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                file_actions=[(os.POSIX_SPAWN_DUP2, src, dst) for src, dst in pairs],
            )
        except (AttributeError, NotImplementedError, TypeError):
            pid = os.fork()  # no posix_spawn with setsid (old libc): the slow, equivalent path
            if pid == 0:
                try:
                    os.setsid()
                    for src, dst in pairs:
                        os.dup2(src, dst)
                    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
                        signal.signal(signum, signal.SIG_DFL)
                    os.execve(self.shell, argv, self.env)
                finally:
                    os._exit(127)
        os.close(slots_r)
        os.close(acks_w)
        pidfd = -1
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(pid)
                self.poller.register(pidfd, select.POLLIN)
            except OSError:
                pidfd = -1
        self.track_group(pid)
        return {"pid": pid, "pidfd": pidfd, "slots": slots_w, "acks": acks_r, "jobs": {}}

    def drop_master(self) -> None:
        master, self.master = self.master, None
        if master is None:
            return
        if master["pidfd"] >= 0:
            self.poller.unregister(master["pidfd"])
            os.close(master["pidfd"])
        os.close(master["slots"])
        os.close(master["acks"])
        try:
            os.kill(master["pid"], signal.SIGKILL)
        except OSError:
            return

    def ask_master(self, line: str, timeout_s: float):
        """Send one line to the master shell; its one-line answer as an int, or None."""
        master = self.master
        if master is None:
            return None
        try:
            os.write(master["slots"], (line + "\n").encode())
            answer = b""
            while not answer.endswith(b"\n"):
                ready = select.select([master["acks"]], [], [], timeout_s)[0]
                chunk = os.read(master["acks"], 64) if ready else b""
                if not chunk:
                    raise OSError("the master shell did not answer")
                answer += chunk
            return int(answer)
        except (OSError, ValueError):
            self.drop_master()
            return None

    def fork_spare(self, fds: list):
        """Have the master fork a spare on these fds (ours); its pid, or None if it failed."""
        if self.master is None:
            self.master = self.start_master()
        master = self.master
        pid = self.ask_master(" ".join(str(fd) for fd in fds), 10.0)
        if pid is None or pid <= 0:
            return None
        master["jobs"][pid] = None  # an ordered set: bash remembers only recent statuses
        if len(master["jobs"]) > 256:
            del master["jobs"][next(iter(master["jobs"]))]
        return pid

    def job_status(self, pid: int):
        """(still running, exit status) of a spare; the status comes from the master that
        forked it, None if unknown."""
        try:
            with open("/proc/" + str(int(pid)) + "/stat") as stat_file:
                state = stat_file.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "gone"
        if state not in ("Z", "X", "gone"):
            return True, None  # exec'ed into something that closed the report pipe
        if self.master is None or pid not in self.master["jobs"]:
            return False, None
        del self.master["jobs"][pid]
        return False, self.ask_master("? " + str(int(pid)), 10.0)

    def offer_shell(self) -> None:
        """Prepare the next command's shell and hand its pipe ends to the host."""
        for _attempt in range(3):
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            report_r, report_w = os.pipe()
            go_r, go_w = os.pipe()
            script_fd = os.memfd_create("harnessrl-command", os.MFD_CLOEXEC)
            pid = self.fork_spare([out_w, err_w, report_w, script_fd, go_r])
            for fd in (out_w, err_w, report_w, go_r):
                os.close(fd)
            host_ends = [go_w, script_fd, out_r, err_r, report_r]
            if pid is not None:
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
        """Collect exited children and orphans (we are pid 1); notice a dead master."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.master is not None and pid == self.master["pid"]:
                self.drop_master()

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
        # Drop our own capabilities too (capset v3, all zero): the master shell must be able to
        # open /proc/<server>/fd, which the kernel refuses to a process with fewer capabilities.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        libc.capset(header, data)


if __name__ == "__main__":
    CommandServer.main()
