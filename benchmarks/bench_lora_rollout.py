"""Benchmark: LoRA rollouts through the unmerged adapters (baseline) against a merged copy.

A LoRA run used to sample through its PEFT model: every linear layer ran the frozen base and
then the adapter's two small matrices, in Python, in float32 on a CPU. It now trains the
adapters on a model of its own and samples from a copy that holds them merged
(``policy/merged.py``), in the trainer's rollout dtype (bfloat16 where the CPU has it), on the
packed linear layers. Here: the embedded model with rank-16 adapters on every linear layer
(random B, as after training), ``HFPolicy.generate`` of ``--rows`` prompts of ``--prompt-len``
README tokens x ``--new-tokens`` greedy tokens, prefix cache off, three sides interleaved:

* ``adapters`` (baseline, what the trainer did): float32, sampling through the PEFT model;
* ``merged-float32``: the merged copy in float32 (the merge alone);
* ``merged-rollout``: the merged copy in the rollout dtype of ``dtype: auto`` (what it does now).

Also times one sync (the merge and the copy into the rollout copy, paid once per optimizer step)
and counts greedy tokens that agree with the baseline. Last line ``ratio: X`` = baseline time /
merged-rollout time.

    python benchmarks/bench_lora_rollout.py [--rows 8] [--prompt-len 900] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from bench_precision import median_times

from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.device import cpu_has_native_bf16, resolve_rollout_dtype
from harnessrl.policy.embedded import embedded_model_dir
from harnessrl.policy.hf import HFPolicy


def add_lora(base: torch.nn.Module, rank: int) -> torch.nn.Module:
    """``base`` with rank-``rank`` adapters on every linear layer, B random (as after training)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 1e-3)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=900)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = embedded_model_dir()
    rollout_dtype = resolve_rollout_dtype("auto", torch.device("cpu"))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, native bf16: {cpu_has_native_bf16()}, "
          f"rollout dtype of dtype auto: {rollout_dtype}")

    from transformers import AutoModelForCausalLM

    adapters = HFPolicy(model_dir, device="cpu", dtype="float32", max_prefix_cache_tokens=0)
    adapters.sync_weights(add_lora(adapters.model, args.rank))  # wraps the policy's own model
    trained = add_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True),
                       args.rank)  # a model of its own, the same adapters (same seed)
    merged32 = HFPolicy(model_dir, device="cpu", dtype="float32", max_prefix_cache_tokens=0)
    merged = HFPolicy(model_dir, device="cpu", dtype=rollout_dtype, max_prefix_cache_tokens=0)
    merged32.sync_weights(trained)
    started = time.perf_counter()
    merged.sync_weights(trained)
    sync_s = time.perf_counter() - started

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    ids = merged.hf_tokenizer(text)["input_ids"]
    requests = [GenerationRequest(ids[i * 20 : i * 20 + args.prompt_len],
                                  SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens))
                for i in range(args.rows)]
    print(f"generate: {len(requests)} prompts x {args.prompt_len} tokens, {args.new_tokens} greedy tokens each; "
          f"LoRA rank {args.rank} on every linear layer")
    outputs: dict[str, list[list[int]]] = {}

    def side(name: str, policy: HFPolicy):
        def run() -> None:
            outputs[name] = [list(g.token_ids) for g in policy.generate(requests)]
        return run

    times = median_times({"adapters": side("adapters", adapters), "merged-float32": side("merged-float32", merged32),
                          "merged-rollout": side("merged-rollout", merged)}, args.repeats)
    for name in ("merged-float32", "merged-rollout"):
        same = sum(a == b for row_a, row_b in zip(outputs["adapters"], outputs[name], strict=True)
                   for a, b in zip(row_a, row_b, strict=False))  # a row may stop early at its end token
        total = sum(len(row) for row in outputs["adapters"])
        print(f"{name}: median {times[name]:.2f} s, {times['adapters'] / times[name]:.2f}x the adapters' "
              f"{times['adapters']:.2f} s; greedy tokens equal to the adapters' at the same position: {same}/{total}")
    print(f"one sync (merge + copy into the {str(rollout_dtype).removeprefix('torch.')} copy): {sync_s:.3f} s")
    print(f"ratio: {times['adapters'] / times['merged-rollout']:.2f}")


if __name__ == "__main__":
    main()
