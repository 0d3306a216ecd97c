"""`harnessrl rollout`: run a policy through harnesses on tasks and show or score the episodes."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from typing import Any

from harnessrl.cli.common import command, harness_set, policy_from_spec, suite_named
from harnessrl.eval.sets import HARNESS_SETS, resolve_harness_set
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.harness.limits import resolve_limits
from harnessrl.policy import POLICY_SPECS, SamplingParams
from harnessrl.policy.scripted import SCRIPTED_POLICIES
from harnessrl.rollout.engine import EngineOptions, RolloutEngine, RolloutJob
from harnessrl.tasks.suite import load_suite, parse_limit, parse_task_ids, split_size, tasks_by_id
from harnessrl.trajectory import Trajectory, save_jsonl


def register(subparsers: Any) -> None:
    """Adds the `rollout` sub-command."""
    p = command(subparsers, "rollout", example="harnessrl rollout --policy oracle --configs S1-T2-O0-C1-W2,codex-like --show",
        help="run episodes of a policy through harnesses on tasks",
        description="Runs episodes (task x harness x policy) and prints transcripts or a JSON summary.",
    )
    p.add_argument("--policy", default="oracle", help=f"policy: {POLICY_SPECS}")
    p.add_argument(
        "--configs", default="S0-T0-O0-C0-W0",
        help=f"comma-separated codes or out-of-space names, or one of {', '.join(HARNESS_SETS)}; "
        "pool:DIR (every member of a sibling pool) or DIR#ID (one member)",
    )
    p.add_argument("--suite", default="workspace", help="task suite name or task file")
    p.add_argument("--split", default="test", help="task split")
    p.add_argument("--limit", type=parse_limit, default=3,
                   help="tasks to run per harness, a seeded sample (default 3; 'all' for every task of the split)")
    p.add_argument("--task-ids", type=parse_task_ids, default=None,
                   help="comma-separated task ids to run instead of a sample (a,b,c)")
    p.add_argument("--seed", type=int, default=0, help="seed for task sampling and policies")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of model policies")
    p.add_argument("--max-turns", type=int, default=HarnessLimits.max_turns, help="turn limit per episode")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn")
    p.add_argument("--context-tokens", type=int, default=None, help="context window")
    p.add_argument("--concurrent", type=int, default=EngineOptions.max_concurrent, help="episodes in flight at once")
    p.add_argument("--workers", type=int, default=EngineOptions.env_workers, help="threads for sandbox steps")
    p.add_argument("--backend", default="auto", help="sandbox backend: auto, bwrap, unshare, none")
    p.add_argument("--out", default=None, help="write trajectories to this JSONL file")
    p.add_argument("--show", action="store_true", help="print a readable transcript of every episode")
    p.add_argument("--spans", action="store_true", help="with --show, label the first prompt's spans")
    p.add_argument("--json", action="store_true", help="print one JSON object with pass_rate and per-config results")
    p.set_defaults(func=run_rollout)


def summarize(trajectories: list[Trajectory]) -> dict[str, Any]:
    """Returns pass rate overall and per configuration, with status counts."""
    per_config: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        per_config[t.config].append(t)

    def stats(items: list[Trajectory]) -> dict[str, Any]:
        statuses: dict[str, int] = defaultdict(int)
        for t in items:
            statuses[t.status] += 1
        return {
            "episodes": len(items),
            "passed": sum(t.passed for t in items),
            "pass_rate": sum(t.passed for t in items) / len(items) if items else 0.0,
            "format_errors": sum(t.metrics.get("format_errors", 0) for t in items),
            "tool_errors": sum(t.metrics.get("tool_errors", 0) for t in items),
            "statuses": dict(statuses),
        }

    overall = stats(trajectories)
    return {
        **overall,
        "per_config": {code: stats(items) for code, items in per_config.items()},
        "failures": [
            {"task": t.task_id, "config": t.config, "status": t.status, "error": t.error}
            for t in trajectories if not t.passed
        ],
    }


def task_selection(suite: Any, args: argparse.Namespace, tasks: list[Any]) -> dict[str, Any]:
    """Returns how the tasks were chosen: by id, or a sample (``sampled``) of the split."""
    if args.task_ids:
        return {"suite": suite.name, "by_id": True, "sampled": False, "selected": len(tasks),
                "task_ids": [t.id for t in tasks]}
    available = split_size(suite, args.split)
    sampled = args.limit is not None and (available is None or args.limit < available)
    return {"suite": suite.name, "split": args.split, "by_id": False, "sampled": sampled,
            "limit": args.limit, "seed": args.seed, "selected": len(tasks), "available": available,
            "task_ids": [t.id for t in tasks]}


def selection_line(selection: dict[str, Any]) -> str:
    """Returns one line saying which tasks ran (a sample says so, and how to run them all)."""
    if selection["by_id"]:
        return f"tasks: {selection['selected']} by id from suite {selection['suite']!r}"
    of = f" of {selection['available']}" if selection["available"] is not None else ""
    if selection["sampled"]:
        return (f"tasks: a seeded sample of {selection['selected']}{of} {selection['split']} tasks of suite "
                f"{selection['suite']!r} (--limit {selection['limit']}, --seed {selection['seed']}; "
                "--limit all runs every task)")
    return f"tasks: all {selection['selected']} {selection['split']} tasks of suite {selection['suite']!r}"


def run_rollout(args: argparse.Namespace) -> int:
    # Scripted policies tokenize bytewise: long gold commands need room.
    scripted = args.policy in SCRIPTED_POLICIES
    limits = resolve_limits(vars(args), bytewise=scripted)
    harnesses = harness_set(args.configs, lambda: [Harness.named(name, limits)
                                                   for name in resolve_harness_set(args.configs, args.seed)])
    suite = suite_named(args.suite, lambda: load_suite(args.suite))
    if args.task_ids:
        tasks = tasks_by_id(suite, args.task_ids)
    else:
        tasks = list(suite.tasks(args.split, limit=args.limit, seed=args.seed))
    selection = task_selection(suite, args, tasks)
    if not tasks:
        raise ValueError(f"suite {args.suite!r} split {args.split!r} has no tasks")
    policy = policy_from_spec(args.policy, args.seed)
    jobs = [RolloutJob(task, harness, seed=args.seed) for harness, task in itertools.product(harnesses, tasks)]
    engine = RolloutEngine(
        policy, max_concurrent=args.concurrent, env_workers=args.workers, backend=args.backend,
        sampling=SamplingParams(temperature=args.temperature, max_new_tokens=limits.max_new_tokens),
        progress=not args.json,
    )
    trajectories, stats = engine.run(jobs)
    if args.out:
        save_jsonl(trajectories, args.out)
    summary = summarize(trajectories)
    summary["tasks"] = selection
    summary["timing"] = stats.to_dict()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        if args.show:
            for t in trajectories:
                print(t.transcript(policy.tokenizer, show_spans=args.spans))
                print()
        for code, s in summary["per_config"].items():
            print(f"{code:<16} {s['passed']}/{s['episodes']} passed  statuses={s['statuses']}")
        print(f"pass_rate: {summary['pass_rate']:.3f} over {summary['episodes']} episodes")
        print(selection_line(selection))
    sys.stdout.flush()
    return 0
