"""Benchmark: per-command latency of `Sandbox.exec` against plain `subprocess.run(shell=True)`.

Runs a fixed list of representative agent commands N times each, through the sandbox (default
backend: auto) and through ``subprocess.run(cmd, shell=True, cwd=<workspace>,
capture_output=True)`` with the sandbox's environment (same PATH, so both run the same
binaries). Samples are interleaved (sandbox, plain, plain, sandbox, ...) so that load from
elsewhere on the machine hits both alike. Prints a table of medians and, as the last line,
``ratio: X`` = median sandboxed latency / median plain latency over all samples.

    python benchmarks/bench_sandbox.py [--repeats 40] [--backend auto]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time

from harnessrl.sandbox import SandboxLimits, Workspace, open_sandbox, sandbox_env

COMMANDS = (
    "true",
    "echo hi",
    "ls",
    "cat src/file_0.py",
    "python3 -c 'print(1)'",
    "grep -r x .",
)


def lay_out(workspace: Workspace) -> None:
    """A small project: 40 source files in two directories."""
    for index in range(40):
        directory = workspace.root / ("src" if index % 2 == 0 else "tests")
        directory.mkdir(exist_ok=True)
        (directory / f"file_{index}.py").write_text(f"x_{index} = {index}\n" * 20)


def timed(run: object) -> float:
    started = time.perf_counter()
    run()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40, help="samples per command and runner")
    parser.add_argument("--backend", default="auto", help="sandbox backend (auto, bwrap, unshare)")
    args = parser.parse_args()

    with Workspace(prefix="bench-") as workspace:
        lay_out(workspace)
        plain_env = sandbox_env(str(workspace.root))
        with open_sandbox(workspace, backend=args.backend, limits=SandboxLimits()) as box:

            def sandboxed(command: str) -> None:
                result = box.exec(command)
                if not result.ok:
                    raise SystemExit(f"sandboxed {command!r} failed: {result}")

            def plain(command: str) -> None:
                subprocess.run(command, shell=True, cwd=workspace.root, capture_output=True,
                               env=plain_env, check=True)

            for command in COMMANDS:  # warm-up: page cache, first-run costs
                for _ in range(3):
                    sandboxed(command)
                    plain(command)
            samples: dict[str, dict[str, list[float]]] = {c: {"sandbox": [], "plain": []} for c in COMMANDS}
            for repeat in range(args.repeats):
                for command in COMMANDS:
                    order = (("sandbox", sandboxed), ("plain", plain))
                    if repeat % 2:
                        order = order[::-1]
                    for name, runner in order:
                        samples[command][name].append(timed(lambda r=runner, c=command: r(c)))
            backend = box.backend

    print(f"sandbox backend: {backend}; {args.repeats} samples per command and runner")
    print(f"machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()},"
          f" {platform.system()} {platform.release()}")
    print(f"{'command':<26} {'sandbox ms':>11} {'plain ms':>9} {'ratio':>6}")
    ratios = []
    for command in COMMANDS:
        box_ms = statistics.median(samples[command]["sandbox"]) * 1e3
        plain_ms = statistics.median(samples[command]["plain"]) * 1e3
        ratios.append(box_ms / plain_ms)
        print(f"{command:<26} {box_ms:>11.2f} {plain_ms:>9.2f} {box_ms / plain_ms:>6.2f}")
    every_box = [t for command in COMMANDS for t in samples[command]["sandbox"]]
    every_plain = [t for command in COMMANDS for t in samples[command]["plain"]]
    geometric = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"per-command ratios: geometric mean {geometric:.2f}, worst {max(ratios):.2f}")
    print(f"ratio: {statistics.median(every_box) / statistics.median(every_plain):.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
