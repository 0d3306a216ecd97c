"""Generation throughput: HFPolicy.generate on a batch of 8 requests vs transformers' model.generate
called once per request, sequentially, on the same prompts and token limits, in one run.

Both sides decode greedily (so they produce the same tokens up to float rounding) with the
same stop ids and the same ``max_new_tokens``; throughput is generated tokens per second of
wall time. The last line is ``ratio: X`` (batched HFPolicy tokens/s over the baseline's).

    .venv/bin/python benchmarks/bench_generation.py [--max-new-tokens 48] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from harnessrl.harness.base import Message
from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.hf import HFPolicy

QUESTIONS = (
    "Hi!",
    "What is the capital of France?",
    "List three colors.",
    "Explain what a file system is in two sentences.",
    "Write a haiku about the sea.",
    "How do I list the files in a directory with the shell? Show the command.",
    "Give me a short tip for writing clear Python functions, with a tiny example.",
    "Summarize the plot of a story about a small boat lost at night, in a few sentences.",
)


def baseline_tokens_per_second(
    policy: HFPolicy, prompts: list[list[int]], max_new_tokens: int
) -> tuple[float, int]:
    """Returns (tokens/s, tokens) of ``model.generate`` called once per prompt, in sequence."""
    stop_ids = list(policy.tokenizer.stop_token_ids)
    tokens = 0
    started = time.perf_counter()
    for prompt in prompts:
        input_ids = torch.tensor([prompt], device=policy.device)
        with torch.inference_mode():
            output = policy.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=stop_ids,
                pad_token_id=policy.tokenizer.pad_token_id,
            )
        tokens += output.shape[1] - input_ids.shape[1]
    return tokens / (time.perf_counter() - started), tokens


def policy_tokens_per_second(
    policy: HFPolicy, prompts: list[list[int]], max_new_tokens: int
) -> tuple[float, int]:
    """Returns (tokens/s, tokens) of one batched ``HFPolicy.generate`` call over all prompts."""
    params = SamplingParams(
        temperature=0.0,
        max_new_tokens=max_new_tokens,
        stop_token_ids=policy.tokenizer.stop_token_ids,
    )
    started = time.perf_counter()
    generations = policy.generate([GenerationRequest(prompt, params) for prompt in prompts])
    elapsed = time.perf_counter() - started
    errors = [g.error for g in generations if g.finish_reason == "error"]
    if errors:
        raise SystemExit(f"generation failed: {errors[0]}")
    return sum(len(g.token_ids) for g in generations) / elapsed, sum(
        len(g.token_ids) for g in generations
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48, help="token limit per request")
    parser.add_argument("--device", default="auto", help="torch device (auto: CUDA when available)")
    args = parser.parse_args()

    policy = HFPolicy(device=args.device, max_batch_size=len(QUESTIONS))
    prompts = [policy.tokenizer.render([Message("user", q, "task")]).ids for q in QUESTIONS]
    print(
        f"model {policy.name} on {policy.device} ({policy.dtype}), torch threads {torch.get_num_threads()}"
    )
    print(
        f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
        f"max_new_tokens {args.max_new_tokens}, greedy"
    )
    # Warm up both paths (first calls pay one-time allocation costs).
    policy_tokens_per_second(policy, prompts[:2], 4)
    baseline_tokens_per_second(policy, prompts[:1], 4)

    baseline_rate, baseline_tokens = baseline_tokens_per_second(
        policy, prompts, args.max_new_tokens
    )
    print(
        f"baseline model.generate, one request at a time: {baseline_rate:.1f} tokens/s ({baseline_tokens} tokens)"
    )
    batched_rate, batched_tokens = policy_tokens_per_second(policy, prompts, args.max_new_tokens)
    print(
        f"HFPolicy.generate, batch of {len(prompts)}: {batched_rate:.1f} tokens/s ({batched_tokens} tokens)"
    )
    print(f"ratio: {batched_rate / baseline_rate:.2f}")


if __name__ == "__main__":
    main()
