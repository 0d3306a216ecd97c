"""Decode speed of HFPolicy with oneDNN-packed linear layers (and bfloat16) against the eager float32 HFPolicy, in one run.

All variants generate greedily for the same prompts (those of ``bench_generation.py``, repeated
to fill the batch), exactly ``--max-new-tokens`` tokens each (no stop ids), prefix cache off, one
batch. Throughput is generated tokens per second of this process's CPU time (far less sensitive
to other jobs on a shared machine than wall time; wall time is printed too). Variants run
interleaved, ``--repeats`` times each after one warm-up; the median counts. Float32 variants
must produce the baseline's tokens exactly (the script fails otherwise); for bfloat16 it prints
how many tokens match the baseline before the first difference and the log-prob gap there.
The last line is ``ratio: X`` (packed float32 over the eager float32 baseline).

    OMP_NUM_THREADS=1 python benchmarks/bench_decode.py [--rows 8] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_generation import QUESTIONS

from harnessrl.harness.base import Message
from harnessrl.policy.base import Generation, GenerationRequest, SamplingParams
from harnessrl.policy.hf import HFPolicy

VARIANTS = {  # name: (dtype, packed_linear)
    "eager float32 (baseline)": ("float32", False),
    "packed float32": ("float32", True),
    "eager bfloat16": ("bfloat16", False),
    "packed bfloat16": ("bfloat16", True),
}


def timed_generate(policy: HFPolicy, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, float, list[Generation]]:
    """Returns (CPU seconds, wall seconds, generations) of one greedy batched call."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=())
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    generations = policy.generate([GenerationRequest(prompt, params) for prompt in prompts])
    cpu, wall = time.process_time() - cpu_started, time.perf_counter() - wall_started
    errors = [g.error for g in generations if g.finish_reason == "error"]
    if errors:
        raise SystemExit(f"generation failed: {errors[0]}")
    return cpu, wall, generations


def agreement(baseline: list[Generation], other: list[Generation]) -> tuple[int, int, float]:
    """Returns (rows equal to the baseline, tokens before the first difference summed over rows,
    largest log-prob gap over those equal tokens)."""
    equal_rows, equal_tokens, gap = 0, 0, 0.0
    for base, generation in zip(baseline, other, strict=True):
        same = 0
        while same < len(base.token_ids) and base.token_ids[same] == generation.token_ids[same]:
            gap = max(gap, abs(base.logprobs[same] - generation.logprobs[same]))
            same += 1
        equal_rows += same == len(base.token_ids)
        equal_tokens += same
    return equal_rows, equal_tokens, gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="requests in the batch")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variant names")
    args = parser.parse_args()

    names = [name.strip() for name in args.variants.split(",")]
    if names[0] != "eager float32 (baseline)":
        names.insert(0, "eager float32 (baseline)")
    policies = {}
    for name in names:
        dtype, packed = VARIANTS[name]
        started = time.perf_counter()
        policies[name] = HFPolicy(
            device="cpu", dtype=dtype, max_batch_size=args.rows, max_prefix_cache_tokens=0, packed_linear=packed
        )
        print(f"{name}: loaded in {time.perf_counter() - started:.1f} s")
    any_policy = policies[names[0]]
    rendered = [any_policy.tokenizer.render([Message("user", q, "task")]).ids for q in QUESTIONS]
    prompts = [rendered[row % len(rendered)] for row in range(args.rows)]
    tokens = args.rows * args.max_new_tokens
    print(
        f"torch threads {torch.get_num_threads()}; {args.rows} prompts of {min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens, {args.max_new_tokens} greedy tokens each ({tokens} per call)"
    )
    for name in names:  # warm-up; the packed variants pack their weights here
        cpu, wall, _ = timed_generate(policies[name], prompts[:2], 4)
        print(f"{name}: warm-up call {cpu:.2f} CPU s, {wall:.2f} s wall")

    cpu_seconds: dict[str, list[float]] = {name: [] for name in names}
    wall_seconds: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, list[Generation]] = {}
    for _ in range(args.repeats):
        for name in names:
            cpu, wall, outputs[name] = timed_generate(policies[name], prompts, args.max_new_tokens)
            cpu_seconds[name].append(cpu)
            wall_seconds[name].append(wall)

    baseline_rate = tokens / statistics.median(cpu_seconds[names[0]])
    for name in names:
        rate = tokens / statistics.median(cpu_seconds[name])
        wall_rate = tokens / statistics.median(wall_seconds[name])
        rows, equal, gap = agreement(outputs[names[0]], outputs[name])
        print(
            f"{name}: {rate:.1f} tokens/CPU-s ({wall_rate:.1f} tokens/s wall), x{rate / baseline_rate:.2f}; "
            f"{rows}/{args.rows} rows equal to the baseline, {equal}/{tokens} tokens before the first "
            f"difference, log-prob gap there <= {gap:.2e}"
        )
        if VARIANTS[name][0] == "float32" and equal != tokens:
            raise SystemExit(f"{name} changed float32 greedy tokens")
    if "packed float32" in names:
        packed_rate = tokens / statistics.median(cpu_seconds["packed float32"])
        print(f"ratio: {packed_rate / baseline_rate:.2f}")


if __name__ == "__main__":
    main()
