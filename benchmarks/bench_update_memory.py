"""Peak memory and time of one GRPO update on the embedded model: activation checkpointing against keeping every activation, in one run.

The update is that of ``configs/cpu_learn.yaml``'s RL arm: LoRA rank 16 over float32 weights,
bfloat16 autocast, one optimizer step over ``--groups`` GRPO groups of ``--group-size`` samples;
each sample is a shared ``--prompt-tokens`` prompt (a harness's system prompt and the task) then
``--turns`` turns of 128 sampled (trained) tokens and ``--observation-tokens`` of observation.
Variants:

- ``kept, 2048`` (baseline: the file's setting): every activation kept for the backward pass,
  ``micro_batch_tokens: 2048`` (a sample longer than that is its own micro-batch, so each
  sample runs its group's prompt again);
- ``checkpointed, 2048``: ``activation_checkpointing: true`` at the same budget;
- ``checkpointed, 8192``: checkpointing with a budget a whole group fits in, so that its prompt
  runs once for its rows (the shared-prefix micro-batch);
- ``checkpointed, 8192, head by 512``: the same with ``lm_head_chunk_tokens: 512`` (the trained
  positions through the LM head 512 at a time, each chunk's logits recomputed in the backward).

Each variant runs in a fresh child process (so one's peak does not hide another's) and takes a
short update first (first-call costs); a thread samples the child's RSS every 2 ms during the update, and the child reports its peak above the
RSS before the update, its CPU and wall seconds, and the trained LoRA weights' digest: the
variants must train the same weights up to float rounding (checkpointing alone changes no bit; a
larger micro-batch or a chunked head sums the same gradients in another order), and the script fails otherwise.
The last line is ``ratio: X`` (the baseline's peak extra RSS over the last variant's).

    OMP_NUM_THREADS=1 python benchmarks/bench_update_memory.py [--groups 2] [--prompt-tokens 1500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

VARIANTS = {"kept, 2048 (baseline)": (False, 2048, 0), "checkpointed, 2048": (True, 2048, 0),
            "checkpointed, 8192": (True, 8192, 0), "checkpointed, 8192, head by 512": (True, 8192, 512)}


def samples(args: argparse.Namespace, vocabulary: int) -> list:
    """The update's samples: per group one prompt, then each member's own turns."""
    import random

    from harnessrl.rl.batching import UpdateSample

    rng = random.Random(0)
    out = []
    for group in range(args.groups):
        prompt = [rng.randrange(100, vocabulary) for _ in range(args.prompt_tokens)]
        for member in range(args.group_size):
            ids, mask = list(prompt), [0] * len(prompt)
            for _ in range(args.turns):
                ids += [rng.randrange(100, vocabulary) for _ in range(128)]
                mask += [1] * 128
                ids += [rng.randrange(100, vocabulary) for _ in range(args.observation_tokens)]
                mask += [0] * args.observation_tokens
            logprobs = [-2.0 - 0.01 * (i % 7) for i in range(len(ids))]
            out.append(UpdateSample(ids, mask, logprobs, advantage=(-1.0) ** (member + group) * 0.8))
    return out


def child(variant: str, args: argparse.Namespace) -> dict:
    """Runs one variant's update in this process; returns its measurements and weights digest."""
    import hashlib

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from harnessrl.memory import PeakRSS
    from harnessrl.policy.embedded import resolve_model_path
    from harnessrl.rl.batching import UpdateSample
    from harnessrl.rl.forward import enable_activation_checkpointing
    from harnessrl.rl.objectives import UpdateSettings
    from harnessrl.rl.update import update_step

    checkpointed, budget, head_chunk = VARIANTS[variant]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("embedded"), dtype=torch.float32,
                                                 local_files_only=True)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                             init_lora_weights=False))
    if checkpointed:
        enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = samples(args, int(model.config.vocab_size))
    settings = UpdateSettings(micro_batch_tokens=budget, autocast_dtype=torch.bfloat16, lm_head_chunk_tokens=head_chunk)
    # A short update first (the kernels' and the allocator's first-call costs, as in a trainer's
    # later steps); every variant takes it, so their weights stay comparable.
    first = batch[0]
    update_step(model, optimizer, [UpdateSample(first.input_ids[-256:], first.loss_mask[-256:],
                                                first.rollout_logprobs[-256:], first.advantage)], 0, settings)
    with PeakRSS() as peak:
        cpu, wall = time.process_time(), time.perf_counter()
        metrics = update_step(model, optimizer, batch, 0, settings)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    trained = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    digest = hashlib.sha256(b"".join(trained[n].float().numpy().tobytes() for n in sorted(trained))).hexdigest()
    return {"peak_extra_mb": peak.extra_mb, "cpu_s": cpu, "wall_s": wall, "digest": digest,
            "abs_sum": float(sum(t.double().abs().sum() for t in trained.values())),
            "micro_batches": metrics.get("micro_batches"), "prefix_tokens_saved": metrics.get("prefix_tokens_saved"),
            "trained_tokens": metrics.get("trained_tokens")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2, help="GRPO groups in the update")
    parser.add_argument("--group-size", type=int, default=4, help="samples per group")
    parser.add_argument("--prompt-tokens", type=int, default=1500, help="the prompt a group's samples share")
    parser.add_argument("--turns", type=int, default=3, help="turns of 128 trained tokens per sample")
    parser.add_argument("--observation-tokens", type=int, default=100, help="observation tokens after each turn")
    parser.add_argument("--repeats", type=int, default=1, help="runs per variant, interleaved")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    shape = ["--groups", str(args.groups), "--group-size", str(args.group_size), "--prompt-tokens",
             str(args.prompt_tokens), "--turns", str(args.turns), "--observation-tokens", str(args.observation_tokens)]
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--child", variant, *shape],
                                 capture_output=True, text=True, check=True)
            results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    baseline = results[next(iter(VARIANTS))][0]
    length = args.prompt_tokens + args.turns * (128 + args.observation_tokens)
    print(f"{args.groups} groups x {args.group_size} samples of {length} tokens ({args.prompt_tokens} shared per "
          f"group), LoRA r16, bf16 autocast, {args.repeats} run(s) each")
    medians = {}
    for variant, runs in results.items():
        medians[variant] = {key: statistics.median(run[key] for run in runs) for key in ("peak_extra_mb", "cpu_s", "wall_s")}
        m, first = medians[variant], runs[0]
        same = "identical" if first["digest"] == baseline["digest"] else (
            f"abs sum {first['abs_sum'] / baseline['abs_sum'] - 1:+.1e} rel")
        print(f"  {variant:24s} peak RSS above the start {m['peak_extra_mb']:8.1f} MB   CPU {m['cpu_s']:7.1f} s   "
              f"wall {m['wall_s']:7.1f} s   micro-batches {first['micro_batches']:.0f}, prefix tokens saved "
              f"{first['prefix_tokens_saved']:.0f}; weights vs baseline: {same}")
        if first["digest"] != baseline["digest"] and abs(first["abs_sum"] / baseline["abs_sum"] - 1) > 1e-4:
            sys.exit(f"{variant} trained other weights than the baseline")
    if results["checkpointed, 2048"][0]["digest"] != baseline["digest"]:
        sys.exit("checkpointing alone changed the trained weights")
    base, best = medians[next(iter(VARIANTS))], medians[list(VARIANTS)[-1]]
    for variant, m in medians.items():
        print(f"CPU time ratio (baseline / {variant}): {base['cpu_s'] / m['cpu_s']:.2f}")
    print(f"ratio: {base['peak_extra_mb'] / max(best['peak_extra_mb'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
