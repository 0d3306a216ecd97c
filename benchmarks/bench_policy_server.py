"""Rollouts through a vLLM server against in-process HFPolicy, and the time of one weight sync.

The episodes of ``bench_rollout.py`` (its configurations x workspace test tasks, greedy) run
through ``RolloutEngine`` twice: with ``OpenAIPolicy`` against a vLLM server already running at
``--url`` (start it as ``docs/policy_server.md`` says), then with ``HFPolicy`` in this process
at ``--threads`` torch threads. Then ``ServedTrainingPolicy.sync_weights`` is timed with the
embedded model (write, reload with the tied-head refresh, prefix-cache reset and the probe).

Prints, per side, wall time, tokens/s and CPU seconds per generated token: this process's CPU
time (``time.process_time``: the harness work, and for HFPolicy the model too) and, with
``--server-pid``, the CPU time of the server's process tree (``/proc/<pid>/stat`` of the server
and every descendant: the API process, the engine core, its workers). CPU time per token
depends much less than wall time on other jobs sharing the machine. vLLM's CPU worker binds its
own OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``; its log names the core ids): give
``--threads`` the same count for a comparison at equal threads.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from bench_rollout import CONFIGS

from harnessrl.harness import Harness, HarnessLimits
from harnessrl.policy.base import SamplingParams
from harnessrl.policy.hf import HFPolicy
from harnessrl.policy.openai import OpenAIPolicy
from harnessrl.policy.served import ServedTrainingPolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.suite import load_suite


def process_tree_cpu_s(root_pid: int) -> float:
    """Returns the user + system CPU seconds of ``root_pid`` and all its live descendants."""
    parents, cpu_ticks = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while listed
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        parents[int(entry.name)] = int(fields[1])
        cpu_ticks[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime, stime
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    if root_pid not in cpu_ticks:
        raise SystemExit(f"no process {root_pid} (--server-pid)")
    return sum(cpu_ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the vLLM server, http://host:port/v1")
    parser.add_argument("--model", default="embedded", help="its served model name")
    parser.add_argument("--server-pid", type=int, help="the server's process id: report its CPU time")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of HFPolicy")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per configuration")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn")
    parser.add_argument("--max-turns", type=int, default=2, help="turns per episode")
    parser.add_argument("--concurrent", type=int, default=16, help="episodes in flight")
    parser.add_argument("--syncs", type=int, default=3, help="weight syncs to time")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    limits = HarnessLimits(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    tasks = list(load_suite("workspace").tasks("test", limit=args.tasks, seed=0))
    jobs = [RolloutJob(t, Harness.named(code, limits)) for code in CONFIGS for t in tasks]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    hf = HFPolicy(None, device="cpu", dtype="float32")
    server = OpenAIPolicy(args.model, args.url, context_length="server")
    results, rates = {}, {}
    for name, policy in (("vLLM server", server), ("HFPolicy", hf)):
        server_cpu = process_tree_cpu_s(args.server_pid) if args.server_pid else None
        own_cpu = time.process_time()
        trajectories, stats = RolloutEngine(policy, max_concurrent=args.concurrent, env_workers=4,
                                            sampling=greedy).run(jobs)
        own_cpu = time.process_time() - own_cpu
        results[name] = trajectories
        tokens = stats.tokens_generated
        rates[name] = tokens / stats.wall_time_s
        line = (f"{name:12s}: {stats.wall_time_s:6.1f} s  {rates[name]:6.1f} tokens/s ({tokens} tokens, "
                f"{len(jobs)} episodes); CPU here {own_cpu:6.1f} s = {1e3 * own_cpu / tokens:.1f} ms/token")
        if server_cpu is not None and policy is server:
            server_cpu = process_tree_cpu_s(args.server_pid) - server_cpu
            line += f"; server CPU {server_cpu:6.1f} s = {1e3 * server_cpu / tokens:.1f} ms/token"
        print(line)
    print(f"tokens/s ratio vLLM server / HFPolicy: {rates['vLLM server'] / rates['HFPolicy']:.2f}; "
          f"HFPolicy torch threads: {torch.get_num_threads()}")
    same = sum([t.completion_ids for t in a.turns] == [t.completion_ids for t in b.turns]
               for a, b in zip(results["vLLM server"], results["HFPolicy"], strict=True))
    print(f"episodes with identical tokens: {same}/{len(jobs)}")

    served = ServedTrainingPolicy(args.url, args.model)
    times, gaps = [], []
    for _ in range(args.syncs):
        start = time.perf_counter()
        served.sync_weights(hf.model)
        times.append(time.perf_counter() - start)
        gaps.append(served.check_weights(hf.model))
    print(f"weight sync (write + reload + reset + probe), {len(times)} runs: "
          + ", ".join(f"{t:.2f} s" for t in times)
          + f"; probe gap at most {max(gaps):.1e}; tied heads refreshed: {served.refreshed_heads}")
    load_end = os.getloadavg()
    print(f"load average (1 min): start {load_start[0]:.1f}, end {load_end[0]:.1f}")


if __name__ == "__main__":
    main()
