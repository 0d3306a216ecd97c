"""Mixed precision on this machine: float32 against bfloat16, for the two halves of a training step.

1. The update: one ``update_step`` (SFT objective, AdamW) on the embedded model's float32 weights,
   with autocast off (baseline) and with bfloat16 autocast (what the trainer does when the
   rollout dtype is bfloat16). ``--rows`` sequences of ``--length`` random tokens, the last
   ``--trained`` of each trained, no shared prefix.
2. Rollouts: ``HFPolicy.generate`` of ``--rows`` prompts (``--prompt-len`` tokens of the README)
   x ``--new-tokens`` greedy tokens, with float32 weights (baseline) and a bfloat16 copy (the
   trainer's rollout copy), prefix cache off.

Interleaved: one warm-up each, then ``--repeats`` timed runs each. Prints the medians, the
generation ratio, and last ``ratio: X`` = float32 update time / bfloat16-autocast update time.
On CPUs without native bfloat16 (no AMX / AVX512-BF16) expect ratios below 1; there the
trainer's ``dtype: auto`` stays float32.

    python benchmarks/bench_precision.py [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.device import cpu_has_native_bf16
from harnessrl.policy.embedded import embedded_model_dir
from harnessrl.policy.hf import HFPolicy
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.objectives import UpdateSettings
from harnessrl.rl.update import update_step


def median_times(sides: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Runs each side once to warm up, then ``repeats`` times interleaved; returns medians."""
    for step in sides.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, step in sides.items():
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
            print(f"  {name}: {times[name][-1]:.2f} s", flush=True)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=1500, help="tokens per update sequence")
    parser.add_argument("--trained", type=int, default=200, help="trained tokens per update sequence")
    parser.add_argument("--prompt-len", type=int, default=900)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = embedded_model_dir()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, native bf16: {cpu_has_native_bf16()}")

    # -- the update -------------------------------------------------------------------------
    policy = HFPolicy(model_dir, device="cpu", dtype="float32", max_prefix_cache_tokens=0)
    model = policy.model
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    samples = []
    for _ in range(args.rows):
        ids = torch.randint(0, vocab, (args.length,), generator=generator).tolist()
        mask = [0] * (args.length - args.trained) + [1] * args.trained
        samples.append(UpdateSample(ids, mask, [0.0] * args.length, 1.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)

    def update(dtype: torch.dtype) -> Callable[[], None]:
        def run() -> None:
            update_step(model, optimizer, samples, policy.tokenizer.pad_token_id, UpdateSettings(
                objective="nll", micro_batch_tokens=args.rows * args.length, autocast_dtype=dtype, share_prefix=False))
        return run

    print(f"update: {args.rows} x {args.length} tokens ({args.trained} trained each), AdamW on float32 weights")
    updates = median_times({"float32": update(torch.float32), "bf16-autocast": update(torch.bfloat16)}, args.repeats)

    # -- rollouts ---------------------------------------------------------------------------
    bf16_policy = HFPolicy(model_dir, device="cpu", dtype="bfloat16", max_prefix_cache_tokens=0)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    ids = policy.hf_tokenizer(text)["input_ids"]
    requests = [
        GenerationRequest(ids[i * 20 : i * 20 + args.prompt_len],
                          SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens))
        for i in range(args.rows * 2)
    ]
    print(f"generate: {len(requests)} prompts x {args.prompt_len} tokens, {args.new_tokens} new tokens each")
    generation = median_times(
        {"float32": lambda: policy.generate(requests), "bf16-copy": lambda: bf16_policy.generate(requests)},
        args.repeats,
    )
    print(f"median update: float32 {updates['float32']:.2f} s, bf16 autocast {updates['bf16-autocast']:.2f} s")
    print(f"median generate: float32 {generation['float32']:.2f} s, bf16 copy {generation['bf16-copy']:.2f} s")
    print(f"generation ratio: {generation['float32'] / generation['bf16-copy']:.2f}")
    print(f"ratio: {updates['float32'] / updates['bf16-autocast']:.2f}")


if __name__ == "__main__":
    main()
