"""One rollout path of ``HFPolicy`` against the default one, on rollouts in the trainer's shape.

The trainer's rollouts are GRPO groups: ``--group-size`` episodes of one task under one harness
configuration, sampled with different seeds, so every row of a group carries the same prompt
and, in later turns, that prompt followed by its own completions and observations. Baseline:
``HFPolicy`` as the trainer runs it by default: each ``generate`` call one batch of every episode
waiting for the model, each row attending over its own copy of its keys and values (length
tiers, ``policy/kv_slab.py``), the engine in lockstep (``deterministic``). ``--variant``:

* ``cascade``: ``cascade_attention=True``, a group's shared prefix read once per decode step
  (``policy/cascade.py``);
* ``continuous``: ``continuous_batching``, one decode batch that each episode's next request
  joins at the next decode step (``policy/continuous.py``), still deterministic;
* ``kernel``: the default path, whose decode attention runs the C++ kernel
  (``policy/decode_kernel.py``), against a baseline of the same path with SDPA's decode attention
  (the default before the kernel);
* ``prefill-kernel``: the default path, whose prefill attention runs the C++ kernel
  (``policy/prefill_attention.cpp``), against a baseline of the same path with SDPA's prefill
  attention (the default before it; decode attention through its kernel on both sides).

``--free`` runs both sides without lockstep (timing decides the batches). The same policy object
(same weights, packed layers) runs both, the prefix cache cleared before each run, the runs
interleaved (baseline, variant, baseline, variant, ...).

Prints per run: CPU seconds of this process per generated token (torch computes in this
process), generated tokens per wall second, the tokens; then the medians, how many episodes
have the same tokens on both sides (sampling: a rounding difference can move a draw, and with
it the rest of an episode), the ratio of CPU seconds per token and of wall tokens/s (baseline
over variant, variant over baseline: above 1 means the variant is faster), and ``ratio: X``,
the variant's headline (CPU for cascade and the kernels, wall for continuous batching).

    python benchmarks/bench_trainer_rollouts.py [--variant continuous|kernel|prefill-kernel] [--dtype bfloat16] [--groups 4]
        [--group-size 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from harnessrl.harness import Harness, HarnessLimits
from harnessrl.policy.base import SamplingParams
from harnessrl.policy.hf import HFPolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.suite import load_suite

CONFIGS = ["S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T1-O2-C0-W2"]


def run(policy: HFPolicy, jobs: list[RolloutJob], sampling: SamplingParams, variant: str | None,
        deterministic: bool, kernels: tuple[object, object]) -> tuple[dict, list]:
    """One run of every job on the default path (``variant`` None), the variant's, or the default
    path with SDPA's decode or prefill attention (``"sdpa-decode"``, ``"sdpa-prefill"``; ``kernels``:
    the policy's decode and prefill kernels); returns its figures and tokens."""
    policy.cascade_attention = variant == "cascade"
    policy._decode_kernel = None if variant == "sdpa-decode" else kernels[0]
    policy._prefill_kernel = None if variant == "sdpa-prefill" else kernels[1]
    policy.clear_prefix_cache()
    engine = RolloutEngine(policy, max_concurrent=len(jobs), env_workers=4, sampling=sampling,
                           deterministic=deterministic, continuous_batching=variant == "continuous")
    cpu, wall = time.process_time(), time.perf_counter()
    trajectories, _ = engine.run(jobs)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tokens = sum(t.n_policy_tokens for t in trajectories)
    figures = {"cpu_s_per_token": cpu / tokens, "tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall}
    return figures, [[turn.completion_ids for turn in t.turns] for t in trajectories]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4, help="tasks, one configuration each")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per task (GRPO group)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--dtype", default="bfloat16", help="the trainer's rollout copy is bfloat16 on CPUs with native bfloat16")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side, interleaved")
    parser.add_argument("--split", default="train")
    parser.add_argument("--variant", choices=["cascade", "continuous", "kernel", "prefill-kernel"], default="cascade")
    parser.add_argument("--free", action="store_true", help="both sides without lockstep")
    args = parser.parse_args()

    load_start = os.getloadavg()
    policy = HFPolicy(dtype=args.dtype, cascade_attention=True)
    if args.variant == "cascade" and not policy.cascade_attention:
        raise SystemExit("cascade attention cannot run here (it needs SDPA and the prefix cache)")
    if args.variant == "continuous" and not policy.supports_continuous:
        raise SystemExit("continuous batching cannot run on this model (a layer without full attention)")
    kernels = (policy._decode_kernel, policy._prefill_kernel)
    if args.variant in ("kernel", "prefill-kernel") and None in kernels:
        raise SystemExit("the attention kernels cannot run here (see the warning above)")
    limits = HarnessLimits(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    tasks = list(load_suite("workspace").tasks(args.split, limit=args.groups, seed=0))
    jobs = [RolloutJob(task, Harness.named(CONFIGS[i % len(CONFIGS)], limits), seed=1000 * i + j)
            for i, task in enumerate(tasks) for j in range(args.group_size)]
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    print(f"{len(jobs)} episodes: {len(tasks)} tasks x {args.group_size} rollouts, {args.max_turns} turns x "
          f"{args.max_new_tokens} tokens, temperature {args.temperature}, {args.dtype}, {torch.get_num_threads()} threads, "
          f"variant {args.variant}, {'free' if args.free else 'lockstep'}")
    deterministic = not args.free
    # warm-up: packing, first calls
    baselines = {"kernel": "sdpa-decode", "prefill-kernel": "sdpa-prefill"}
    run(policy, jobs[: args.group_size], sampling, None if args.variant in baselines else args.variant, deterministic,
        kernels)
    sides = {"baseline": baselines[args.variant], args.variant: None} if args.variant in baselines else {
        "baseline": None, args.variant: args.variant}
    results: dict[str, list[dict]] = {name: [] for name in sides}
    tokens: dict[str, list] = {}
    for repeat in range(args.repeats):
        for name, variant in sides.items():
            figures, tokens[name] = run(policy, jobs, sampling, variant, deterministic, kernels)
            results[name].append(figures)
            print(f"run {repeat + 1} {name:>10}: {figures['cpu_s_per_token'] * 1e3:7.2f} CPU ms/token  "
                  f"{figures['tokens_per_s']:6.1f} tokens/s wall  {figures['tokens']} tokens  {figures['wall_s']:.1f} s")
    median = {side: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for side, runs in results.items()}
    base, other = median["baseline"], median[args.variant]
    same = sum(a == b for a, b in zip(tokens["baseline"], tokens[args.variant], strict=True))
    print(f"median baseline: {base['cpu_s_per_token'] * 1e3:.2f} CPU ms/token, {base['tokens_per_s']:.1f} tokens/s; "
          f"{args.variant}: {other['cpu_s_per_token'] * 1e3:.2f} CPU ms/token, {other['tokens_per_s']:.1f} tokens/s")
    print(f"episodes with the same tokens on both sides (last runs): {same}/{len(jobs)}")
    load_end = os.getloadavg()
    print(f"load average (1 min): start {load_start[0]:.1f}, end {load_end[0]:.1f}")
    cpu_ratio = base["cpu_s_per_token"] / other["cpu_s_per_token"]
    wall_ratio = other["tokens_per_s"] / base["tokens_per_s"]
    print(f"ratio of CPU s per token: {cpu_ratio:.2f}; ratio of wall tokens/s: {wall_ratio:.2f}")
    print(f"ratio: {wall_ratio if args.variant == 'continuous' else cpu_ratio:.2f}")


if __name__ == "__main__":
    main()
