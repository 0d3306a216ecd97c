"""`harnessrl pool`: build, show, check, evolve and analyze sibling pools (Harness-S)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harnessrl.cli.common import command, suite_named
from harnessrl.design import DESIGN_KINDS
from harnessrl.policy import POLICY_SPECS
from harnessrl.rollout.engine import EngineOptions

DEFAULT_BASE = "S0-T1-O1-C0-W0"


def _run_options(p: argparse.ArgumentParser, limit: int, split: str = "train") -> None:
    p.add_argument("--suite", default="workspace", help="task suite name or task file")
    p.add_argument("--split", default=split, help="task split")
    p.add_argument("--limit", type=int, default=limit, help="tasks")
    p.add_argument("--seed", type=int, default=0, help="seed of the task sample and of run r (seed + r)")
    p.add_argument("--backend", default="auto", help="sandbox backend: auto, bwrap, unshare, none")
    p.add_argument("--concurrent", type=int, default=EngineOptions.max_concurrent, help="episodes in flight")
    p.add_argument("--workers", type=int, default=EngineOptions.env_workers, help="threads for sandbox steps")


def _policy_options(p: argparse.ArgumentParser) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("--policy", default=None, help=f"policy spec: {POLICY_SPECS}")
    who.add_argument("--checkpoint", default=None, help="a training run folder (newest checkpoint) or a checkpoint")
    p.add_argument("--device", default="auto", help="torch device of model policies")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    p.add_argument("--max-turns", type=int, default=None, help="turn limit per episode")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn")
    p.add_argument("--context-tokens", type=int, default=None, help="context window")


def register(subparsers: Any) -> None:
    """Adds the `pool` sub-command and its actions."""
    p = command(subparsers, "pool", example="harnessrl pool from-space --out pools/h0", help="sibling harness pools (Harness-S): from-space, evolve, show, check, analyze",
        description="Builds, shows, checks, evolves and analyzes pools of sibling harnesses of a base H0.",
    )
    actions = p.add_subparsers(dest="pool_command", metavar="ACTION")

    s = command(actions, "from-space", example="harnessrl pool from-space --base S0-T0-O0-C0-W0 --radius 1 --out pools/h0", help="a pool of H0's neighbours in the space (or a design's rows)")
    s.add_argument("--base", default=DEFAULT_BASE, help="H0: an in-space configuration code")
    s.add_argument("--radius", type=int, default=1, help="Hamming radius (1: 10 siblings in the default space)")
    s.add_argument("--design", default=None, choices=DESIGN_KINDS, help="take the rows of this design instead")
    s.add_argument("--out", required=True, help="the new pool folder")
    s.set_defaults(func=run_from_space)

    e = command(actions, "evolve", example="harnessrl pool evolve --base S0-T0-O0-C0-W0 --policy oracle --out pools/evolved", help="directional evolution: diagnose, edit, validate, select (Algorithm 1)")
    e.add_argument("--base", default=DEFAULT_BASE, help="H0: a configuration code or out-of-space name")
    _policy_options(e)
    e.add_argument("--editor", default="rule", choices=("rule", "llm"), help="who writes candidate patches")
    e.add_argument("--diagnoser", default="offline", choices=("offline", "llm"), help="who assigns root causes")
    e.add_argument("--editor-url", default=None, help="OpenAI-compatible base URL of the LLM editor/diagnoser")
    e.add_argument("--editor-model", default=None, help="model name at --editor-url")
    e.add_argument("--rounds", type=int, default=3, help="evolution rounds (paper: 3)")
    e.add_argument("--parents", type=int, default=4, help="parents kept per round, B (paper: 4)")
    e.add_argument("--group", type=int, default=1, help="rollouts per task when diagnosing, G")
    e.add_argument("--validate-tasks", type=int, default=30, help="tasks of a child's local evaluation (at most)")
    e.add_argument("--regression-budget", type=int, default=0, help="control successes a child may break")
    e.add_argument("--candidates", type=int, default=4, help="candidates per parent and round")
    e.add_argument("--families", default="", help="comma-separated task families (default: all)")
    e.add_argument("--tiers", default="", help="comma-separated task tiers (default: all)")
    _run_options(e, limit=24)
    e.add_argument("--out", required=True, help="pool folder (resumed when it holds an unfinished evolution)")
    e.set_defaults(func=run_evolve)

    w = command(actions, "show", example="harnessrl pool show pools/h0", help="members, edits and the coverage table")
    w.add_argument("dir", help="pool folder")
    w.add_argument("--json", action="store_true", help="print JSON")
    w.set_defaults(func=run_show)

    c = command(actions, "check", example="harnessrl pool check pools/h0", help="schema and oracle compliance; non-zero exit naming each offender")
    c.add_argument("dir", help="pool folder")
    _run_options(c, limit=3)
    c.set_defaults(func=run_check)

    a = command(actions, "analyze", example="harnessrl pool analyze pools/h0 --policy oracle", help="fixes and regressions per sibling vs H0, union coverage, overlap")
    a.add_argument("dir", help="pool folder")
    _policy_options(a)
    _run_options(a, limit=16, split="test")
    a.add_argument("--families", default=None, help="comma-separated task families (default: those the pool was "
                   "evolved on, else all)")
    a.add_argument("--tiers", default=None, help="comma-separated task tiers (default: those the pool was evolved "
                   "on, else all)")
    a.add_argument("--out", default=None, help="report folder (default: DIR/analysis); it keeps each episode as it "
                   "ends (episodes.jsonl), so the same command resumes an analysis cut short")
    a.add_argument("--json", action="store_true", help="print the analysis JSON")
    a.set_defaults(func=run_analyze)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _tasks(args: argparse.Namespace) -> list:
    from harnessrl.tasks.suite import load_suite

    tasks = list(suite_named(args.suite, lambda: load_suite(args.suite)).tasks(args.split, limit=args.limit, seed=args.seed))
    if not tasks:
        raise ValueError(f"suite {args.suite!r} split {args.split!r} has no tasks")
    return tasks


def _policy_and_settings(args: argparse.Namespace, default_temperature: float) -> tuple[Any, Any, str]:
    """Returns the policy, the rollout settings and what the policy was loaded from (a
    checkpoint's absolute path, else the policy spec)."""
    from harnessrl.cli.eval import load_policy
    from harnessrl.harness.limits import resolve_limits
    from harnessrl.policy.scripted import SCRIPTED_POLICIES
    from harnessrl.rollout.settings import RolloutSettings

    policy, spec, run_config = load_policy(args, default="oracle")
    limits = resolve_limits(vars(args), run_config, bytewise=spec in SCRIPTED_POLICIES)
    temperature = default_temperature if args.temperature is None else args.temperature
    settings = RolloutSettings(limits=limits, temperature=temperature, seed=args.seed, backend=args.backend,
                               max_concurrent=args.concurrent, env_workers=args.workers, progress=not getattr(args, "json", False))
    return policy, settings, str(Path(spec).resolve()) if args.checkpoint else spec


def run_from_space(args: argparse.Namespace) -> int:
    from harnessrl.rescue.pool import from_space

    pool = from_space(args.out, args.base, radius=args.radius, design=args.design)
    print(f"pool {pool.folder}: H0 {pool.base} + {len(pool) - 1} siblings ({pool.source})")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from harnessrl.rescue.pool import Pool
    from harnessrl.rescue.show import pool_summary, render_summary

    summary = pool_summary(Pool.load(args.dir))
    print(json.dumps(summary, indent=2) if args.json else render_summary(summary))
    return 0


def run_check(args: argparse.Namespace) -> int:
    from harnessrl.rescue.check import check_siblings
    from harnessrl.rescue.pool import Pool
    from harnessrl.rollout.settings import RolloutSettings

    pool = Pool.load(args.dir)  # schema: every file parses and matches its hash
    settings = RolloutSettings(seed=args.seed, backend=args.backend, max_concurrent=args.concurrent,
                               env_workers=args.workers, progress=not getattr(args, "json", False))
    results = check_siblings(pool.members, _tasks(args), settings)
    offenders = [r for r in results if not r.ok]
    for r in results:
        status = "ok" if r.ok else "INVALID"
        print(f"{r.sibling:<24} {status:<8} oracle {r.oracle_passed}/{r.oracle_tasks}")
        for problem in r.problems:
            print(f"    {problem}")
    if offenders:
        print(f"{len(offenders)} of {len(results)} members are not compliant: {', '.join(r.sibling for r in offenders)}",
              file=sys.stderr)
        return 1
    print(f"all {len(results)} members compliant")
    return 0


def run_evolve(args: argparse.Namespace) -> int:
    from harnessrl.rescue.evolve import EvolutionConfig, evolve
    from harnessrl.rescue.llm import make_diagnoser, make_editor

    policy, settings, _ = _policy_and_settings(args, default_temperature=0.0 if args.group == 1 else 0.7)
    config = EvolutionConfig(
        base=args.base, rounds=args.rounds, parents=args.parents, group=args.group,
        validate_tasks=args.validate_tasks, regression_budget=args.regression_budget,
        candidates_per_parent=args.candidates, suite=args.suite, split=args.split, tasks=args.limit, seed=args.seed,
        families=tuple(f for f in args.families.split(",") if f), tiers=tuple(int(t) for t in args.tiers.split(",") if t),
    )
    diagnoser = make_diagnoser(args.diagnoser, args.editor_url, args.editor_model)
    editor = make_editor(args.editor, args.editor_url, args.editor_model)
    result = evolve(Path(args.out), config, policy, settings, diagnoser=diagnoser, editor=editor,
                    log=lambda line: print(line, file=sys.stderr))
    print(json.dumps(result, indent=2))
    return 0


def run_analyze(args: argparse.Namespace) -> int:
    from harnessrl.rescue.analysis import analyze_pool, write_analysis
    from harnessrl.rescue.pool import Pool
    from harnessrl.tasks.suite import select_tasks

    pool = Pool.load(args.dir)
    policy, settings, source = _policy_and_settings(args, default_temperature=0.7)
    # The task distribution of the evolution, unless told otherwise: the analysis then measures
    # the pool on unseen tasks of the kind it was built for.
    evolved = (pool.meta or {}).get("evolution", {})
    families = args.families.split(",") if args.families else list(evolved.get("families") or []) or None
    tiers = [int(t) for t in args.tiers.split(",")] if args.tiers else list(evolved.get("tiers") or []) or None
    tasks = suite_named(args.suite, lambda: select_tasks(args.suite, args.split, args.limit, args.seed, tiers, families))
    out = Path(args.out) if args.out else pool.folder / "analysis"
    # Every episode is kept as it ends: the same command resumes an analysis cut short.
    analysis = analyze_pool(pool, policy, tasks, settings, journal=out / "episodes.jsonl", policy_source=source)
    report = write_analysis(analysis, out)
    if args.json:
        print(json.dumps(analysis, indent=2))
    else:
        print(report.read_text(encoding="utf-8"))
    return 0
