"""Peak memory, CPU time and page faults of the quick preset's warm-start steps (the SFT steps of `make run`), glibc's mmap threshold fixed against glibc's default, in one run.

The steps are those of ``harnessrl train`` (the quick preset, or whatever ``--set`` changes):
oracle demonstrations under the training harnesses, then ``--steps`` full fine-tuning steps of
4 demonstrations each (float32 master weights, bfloat16 autocast where the CPU has it,
activation checkpointing, each step followed by the weight sync). Variants, each in a fresh
child process with glibc's arenas capped at 2 (as the command line does):

- ``glibc default threshold`` (baseline): glibc's dynamic mmap threshold, which rises to the
  size of each mapped block freed (up to 32 MB), so a step's activations come from the heap;
- ``fixed 1 MiB threshold``: ``harnessrl.memory.fix_mmap_threshold()`` (off by default: measured
  1.32x less peak at 1.33x the CPU time): every block of 1 MiB or more is mapped and handed back
  when freed.

Per step it prints the tokens, trained tokens, micro-batches, CPU and wall seconds, the peak
RSS (sampled every 10 ms) and the NLL; the two variants must train the same numbers (the
allocator moves no value), and the script fails otherwise. Step 0 (first-call costs) is left
out of the sums. The last line is ``ratio: X`` (the baseline's peak over the fixed threshold's).
``--profile`` prints the top operators of step 2 by self CPU time (baseline only).

    OMP_NUM_THREADS=1 python benchmarks/bench_warm_start.py [--steps 5] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

VARIANTS = {"glibc default threshold (baseline)": False, "fixed 1 MiB threshold": True}


class _Enough(Exception):
    """Ends the warm start once the measured steps are done."""


def child(variant: str, args: argparse.Namespace) -> dict:
    """Runs the warm start's first ``args.steps`` steps under ``variant``; returns per-step figures."""
    import resource
    import tempfile
    import time

    from harnessrl import memory
    from harnessrl.memory import PeakRSS

    memory.limit_malloc_arenas()
    if VARIANTS[variant]:
        assert memory.fix_mmap_threshold(), "glibc refused the mmap threshold"
    import torch

    from harnessrl.rl.config import load_config
    from harnessrl.rl.loop import Trainer

    cfg = load_config(preset="quick", sets=[f"run_dir={tempfile.mkdtemp()}", *args.set])
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
    shape = ["--steps", str(args.steps)] + [f"--set={item}" for item in args.set]
    results = {}
    for index, variant in enumerate(VARIANTS):
        profile = ["--profile"] if args.profile and index == 0 else []
        out = subprocess.run([sys.executable, __file__, "--child", variant, *shape, *profile],
                             stdout=subprocess.PIPE, text=True, check=True)
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])["steps"]
    baseline = results[next(iter(VARIANTS))]
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
        if [s["nll"] for s in steps] != [s["nll"] for s in baseline]:
            sys.exit(f"{variant} trained other numbers than the baseline")
    base, fixed = (summary[v] for v in VARIANTS)
    print(f"CPU time ratio (fixed / baseline): {fixed['cpu_s'] / base['cpu_s']:.2f}")
    print(f"ratio: {base['peak_mb'] / fixed['peak_mb']:.2f}")


if __name__ == "__main__":
    main()
