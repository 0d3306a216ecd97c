"""Rollouts through a vLLM server against in-process HFPolicy, and the time of one weight sync.

The episodes of ``bench_rollout.py`` (its configurations x workspace test tasks, greedy) run
through ``RolloutEngine`` twice: with ``HFPolicy`` in this process, and with ``OpenAIPolicy``
against a vLLM server already running at ``--url`` (start it as ``docs/policy_server.md``
says). Then ``ServedTrainingPolicy.sync_weights`` is timed with the embedded model (write,
reload, prefix-cache reset and the probe check). Prints tokens/s of both and the sync time.
"""

from __future__ import annotations

import argparse
import os
import time

from bench_rollout import CONFIGS

from harnessrl.harness import Harness, HarnessLimits
from harnessrl.policy.base import SamplingParams
from harnessrl.policy.hf import HFPolicy
from harnessrl.policy.openai import OpenAIPolicy
from harnessrl.policy.served import ServedTrainingPolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.suite import load_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the vLLM server, http://host:port/v1")
    parser.add_argument("--model", default="embedded", help="its served model name")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per configuration")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn")
    parser.add_argument("--max-turns", type=int, default=2, help="turns per episode")
    parser.add_argument("--concurrent", type=int, default=16, help="episodes in flight")
    parser.add_argument("--syncs", type=int, default=3, help="weight syncs to time")
    args = parser.parse_args()

    load_start = os.getloadavg()
    limits = HarnessLimits(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    tasks = list(load_suite("workspace").tasks("test", limit=args.tasks, seed=0))
    jobs = [RolloutJob(t, Harness.named(code, limits)) for code in CONFIGS for t in tasks]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    hf = HFPolicy(None, device="cpu", dtype="float32")
    server = OpenAIPolicy(args.model, args.url, context_length="server")
    results = {}
    for name, policy in (("vLLM server", server), ("HFPolicy", hf)):
        trajectories, stats = RolloutEngine(policy, max_concurrent=args.concurrent, env_workers=4,
                                            sampling=greedy).run(jobs)
        results[name] = trajectories
        print(f"{name:12s}: {stats.wall_time_s:6.1f} s  {stats.tokens_generated / stats.wall_time_s:6.1f} tokens/s "
              f"({stats.tokens_generated} tokens, {len(jobs)} episodes, torch threads here: "
              f"{__import__('torch').get_num_threads()})")
    same = sum([t.completion_ids for t in a.turns] == [t.completion_ids for t in b.turns]
               for a, b in zip(results["vLLM server"], results["HFPolicy"], strict=True))
    print(f"episodes with identical tokens: {same}/{len(jobs)}")

    served = ServedTrainingPolicy(args.url, args.model)
    times = []
    for _ in range(args.syncs):
        start = time.perf_counter()
        served.sync_weights(hf.model)
        times.append(time.perf_counter() - start)
    print(f"weight sync (write + reload + reset + probe), {len(times)} runs: "
          + ", ".join(f"{t:.2f} s" for t in times))
    load_end = os.getloadavg()
    print(f"load average (1 min): start {load_start[0]:.1f}, end {load_end[0]:.1f}")


if __name__ == "__main__":
    main()
