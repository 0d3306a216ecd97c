"""The harness's own cost per turn (render, context policy, parse, observation) against the
embedded model's generation time per turn, measured in one run.

Harness cost: oracle episodes under every configuration of the orthogonal design and the
out-of-space harnesses, tokenized with the embedded model's tokenizer; the episode records
the time spent in the harness separately from the sandbox. Generation: HFPolicy sampling
one turn (64 new tokens) from a first prompt of the same episodes, batch size 1.

Last line: ``ratio: X`` = harness time per turn / generation time per turn (smaller is better).
"""

from __future__ import annotations

import argparse
import statistics
import time

from harnessrl.design import orthogonal
from harnessrl.harness import Harness, HarnessLimits, out_of_space_names
from harnessrl.harness.registry import default_space
from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.hf import HFPolicy
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rollout.episode import run_episode
from harnessrl.tasks.suite import load_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4, help="tasks per harness")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per turn")
    args = parser.parse_args()

    policy = HFPolicy()
    tokenizer = policy.tokenizer
    tasks = list(load_suite("workspace").tasks("test", limit=args.tasks * 8, seed=0))[: args.tasks]
    names = orthogonal(default_space()).codes + out_of_space_names()
    limits = HarnessLimits(max_new_tokens=4096, context_tokens=32768, max_turns=30)

    per_turn: dict[str, float] = {}
    first_prompts = []
    for name in names:
        harness_s, turns = 0.0, 0
        for task in tasks:
            trajectory = run_episode(Harness.named(name, limits), task, OraclePolicy(tokenizer))
            harness_s += trajectory.metrics["harness_time_s"]
            turns += trajectory.metrics["turns"]
            if trajectory.turns:
                first_prompts.append(trajectory.turns[0].prompt_ids)
        per_turn[name] = harness_s / max(1, turns)
    harness_per_turn = statistics.mean(per_turn.values())

    gen_times = []
    for prompt in first_prompts[:: max(1, len(first_prompts) // 6)][:6]:
        request = GenerationRequest(list(prompt), SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0))
        t0 = time.perf_counter()
        policy.generate([request])
        gen_times.append(time.perf_counter() - t0)
    gen_per_turn = statistics.median(gen_times)

    print(f"{'harness':<18} harness ms/turn")
    for name, seconds in per_turn.items():
        print(f"{name:<18} {1000 * seconds:8.2f}")
    print(f"mean harness cost per turn: {1000 * harness_per_turn:.2f} ms (render + context + parse + format)")
    print(f"generation per turn (embedded model, {args.new_tokens} tokens, batch 1): {1000 * gen_per_turn:.0f} ms")
    print(f"ratio: {harness_per_turn / gen_per_turn:.6f}")


if __name__ == "__main__":
    main()
