"""Benchmark: what request bodies cost `harnessrl serve` in memory, with the in-flight bound
and without it, in one run.

Two `harnessrl serve` processes over the same policy (``--policy``, default the embedded
SmolLM2 with its 8,192-token context, so the body limit is the one that context gives) on Unix
sockets: **bounded** (the default ``--max-inflight-bytes``, 4 largest bodies) and the
baseline **unbounded** (``--max-inflight-bytes`` 1,000 largest bodies, i.e. no bound: what
the server was before). Each first learns its body limit (the 413 of an over-large
declaration names it), warms up, and then receives, in turn:

* **one** body just under the limit (a chat request whose one user message fills it: the
  prompt is then over the context and refused with a 400, after the work that costs memory);
* **burst**: ``--concurrent`` such bodies sent at once, each on its own connection.

For each it prints the growth of the server's peak resident memory (``VmHWM``) and that growth
divided by the bytes of one body and of all bodies the server admitted, and the statuses it
answered. The last line is ``ratio: X`` = the bounded server's burst growth / the unbounded
server's (below 1: the bound saves memory). ``VmHWM`` only rises, so each measurement is the
peak of everything before it; one and burst are reported as increments.

    python benchmarks/bench_serve_memory.py [--policy embedded|random] [--concurrent 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
GUARD_S = 600


def start(policy: str, socket_path: Path, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "serve", "--policy", policy, "--uds", str(socket_path), *flags],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + GUARD_S
    while not socket_path.exists():
        if process.poll() is not None:
            raise SystemExit(f"serve exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit("serve did not start")
        time.sleep(0.1)
    return process


def hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def post(socket_path: Path, body: bytes, declared: int | None = None) -> tuple[int, bytes]:
    """Sends one chat request; returns (status, body) (0 when the server closed first)."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if declared is None else declared}\r\nConnection: close\r\n\r\n").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(GUARD_S)
        sock.connect(str(socket_path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + (b"" if declared is not None else body))
        data = b""
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    if not data:
        return 0, b""
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def body_of(size: int) -> bytes:
    """A chat request of ``size`` bytes: one user message of words."""
    shell = json.dumps({"messages": [{"role": "user", "content": ""}], "max_tokens": 4}).encode()
    words = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[: size - len(shell)]
    return json.dumps({"messages": [{"role": "user", "content": words}], "max_tokens": 4}).encode()


def measure(name: str, policy: str, folder: Path, concurrent: int, *flags: str) -> dict[str, float]:
    socket_path = folder / f"{name}.sock"
    process = start(policy, socket_path, *flags)
    try:
        status, reply = post(socket_path, b"", declared=1 << 40)
        limit = int(re.search(rb"limit of (\d+) bytes", reply).group(1))  # type: ignore[union-attr]
        assert status == 413, status
        for _ in range(3):
            post(socket_path, body_of(4096))  # warm: the first requests allocate the caches
        body = body_of(limit - 64)
        base = hwm_kib(process.pid)
        one_status, _ = post(socket_path, body)
        after_one = hwm_kib(process.pid)
        statuses: list[int] = [0] * concurrent

        def send(index: int) -> None:
            statuses[index] = post(socket_path, body)[0]

        threads = [threading.Thread(target=send, args=(i,)) for i in range(concurrent)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after_burst = hwm_kib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=GUARD_S)
    admitted = sum(1 for s in statuses if s != 503)
    one_mb, burst_mb = (after_one - base) / 1024, (after_burst - after_one) / 1024
    body_mb = len(body) / (1 << 20)
    print(f"{name:9s} limit {limit / (1 << 20):.2f} MiB  one: +{one_mb:.1f} MB ({one_mb / body_mb:.1f}x its body,"
          f" status {one_status})  burst of {concurrent}: +{burst_mb:.1f} MB ({admitted} admitted:"
          f" {burst_mb / max(1e-9, body_mb * max(1, admitted)):.1f}x their bodies; statuses {sorted(statuses)})",
          flush=True)
    return {"one_mb": one_mb, "burst_mb": burst_mb, "limit": limit, "admitted": admitted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="embedded", help="the policy both servers serve (default: embedded)")
    parser.add_argument("--concurrent", type=int, default=8, help="bodies sent at once in the burst")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; policy {args.policy}")
    with tempfile.TemporaryDirectory(prefix="bench-serve-memory-") as folder:
        bounded = measure("bounded", args.policy, Path(folder), args.concurrent)
        unbounded_bytes = str(1000 * bounded["limit"])
        unbounded = measure("unbounded", args.policy, Path(folder), args.concurrent,
                            "--max-inflight-bytes", unbounded_bytes)
    print(f"ratio: {bounded['burst_mb'] / max(1e-9, unbounded['burst_mb']):.2f}")


if __name__ == "__main__":
    main()
