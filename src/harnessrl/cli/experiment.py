"""`harnessrl experiment FILE.yaml`: run the arms of an experiment under one budget and compare them."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from harnessrl.cli.common import command


def register(subparsers: Any) -> None:
    """Adds the `experiment` sub-command."""
    p = command(subparsers, "experiment", example="harnessrl experiment configs/cpu_ablation.yaml --dry-run",
        help="run training arms with a matched budget, evaluate each the same way, compare (table + report)",
        description="Runs every (arm, seed) of the experiment file that has not finished yet, evaluates it, and "
        "writes comparison.md, comparison.json and report/ to the output folder. Re-running skips finished arms "
        "and resumes a killed one from its last checkpoint.",
    )
    p.add_argument("file", help="experiment YAML (see configs/paper_ablation.yaml)")
    p.add_argument("--out", default=None, help="output folder (default: experiments/<name>)")
    p.add_argument("--dry-run", action="store_true", help="validate the file and print the arms and budget; run nothing")
    p.add_argument("--seeds", default=None, help="run only these seeds of the file, comma-separated (e.g. 1)")
    p.add_argument("--arms", default=None, help="run only these arms of the file, comma-separated; the table still "
                   "shows every finished arm of the folder")
    p.add_argument("--jobs", type=int, default=1, help="run the seeds in this many worker processes at once, each "
                   "with its share of the cores (logs in OUT/logs/); the table is written once they end")
    p.add_argument("--no-table", action="store_true", help="run the arms only; write no table or report (what each "
                   "--jobs worker runs)")
    p.add_argument("--record", default=None, metavar="DIR", help="copy the output folder to DIR without model "
                   "weights and optimizer state (MBs, not GBs: run into it later, on a machine of the same "
                   "class, to add arms; warm starts are trained again and checked bit for bit) and exit")
    p.set_defaults(func=run_experiment_cli)


def run_experiment_cli(args: argparse.Namespace) -> int:
    from collections import Counter

    from harnessrl.design import make_design
    from harnessrl.eval.sets import EXTERNAL_PREFIX, resolve_eval_set
    from harnessrl.experiment import (
        arm_config,
        arm_id,
        budget,
        comparison_markdown,
        executor_rollouts_bound,
        load_experiment,
        run_experiment,
        run_experiment_jobs,
        warm_start_config,
        write_record,
    )
    from harnessrl.harness.registry import default_space
    from harnessrl.tasks.suite import select_tasks

    spec = load_experiment(args.file)
    out = Path(args.out or f"experiments/{spec.name}")
    if args.record:
        try:
            print(f"record of {out}: {write_record(out, args.record)}")
        except (FileNotFoundError, ValueError) as exc:
            raise SystemExit(f"harnessrl experiment --record: {exc}") from None
        return 0
    if args.dry_run:
        first = arm_config(spec, next(a for a in spec.arms if a.control is None), spec.seeds[0], out)
        print(f"experiment {spec.name}: {len(spec.arms)} arms x {len(spec.seeds)} seeds -> {out}")
        print(f"budget per arm: {budget(first)}")
        if spec.warm_start is not None:
            warm = warm_start_config(spec, spec.seeds[0], out)
            print(f"shared warm start per seed: {warm.sft_warm_start_steps} SFT steps on {warm.sft_tasks} oracle "
                  f"demonstrations under the {warm.design} design -> {out / 'warm-start'}")
        targets = resolve_eval_set(spec.eval.configs, make_design(default_space(), spec.eval.design, seed=spec.eval.seed),
                                   held_out=spec.eval.held_out, seed=spec.eval.seed)
        # the test tasks the arms are evaluated on: eval.tasks of the split, or all it has of the file's tiers and families
        tasks = len(select_tasks(first.suite, first.eval_split, spec.eval.tasks, spec.eval.seed, first.tiers, first.families))
        sides: Counter[str] = Counter()
        for t in targets:  # agent programs run on the first eval.external_tasks tasks, if it is set
            agent = t.name.startswith(EXTERNAL_PREFIX) and spec.eval.external_tasks is not None
            sides["in-space" if t.group in ("in_space", "train") else "out-of-space"] += (
                min(spec.eval.external_tasks or 0, tasks) if agent else tasks) * spec.eval.k
        short = f" (the {first.eval_split} split has {tasks} of the {spec.eval.tasks} tasks asked)" if tasks < spec.eval.tasks else ""
        print("evaluation per arm and seed: " + ", ".join(f"{n} {side} episodes" for side, n in sorted(sides.items())) + short)
        for arm in spec.arms:
            cfg = arm_config(spec, arm, spec.seeds[0], out)
            if arm.control == "sft-only":
                print(f"  {arm.name:<22} control: the warm start alone, no RL step")
                continue
            try:
                bound = executor_rollouts_bound(cfg)
                validation = f"{bound['validation']} paired validation"
            except FileNotFoundError as exc:  # a pool the file's own steps build later (pool evolve)
                bound = executor_rollouts_bound(cfg.model_copy(update={"router": "random"}))
                validation = f"paired validation not known yet ({exc})"
            rescue = f"rescue {cfg.rescue}" + (f" ({cfg.router}, K={cfg.rescue_k})" if cfg.rescue == "siblings" else "")
            if cfg.rollout_through != "harness" or cfg.objective != "rl":
                source = f", {cfg.sft_source} runs" if cfg.objective == "sft" else ""
                rescue += f"; through {cfg.rollout_through} ({cfg.objective}{source})"
            print(f"  {arm_id(arm, spec.seeds[0]).rsplit('-seed', 1)[0]:<22} design {cfg.design:<12} "
                  f"pairing {cfg.pairing:<10} K={cfg.k}  {rescue}; executor rollouts: {bound['first_pass']} first "
                  f"pass + at most {bound['sampling_at_most']} dynamic sampling + at most {bound['rescue_at_most']} "
                  f"rescue + {validation}")
        return 0

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    try:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        raise SystemExit(f"--seeds: comma-separated integers, not {args.seeds!r}") from None
    arms = [x.strip() for x in args.arms.split(",") if x.strip()] if args.arms else None
    unknown = sorted(set(seeds or ()) - set(spec.seeds)) + sorted(set(arms or ()) - {a.name for a in spec.arms})
    if unknown:
        raise SystemExit(f"harnessrl experiment: {spec.name} has no seed or arm {', '.join(map(str, unknown))} (seeds "
                         f"{spec.seeds}; arms {', '.join(a.name for a in spec.arms)})")
    if args.jobs < 1:
        raise SystemExit(f"--jobs: at least 1, not {args.jobs}")
    if args.jobs > 1 and args.no_table:
        raise SystemExit("--jobs and --no-table: the workers of --jobs run with --no-table; give one of them")
    if args.jobs > 1:
        try:
            result = run_experiment_jobs(spec, args.file, out, args.jobs, log=log, seeds=seeds, arms=arms)
        except RuntimeError as exc:  # a worker failed; the table of what finished is written
            print(f"harnessrl experiment: {exc}", file=sys.stderr)
            return 1
    else:
        result = run_experiment(spec, out, log=log, source=args.file, seeds=seeds, arms=arms, table=not args.no_table)
    if result is None:
        print(f"arms run; the table: harnessrl experiment {args.file} --out {out} (finished arms are skipped)")
        return 0
    print()
    print(comparison_markdown(result))
    print(f"report: {out / 'report' / 'index.html'}")
    sys.stdout.flush()
    return 0
