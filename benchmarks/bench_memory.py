"""Benchmark: the resident memory of a command's whole process tree while it runs, its peak and final.

Starts the command, then every ``--interval`` seconds sums the memory of the command's process
and all its descendants (``harnessrl experiment --jobs 2`` workers, sandboxes, servers), found
through psutil when it is installed, else by walking ``/proc``, two ways:

* **PSS** (proportional set size, ``/proc/PID/smaps_rollup``): a page shared by n processes
  counts 1/n in each, so the sum is what the tree takes from the machine. The peak and final
  figures are PSS where the kernel has ``smaps_rollup`` (Linux 4.14+).
* **RSS**: a shared page counts once per process, so the sum is an upper bound; it jumps for
  the moment a large process forks (the child shares every page until it execs: a 6.6 GiB
  evaluation starting its sandboxes sampled once at 12.5 GiB). Reported beside PSS.

Prints one line per ``--every`` seconds while it runs, then the peak (with the time it happened
and the process count then), the final sample before the command exited, the command's exit
status and wall time; ``--json FILE`` writes the samples too. The benchmark's exit status is the
command's.
SIGTERM or Ctrl-C stops the command (a second one kills it) and still reports and writes what
was sampled; each progress line shows the peak so far.

    python benchmarks/bench_memory.py [--interval 0.5] [--json out.json] -- harnessrl train --preset quick
    python benchmarks/bench_memory.py -- harnessrl experiment configs/cpu_learn.yaml --out X --jobs 2

The issue's goals (issue 29): the quick preset's peak at most 6 GB, a two-seed experiment at
most 16 GB together (``docs/benchmarks.md`` records the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

try:
    import psutil
except ImportError:  # the /proc walk below does the same on Linux
    psutil = None

_PAGE = os.sysconf("SC_PAGE_SIZE")
_HAS_PSS = os.path.exists("/proc/self/smaps_rollup")


def _proc_children() -> dict[int, list[int]]:
    """Returns parent pid -> child pids of every process, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
        children.setdefault(parent, []).append(int(entry.name))
    return children


def _proc_rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0  # gone between listing and reading


def _proc_pss_bytes(pid: int) -> int | None:
    """Returns the process's proportional set size, or None where the kernel has no ``smaps_rollup``."""
    if not _HAS_PSS:
        return None
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0  # gone between listing and reading


def tree_pids(pid: int) -> list[int]:
    """Returns ``pid`` and its descendants (processes, not threads)."""
    if psutil is not None:
        try:
            root = psutil.Process(pid)
            return [root.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []
    children = _proc_children()
    tree, stack = [], [pid]
    while stack:
        current = stack.pop()
        tree.append(current)
        stack.extend(children.get(current, []))
    return tree


def tree_memory(pid: int) -> tuple[int, int | None, int]:
    """Returns (RSS summed over ``pid`` and its descendants, their PSS sum or None where the
    kernel cannot tell it, how many processes); bytes."""
    pids = tree_pids(pid)
    rss, pss = 0, 0
    for current in pids:
        rss += _proc_rss_bytes(current)
        share = _proc_pss_bytes(current)
        if share is None:
            pss = None
        elif pss is not None:
            pss += share
    return rss, pss, len(pids)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between progress lines (0: none)")
    parser.add_argument("--json", default=None, help="write the samples and the result to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (after --)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")

    started = time.monotonic()
    process = subprocess.Popen(command)
    # SIGTERM / SIGINT to the benchmark stop the command, and the samples so far are still reported
    # and written (a measurement cut short keeps its peak).
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: received.append(number))
    forwarded = 0
    # (seconds since start, bytes, processes, RSS bytes): bytes are PSS, or RSS where PSS is unknown
    samples: list[tuple[float, int, int, int]] = []
    shown = started
    top = (0.0, 0, 0, 0)
    measure = "PSS"
    while True:
        rss, pss, count = tree_memory(process.pid)
        now = time.monotonic()
        if process.poll() is not None:
            break
        if pss is None:
            measure = "RSS"
        samples.append((round(now - started, 2), rss if pss is None else pss, count, rss))
        top = max(top, samples[-1], key=lambda s: s[1])
        if len(received) > forwarded:  # the first signal goes on as SIGTERM, a later one as SIGKILL
            process.send_signal(signal.SIGTERM if forwarded == 0 else signal.SIGKILL)
            forwarded = len(received)
        if args.every and now - shown >= args.every:
            shown = now
            print(f"[bench_memory] {now - started:7.1f}s  {gib(samples[-1][1])} {measure} ({gib(rss)} RSS) over "
                  f"{count} processes (peak so far {gib(top[1])} at {top[0]:.0f}s)", file=sys.stderr)
        time.sleep(args.interval)
    wall = time.monotonic() - started
    if not samples:
        samples.append((round(wall, 2), 0, 0, 0))
    peak = max(samples, key=lambda s: s[1])
    peak_rss = max(samples, key=lambda s: s[3])
    final = samples[-1]
    result = {
        "command": command, "exit_status": process.returncode, "wall_s": round(wall, 1),
        "interval_s": args.interval, "samples": len(samples), "sampler": "psutil" if psutil else "/proc",
        "measure": measure, "peak_bytes": peak[1], "peak_at_s": peak[0], "peak_processes": peak[2],
        "final_bytes": final[1], "final_at_s": final[0],
        "peak_rss_bytes": peak_rss[3], "peak_rss_at_s": peak_rss[0], "final_rss_bytes": final[3],
    }
    print(f"peak {measure}:  {gib(peak[1])} at {peak[0]:.1f}s over {peak[2]} processes")
    print(f"final {measure}: {gib(final[1])} at {final[0]:.1f}s (last sample before exit)")
    if measure == "PSS":
        print(f"peak RSS:  {gib(peak_rss[3])} at {peak_rss[0]:.1f}s (shared pages once per process: an upper bound)")
    print(f"command exited {process.returncode} after {wall:.1f}s; {len(samples)} samples every {args.interval}s "
          f"({result['sampler']})")
    if args.json:
        result["samples_s_bytes_processes_rss"] = samples
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return int(process.returncode)


if __name__ == "__main__":
    sys.exit(main())
