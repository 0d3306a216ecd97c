"""Rollout throughput: the engine against the loop a user would write, on the embedded model.

Baseline: episodes one after another, each turn one call to transformers' ``generate``
(``BaselineGeneratePolicy``). Engine: ``RolloutEngine`` with ``HFPolicy``, every waiting
episode in one batch, sandbox steps in a thread pool. Same episodes (tasks x harness
configurations), same token limits, greedy decoding on both sides, measured in one run.

The baseline never sees ``HFPolicy``'s prefix KV cache (it calls ``model.generate``); the
engine's cache starts empty. Last line: ``ratio: X`` = engine generated tokens/s over baseline
generated tokens/s.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch

from harnessrl.harness import Harness, HarnessLimits
from harnessrl.policy.base import Generation, GenerationRequest, Policy
from harnessrl.policy.hf import HFPolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.rollout.episode import run_episode
from harnessrl.tasks.suite import load_suite

CONFIGS = ["S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T1-O2-C0-W2"]


class BaselineGeneratePolicy(Policy):
    """One ``model.generate`` call per request, no batching (what a first script does)."""

    name = "baseline-generate"

    def __init__(self, hf: HFPolicy) -> None:
        self.model, self.tokenizer = hf.model, hf.tokenizer

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            ids = torch.tensor([request.prompt_ids])
            with torch.no_grad():
                result = self.model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=request.params.max_new_tokens,
                    do_sample=False, eos_token_id=list(request.params.stop_token_ids),
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            new = result[0, ids.shape[1]:].tolist()
            reason = "stop" if new and new[-1] in request.params.stop_token_ids else "length"
            out.append(Generation(new, [0.0] * len(new), reason))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4, help="tasks per configuration")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn")
    parser.add_argument("--max-turns", type=int, default=2, help="turns per episode")
    parser.add_argument("--concurrent", type=int, default=16, help="engine episodes in flight")
    args = parser.parse_args()

    load_start = os.getloadavg()
    hf = HFPolicy()
    limits = HarnessLimits(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    tasks = list(load_suite("workspace").tasks("test", limit=args.tasks, seed=0))
    pairs = [(Harness.named(code, limits), task) for code in CONFIGS for task in tasks]
    from harnessrl.policy.base import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)

    baseline = BaselineGeneratePolicy(hf)
    t0 = time.perf_counter()
    base_trajs = [run_episode(h, t, baseline, sampling=greedy) for h, t in pairs]
    base_s = time.perf_counter() - t0
    base_tokens = sum(t.n_policy_tokens for t in base_trajs)

    engine = RolloutEngine(hf, max_concurrent=args.concurrent, env_workers=4, sampling=greedy)
    trajs, stats = engine.run([RolloutJob(t, h) for h, t in pairs])
    engine_tokens = sum(t.n_policy_tokens for t in trajs)

    base_tps, engine_tps = base_tokens / base_s, engine_tokens / stats.wall_time_s
    print(f"episodes: {len(pairs)} ({len(CONFIGS)} configurations x {len(tasks)} tasks), "
          f"max {args.max_turns} turns x {args.max_new_tokens} tokens, greedy")
    print(f"baseline (sequential generate): {base_s:7.1f} s  {len(pairs) / base_s:.3f} episodes/s  "
          f"{base_tps:.1f} tokens/s  ({base_tokens} tokens)")
    print(f"engine (batched, overlapped):   {stats.wall_time_s:7.1f} s  {stats.episodes_per_s:.3f} episodes/s  "
          f"{engine_tps:.1f} tokens/s  ({engine_tokens} tokens, mean batch {stats.mean_batch_size:.1f})")
    print(f"engine time split: generation {stats.generation_time_s:.1f} s, harness {stats.harness_time_s:.1f} s, "
          f"sandbox {stats.sandbox_time_s:.1f} s (summed over episodes; they overlap generation)")
    same = sum(
        [turn.completion_ids for turn in a.turns] == [turn.completion_ids for turn in b.turns]
        for a, b in zip(base_trajs, trajs, strict=True)
    )
    print(f"episodes whose tokens match the baseline's exactly: {same}/{len(pairs)}")
    cache = hf.cache_stats
    print(f"engine prefix cache: {cache.token_hit_rate:.1%} of {cache.prompt_tokens} prompt tokens reused, "
          f"{cache.request_hit_rate:.1%} of {cache.requests} requests hit, {cache.prefilled_tokens} tokens prefilled")
    load_end = os.getloadavg()
    print(f"load average (1/5/15 min): start {load_start[0]:.1f}/{load_start[1]:.1f}/{load_start[2]:.1f}, "
          f"end {load_end[0]:.1f}/{load_end[1]:.1f}/{load_end[2]:.1f}")
    print(f"ratio: {engine_tps / base_tps:.2f}")


if __name__ == "__main__":
    main()
