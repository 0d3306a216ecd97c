"""Peak memory, CPU time and page faults of the quick preset's warm-start steps (the SFT steps of `make run`), two variants side by side in one run.

The steps are those of ``harnessrl train`` (the quick preset, or whatever ``--set`` changes):
oracle demonstrations under the training harnesses, then ``--steps`` full fine-tuning steps of
4 demonstrations each (float32 master weights, bfloat16 autocast where the CPU has it,
activation checkpointing, each step followed by the weight sync). Each variant runs in a fresh
child process with glibc's arenas capped at 2 (as the command line does). ``--compare``:

- ``threshold``: glibc's dynamic mmap threshold (baseline), which rises to the size of each
  mapped block freed (up to 32 MB), so a step's activations come from the heap, against
  ``harnessrl.memory.fix_mmap_threshold()`` at ``--threshold-mib`` (default 1; off by default:
  at 1 MiB measured 1.32x less peak at 1.33x the CPU time), which maps every block of that size
  or more and hands it back when freed. The allocator moves no value: the NLLs must be equal.
  ``ratio``: the baseline's peak over the variant's.
- ``causal``: micro-batches under their padding mask (``causal_mask_only: false``, baseline)
  against the causal mask alone (``causal_mask_only: true``, the quick preset's). Step 0's NLL
  must be equal (the forward is the same bit for bit); later steps differ by the attention
  backward's rounding. ``ratio``: the baseline's CPU time over the variant's.

Per step it prints the tokens, trained tokens, micro-batches, CPU and wall seconds, the peak
RSS (sampled every 10 ms) and the NLL. Step 0 (first-call costs) is left out of the sums.
``--profile`` prints the top operators of step 2 by self CPU time (baseline only).

    OMP_NUM_THREADS=1 python benchmarks/bench_warm_start.py [--compare threshold|causal] [--steps 5] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

# comparison: {variant: (fix the mmap threshold, config fields set)}, the baseline first
COMPARISONS = {
    "threshold": {"glibc default threshold (baseline)": (False, []), "fixed threshold": (True, [])},
    "causal": {"padding mask (baseline)": (False, ["causal_mask_only=false"]),
               "causal mask only": (False, ["causal_mask_only=true"])},
}


class _Enough(Exception):
    """Ends the warm start once the measured steps are done."""


def child(variant: str, args: argparse.Namespace) -> dict:
    """Runs the warm start's first ``args.steps`` steps under ``variant`` of ``args.compare``;
    returns per-step figures."""
    import resource
    import tempfile
    import time

    from harnessrl import memory
    from harnessrl.memory import PeakRSS

    memory.limit_malloc_arenas()
    fixed_threshold, fields = COMPARISONS[args.compare][variant]
    if fixed_threshold:
        assert memory.fix_mmap_threshold(args.threshold_mib << 20), "glibc refused the mmap threshold"
    import torch

    from harnessrl.rl.config import load_config
    from harnessrl.rl.loop import Trainer

    cfg = load_config(preset="quick", sets=[f"run_dir={tempfile.mkdtemp()}", *args.set, *fields])
    trainer = Trainer(cfg, log=lambda message: None)
    sft_step, steps = trainer.actor.sft_step, []

    def measured(samples, optimizer, scheduler):
        faults, cpu, wall = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.perf_counter()
        with PeakRSS(0.01) as peak:
            if args.profile and len(steps) == 2:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    metrics = sft_step(samples, optimizer, scheduler)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
            else:
                metrics = sft_step(samples, optimizer, scheduler)
        steps.append({
            "tokens": sum(len(s.input_ids) for s in samples), "trained": sum(sum(s.loss_mask) for s in samples),
            "micro_batches": metrics.get("micro_batches"), "cpu_s": time.process_time() - cpu,
            "wall_s": time.perf_counter() - wall, "start_mb": peak.start_mb, "peak_mb": peak.peak_mb,
            "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, "nll": metrics["nll"],
        })
        if len(steps) == args.steps:
            raise _Enough
        return metrics

    trainer.actor.sft_step = measured
    try:
        trainer.warm_start()
    except _Enough:
        pass
    finally:
        trainer.close()
    return {"steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="threshold", help="the pair of variants")
    parser.add_argument("--threshold-mib", type=int, default=1, help="the fixed threshold (--compare threshold)")
    parser.add_argument("--steps", type=int, default=5, help="warm-start steps per variant (the first is left out)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a training config field over the quick preset (repeatable)")
    parser.add_argument("--profile", action="store_true", help="print step 2's top operators (baseline)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    shape = ["--compare", args.compare, "--threshold-mib", str(args.threshold_mib), "--steps", str(args.steps),
             *(f"--set={item}" for item in args.set)]
    variants = COMPARISONS[args.compare]
    results = {}
    for index, variant in enumerate(variants):
        profile = ["--profile"] if args.profile and index == 0 else []
        out = subprocess.run([sys.executable, __file__, "--child", variant, *shape, *profile],
                             stdout=subprocess.PIPE, text=True, check=True)
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])["steps"]
    baseline = results[next(iter(variants))]
    print(f"quick preset warm start, steps 1-{args.steps - 1} (step 0 left out){' with ' + ', '.join(args.set) if args.set else ''}")
    summary = {}
    for variant, steps in results.items():
        for i, step in enumerate(steps):
            print(f"  {variant:36s} step {i}: {step['tokens']} tokens ({step['trained']} trained, "
                  f"{step['micro_batches']:.0f} micro-batches) CPU {step['cpu_s']:6.1f} s wall {step['wall_s']:6.1f} s "
                  f"RSS {step['start_mb']:6.0f} -> peak {step['peak_mb']:6.0f} MB, {step['faults']} page faults, "
                  f"NLL {step['nll']:.6f}")
        later = steps[1:]
        summary[variant] = {"peak_mb": max(s["peak_mb"] for s in later), "cpu_s": sum(s["cpu_s"] for s in later),
                            "faults": sum(s["faults"] for s in later)}
        m = summary[variant]
        print(f"{variant:38s} peak RSS {m['peak_mb']:6.0f} MB   CPU {m['cpu_s']:6.1f} s   page faults {m['faults']}")
        same = len(steps) if args.compare == "threshold" else 1  # the steps whose NLL must be equal
        if [s["nll"] for s in steps[:same]] != [s["nll"] for s in baseline[:same]]:
            sys.exit(f"{variant} trained other numbers than the baseline")
    base, other = (summary[v] for v in variants)
    drift = max(abs(a["nll"] - b["nll"]) / abs(b["nll"]) for a, b in zip(results[list(variants)[1]], baseline, strict=True))
    print(f"largest NLL difference, relative: {drift:.2e}")
    print(f"peak ratio (baseline / variant): {base['peak_mb'] / other['peak_mb']:.2f}")
    print(f"CPU time ratio (variant / baseline): {other['cpu_s'] / base['cpu_s']:.2f}")
    key = "peak_mb" if args.compare == "threshold" else "cpu_s"
    print(f"ratio: {base[key] / other[key]:.2f}")


if __name__ == "__main__":
    main()
