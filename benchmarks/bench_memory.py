"""Benchmark: the resident memory of a command's whole process tree while it runs, its peak and final.

Starts the command, then every ``--interval`` seconds sums the RSS of the command's process and
all its descendants (``harnessrl experiment --jobs 2`` workers, sandboxes, servers): through
psutil when it is installed, else by walking ``/proc``. Pages shared between processes count
once per process, so the sum is an upper bound on what the tree takes from the machine. Prints
one line per ``--every`` seconds while it runs, then the peak (with the time it happened and the
process count then), the final sample before the command exited, the command's exit status and
wall time; ``--json FILE`` writes the samples too. The benchmark's exit status is the command's.
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


def tree_rss(pid: int) -> tuple[int, int]:
    """Returns (RSS in bytes summed over ``pid`` and its descendants, how many processes)."""
    if psutil is not None:
        try:
            root = psutil.Process(pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0, 0
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total, len(processes)
    children = _proc_children()
    tree, stack = [], [pid]
    while stack:
        current = stack.pop()
        tree.append(current)
        stack.extend(children.get(current, []))
    return sum(_proc_rss_bytes(p) for p in tree), len(tree)


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
    samples: list[tuple[float, int, int]] = []  # (seconds since start, bytes, processes)
    shown = started
    top = (0.0, 0, 0)
    while True:
        rss, count = tree_rss(process.pid)
        now = time.monotonic()
        if process.poll() is not None:
            break
        samples.append((round(now - started, 2), rss, count))
        top = max(top, samples[-1], key=lambda s: s[1])
        if len(received) > forwarded:  # the first signal goes on as SIGTERM, a later one as SIGKILL
            process.send_signal(signal.SIGTERM if forwarded == 0 else signal.SIGKILL)
            forwarded = len(received)
        if args.every and now - shown >= args.every:
            shown = now
            print(f"[bench_memory] {now - started:7.1f}s  {gib(rss)} over {count} processes "
                  f"(peak so far {gib(top[1])} at {top[0]:.0f}s)", file=sys.stderr)
        time.sleep(args.interval)
    wall = time.monotonic() - started
    if not samples:
        samples.append((round(wall, 2), 0, 0))
    peak = max(samples, key=lambda s: s[1])
    final = samples[-1]
    result = {
        "command": command, "exit_status": process.returncode, "wall_s": round(wall, 1),
        "interval_s": args.interval, "samples": len(samples), "sampler": "psutil" if psutil else "/proc",
        "peak_rss_bytes": peak[1], "peak_at_s": peak[0], "peak_processes": peak[2],
        "final_rss_bytes": final[1], "final_at_s": final[0],
    }
    print(f"peak RSS:  {gib(peak[1])} at {peak[0]:.1f}s over {peak[2]} processes")
    print(f"final RSS: {gib(final[1])} at {final[0]:.1f}s (last sample before exit)")
    print(f"command exited {process.returncode} after {wall:.1f}s; {len(samples)} samples every {args.interval}s "
          f"({result['sampler']})")
    if args.json:
        result["samples_s_bytes_processes"] = samples
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return int(process.returncode)


if __name__ == "__main__":
    sys.exit(main())
