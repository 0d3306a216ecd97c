"""Memory and time of the KV slab's compaction when rows finish: in place against indexing a new slab, in one run.

``HFPolicy`` decodes a batch whose keys and values live in one preallocated ``KVSlab``; each time
requests finish, the kept rows are compacted. The baseline ("index copy") is what the slab did
before: ``buffer[:, :, rows]``, a new slab of the kept rows at full capacity, beside the old one
until it is freed. "in place" (``KVSlab.select`` now) moves the kept rows down inside the same
slab, filled columns only. Every variant runs in a fresh child process (so one's peak does not
hide the other's), generating greedily for ``--rows`` prompts of about ``--prompt-tokens``
tokens whose budgets differ (row r stops after ``--step * (r + 1)`` tokens: one finish event
per row), prefix cache off. A thread samples the child's RSS every 2 ms during the call; the
child reports its peak above the RSS before the call, and its CPU and wall seconds. Variants run
interleaved ``--repeats`` times; medians count. The tokens must be identical in every run (the
script fails otherwise). The last line is ``ratio: X`` (the baseline's peak extra RSS over in place).

    OMP_NUM_THREADS=1 python benchmarks/bench_kv_select.py [--rows 16] [--prompt-tokens 1500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

VARIANTS = ("index copy (baseline)", "in place")


def child(variant: str, rows: int, prompt_tokens: int, step: int, dtype: str) -> dict:
    """Runs one variant's generate call in this process; returns its measurements and tokens."""
    import torch
    from bench_generation import QUESTIONS

    from harnessrl.harness.base import Message
    from harnessrl.memory import PeakRSS
    from harnessrl.policy.base import GenerationRequest, SamplingParams
    from harnessrl.policy.hf import HFPolicy
    from harnessrl.policy.kv_slab import KVSlab, SlabLayer

    if variant == VARIANTS[0]:
        def select(self: KVSlab, kept: torch.Tensor) -> None:
            self.buffer = self.buffer[:, :, kept]
            for layer in self.layers:
                SlabLayer.refresh(layer)
        KVSlab.select = select  # type: ignore[method-assign]
    policy = HFPolicy(device="cpu", dtype=dtype, max_batch_size=rows, max_prefix_cache_tokens=0)
    prompts = []
    for r in range(rows):  # distinct prompts, each a few tokens shorter than the one before
        text = " ".join(QUESTIONS[(r + i) % len(QUESTIONS)] for i in range(200))
        prompts.append(policy.tokenizer.render([Message("user", text, "task")]).ids[: prompt_tokens - r * 7])
    requests = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=step * (r + 1), stop_token_ids=()))
                for r, p in enumerate(prompts)]
    policy.generate(requests[:1])  # warm-up of the kernels for this shape family
    with PeakRSS() as peak:
        cpu, wall = time.process_time(), time.perf_counter()
        generations = policy.generate(requests)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"peak_extra_mb": peak.extra_mb, "cpu_s": cpu, "wall_s": wall,
            "tokens": [g.token_ids for g in generations]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16, help="requests in the batch")
    parser.add_argument("--prompt-tokens", type=int, default=1500, help="tokens of the longest prompt")
    parser.add_argument("--step", type=int, default=8, help="row r generates step * (r + 1) tokens")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant, interleaved")
    parser.add_argument("--dtype", default="bfloat16", help="the rollout copy's dtype (rollouts: bfloat16 here)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rows, args.prompt_tokens, args.step, args.dtype)))
        return
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--rows", str(args.rows),
                                  "--prompt-tokens", str(args.prompt_tokens), "--step", str(args.step),
                                  "--dtype", args.dtype], capture_output=True, text=True, check=True)
            results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    reference = results[VARIANTS[0]][0]["tokens"]
    for variant, runs in results.items():
        if any(run["tokens"] != reference for run in runs):
            sys.exit(f"tokens differ: {variant} does not generate what {VARIANTS[0]} does")
    print(f"{args.rows} rows, longest prompt {args.prompt_tokens} tokens, {args.step}..{args.step * args.rows} new tokens "
          f"(a finish event per row), {args.dtype}, {args.repeats} runs each; tokens identical")
    medians = {}
    for variant, runs in results.items():
        medians[variant] = {key: statistics.median(run[key] for run in runs) for key in ("peak_extra_mb", "cpu_s", "wall_s")}
        m = medians[variant]
        print(f"  {variant:24s} peak RSS above the start {m['peak_extra_mb']:8.1f} MB   CPU {m['cpu_s']:7.2f} s   "
              f"wall {m['wall_s']:7.2f} s")
    base, new = medians[VARIANTS[0]], medians[VARIANTS[1]]
    print(f"CPU time ratio (baseline / in place): {base['cpu_s'] / new['cpu_s']:.2f}")
    print(f"ratio: {base['peak_extra_mb'] / max(new['peak_extra_mb'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
