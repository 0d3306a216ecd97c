"""`harnessrl eval` and `harnessrl report`: evaluate a policy or checkpoint; (re)build reports."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from harnessrl.cli.common import command, harness_set, policy_from_spec, suite_named
from harnessrl.design import DESIGN_KINDS, make_design
from harnessrl.eval.sets import EVAL_SETS, EXTERNAL_PREFIX, resolve_eval_set
from harnessrl.external.run import ExternalConfig
from harnessrl.harness.harness import HarnessLimits
from harnessrl.harness.limits import resolve_limits
from harnessrl.harness.registry import default_space
from harnessrl.policy import POLICY_SPECS
from harnessrl.policy.scripted import SCRIPTED_POLICIES
from harnessrl.rescue.sibling_source import space_neighbours
from harnessrl.rollout.engine import EngineOptions
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.suite import parse_limit, parse_task_ids


def register(subparsers: Any) -> None:
    """Adds the `eval` and `report` sub-commands."""
    p = command(subparsers, "eval", example="harnessrl eval --policy oracle --configs held-out,out-of-space --limit 4",
        help="evaluate a policy or a run's checkpoint: Pass@1, pass@k, Avg@k, behaviours, report",
        description="Runs every test task k times under every harness of the evaluation set and writes "
        "results.json, trajectories.jsonl and report/ (HTML + Markdown) to --out.",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--checkpoint", default=None, help="a run folder (newest checkpoint) or one checkpoint folder")
    who.add_argument("--policy", default=None, help=f"policy spec (default embedded): {POLICY_SPECS}")
    p.add_argument("--configs", default="held-out,out-of-space",
                   help=f"evaluation set: comma-separated parts of {', '.join(EVAL_SETS)}, codes, "
                   "out-of-space names, ext:<name>, pool:DIR (every member of a sibling pool) or DIR#ID")
    p.add_argument("--design", default=None, choices=DESIGN_KINDS,
                   help="the training design `train` and distances refer to (default: the run's, else orthogonal)")
    p.add_argument("--held-out", type=int, default=18, help="held-out in-space configurations (paper: 18)")
    p.add_argument("--suite", default=None, help="task suite name or task file (default: the run's, else workspace)")
    p.add_argument("--split", default="test", help="task split")
    p.add_argument("--limit", type=parse_limit, default=16, help="test tasks per harness ('all' for every task of the split)")
    p.add_argument("--external-limit", type=int, default=None, metavar="N",
                   help="ext:<agent> targets run on the first N of those tasks only (an agent run costs tens of "
                   "seconds on a CPU; default: all of them)")
    p.add_argument("--tiers", type=lambda v: [int(t) for t in v.split(",")], default=None, metavar="1,2",
                   help="task tiers (default: the checkpoint run's, else all)")
    p.add_argument("--families", type=lambda v: v.split(","), default=None, metavar="files,text",
                   help="task families (default: the checkpoint run's, else all)")
    p.add_argument("--task-ids", type=parse_task_ids, default=None,
                   help="evaluate exactly these comma-separated task ids (a,b,c) instead of a sample")
    p.add_argument("--k", type=int, default=1, help="runs per task (pass@k and Avg@k; Harness-S: 3)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: 0 for k=1, 0.7 for k>1 so that runs differ)")
    p.add_argument("--max-turns", type=int, default=None, help="turn limit per episode")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn")
    p.add_argument("--context-tokens", type=int, default=None, help="context window")
    p.add_argument("--agent-time-limit", type=float, default=ExternalConfig.time_limit_s, metavar="SECONDS",
                   help="ext:<name> targets: wall-clock seconds per agent run (as `external run --time-limit`);"
                   " it is killed at the limit and scored as it is")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out draw, task order and run r (seed + r)")
    p.add_argument("--concurrent", type=int, default=EngineOptions.max_concurrent, help="episodes in flight")
    p.add_argument("--workers", type=int, default=EngineOptions.env_workers, help="threads for sandbox steps")
    p.add_argument("--backend", default="auto", help="sandbox backend: auto, bwrap, unshare, none")
    p.add_argument("--device", default="auto", help="torch device of --checkpoint and embedded / hf: policies")
    p.add_argument("--out", default=None, help="output folder (default: evals/<name>-<time>)")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of a table")
    p.add_argument("--route", default=None, metavar="H0|pool:DIR",
                   help="Rank-1 routing (Harness-S): per task, roll out under the router's first choice among H0 "
                   "and its siblings, against H0 itself on the same tasks and seeds; replaces the --configs "
                   "evaluation. A configuration code routes over its neighbours in the space; pool:DIR (or a pool "
                   "folder) over the pool's members, its H0 included")
    p.add_argument("--route-radius", type=int, default=1, help="siblings of a code --route: neighbours up to this distance")
    p.add_argument("--router", default="validation", choices=("validation", "profile", "random"),
                   help="how --route ranks: paired validation margins over H0, behaviour profiles voted on by LLMs "
                   "(--route-voter), or at random (the ablation)")
    p.add_argument("--route-validation", type=int, default=8,
                   help="paired validation tasks (train split) the validation and profile routers are anchored on")
    p.add_argument("--route-voter", action="append", default=None, metavar="MODEL@URL",
                   help="profile routing: a voter, an OpenAI-compatible endpoint (repeat for several voters; "
                   "`harnessrl serve` of a local model works); the first also writes the profiles")
    p.set_defaults(func=run_eval)

    r = command(subparsers, "report", example="harnessrl report runs/quick-20261130-101500",
        help="(re)build the HTML and Markdown report of a run, eval or experiment folder",
        description="Writes DIR/report/index.html and DIR/report/report.md from the files in DIR.",
    )
    r.add_argument("dir", help="a training run, an `harnessrl eval` output, or an experiment folder")
    r.set_defaults(func=run_report)


def load_policy(args: argparse.Namespace, default: str) -> tuple[Any, str, dict[str, Any]]:
    """Returns (policy, its spec, the run's config) from ``--checkpoint`` or ``--policy``
    (``default`` when neither is given)."""
    if args.checkpoint:
        from harnessrl.rl.checkpoint import load_checkpoint_policy

        policy, run_config = load_checkpoint_policy(args.checkpoint, device=args.device)
        return policy, args.checkpoint, run_config
    spec = args.policy or default
    local_model = spec in ("embedded", "hf") or spec.startswith("hf:")
    return policy_from_spec(spec, args.seed, **({"device": args.device} if local_model else {})), spec, {}


def run_eval(args: argparse.Namespace) -> int:
    from harnessrl.eval.evaluate import evaluate
    from harnessrl.eval.report import write_eval_report
    from harnessrl.tasks.suite import select_tasks
    from harnessrl.trajectory import save_jsonl

    policy, spec, run_config = load_policy(args, default="embedded")
    run_config = {**run_config, **{name: value for name, value in (("tiers", args.tiers), ("families", args.families))
                                   if value is not None}}
    # The options, else the run's, else the defaults (scripted policies get room for gold commands).
    limits = resolve_limits(vars(args), run_config, bytewise=spec in SCRIPTED_POLICIES)
    if args.route:
        return run_routed_eval(args, policy, spec, limits, run_config)
    design = make_design(
        default_space(), args.design or run_config.get("design", "orthogonal"),
        n=run_config.get("design_n"), seed=run_config.get("seed", 0), base=run_config.get("base_harness"),
    )
    targets = harness_set(args.configs, lambda: resolve_eval_set(args.configs, design, held_out=args.held_out, seed=args.seed))
    suite = args.suite or run_config.get("suite", "workspace")
    tasks = suite_named(suite, lambda: select_tasks(suite, args.split, args.limit, args.seed, run_config.get("tiers"),
                                                    run_config.get("families"), task_ids=args.task_ids))
    temperature = args.temperature if args.temperature is not None else (0.0 if args.k == 1 else 0.7)
    if args.external_limit is not None and args.external_limit < 1:
        raise SystemExit(f"harnessrl eval: --external-limit must be >= 1, got {args.external_limit}")
    external_tasks = None if args.external_limit is None else tasks[:args.external_limit]
    external_runs = sum(t.name.startswith(EXTERNAL_PREFIX) for t in targets) * len(external_tasks or tasks) * args.k
    finished: list[Any] = []

    def report_external(t: Any) -> None:
        # One line per agent run as it ends (minutes each with a real model), as `external run`.
        from harnessrl.cli.external import run_line

        finished.append(t)
        print(f"[{time.strftime('%H:%M:%S')}] {len(finished)}/{external_runs} {run_line(t)}", file=sys.stderr, flush=True)

    result = evaluate(
        policy, targets, tasks, k=args.k, design=design,
        settings=RolloutSettings(limits=limits, temperature=temperature, seed=args.seed, backend=args.backend,
                                 max_concurrent=args.concurrent, env_workers=args.workers, progress=not args.json), agent_time_limit_s=args.agent_time_limit, on_external=report_external,
        external_tasks=external_tasks,
    )
    name = Path(args.checkpoint).name if args.checkpoint else spec.replace(":", "-").replace("/", "-")[:40]
    out = Path(args.out or f"evals/{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    results = result.to_dict()
    results["meta"] = {
        "policy": policy.name, "source": spec, "configs": args.configs, "design": design.kind,
        "suite": suite, "split": args.split, "tasks": len(tasks), "k": args.k, "temperature": temperature,
        "seed": args.seed, "model": run_config.get("model") or policy.name, "targets": [t.name for t in targets],
        "external_tasks": None if external_tasks is None else len(external_tasks),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    save_jsonl(result.trajectories, out / "trajectories.jsonl")
    report = write_eval_report(out, results, result.trajectories, run_config.get("model"))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'set':<22} {'Pass@1':>7} {'pass@k':>7} {'Avg@k':>7} {'units':>6}")
        rows = [("overall", results), *sorted(results["per_group"].items())]
        for label, s in rows:
            pk = "n/a" if s["pass_at_k"] is None else f"{100 * s['pass_at_k']:.1f}"
            print(f"{label:<22} {100 * s['pass_at_1']:>7.1f} {pk:>7} {100 * s['avg_at_k']:>7.1f} {s['tasks']:>6}")
        print(f"results: {out / 'results.json'}\nreport:  {report}")
    sys.stdout.flush()
    return 0


def route_members(route: str, radius: int = 1) -> tuple[str, list[str]]:
    """Returns (H0, siblings) of ``eval --route``: a configuration code and its neighbours in
    the space up to ``radius``, or a pool (``pool:DIR`` or a folder with ``pool.yaml``) and its
    members as ``DIR#ID`` names, H0 first."""
    folder = route.removeprefix("pool:")
    if route.startswith("pool:") or (Path(folder) / "pool.yaml").exists():
        from harnessrl.harness.siblings.patch import BASE_ID
        from harnessrl.rescue.pool import Pool
        from harnessrl.rescue.sibling_source import pool_siblings

        pool = Pool.load(folder)
        return pool.member_name(BASE_ID), pool_siblings(pool)
    space = default_space()
    try:
        h0 = space.parse(route).code
    except ValueError as exc:
        raise ValueError(f"--route {route!r}: not a configuration code of the space ({exc}) nor a pool folder "
                         "(pool:DIR, a folder with pool.yaml)") from None
    return h0, space_neighbours(h0, radius)


def run_routed_eval(args: argparse.Namespace, policy: Any, spec: str, limits: HarnessLimits,
                    run_config: dict[str, Any]) -> int:
    """`eval --route H0`: Rank-1 routing against H0 on the same test tasks and seeds."""
    from harnessrl.eval.routing import routed_evaluation
    from harnessrl.harness.harness import Harness
    from harnessrl.rescue.rank1 import paired_validation, run_with
    from harnessrl.rescue.router import Evidence
    from harnessrl.rescue.routing import make_router
    from harnessrl.tasks.suite import select_tasks
    from harnessrl.trajectory import save_jsonl

    h0, siblings = route_members(args.route, args.route_radius)
    if args.router == "profile" and not args.route_voter:
        raise ValueError("--router profile needs at least one voter: --route-voter MODEL@URL (an OpenAI-compatible "
                         "endpoint, e.g. `harnessrl serve` of a local model); or use --router validation or random")
    # Before any rollout: an unreachable voter stops the run at once.
    router = make_router(args.router, seed=args.seed, track=[h0], voters=args.route_voter or ())
    suite = args.suite or run_config.get("suite", "workspace")
    tiers, families = run_config.get("tiers"), run_config.get("families")
    tasks = suite_named(suite, lambda: select_tasks(suite, args.split, args.limit, args.seed, tiers, families,
                                                    task_ids=args.task_ids))
    temperature = args.temperature if args.temperature is not None else (0.0 if args.k == 1 else 0.7)
    settings = RolloutSettings(limits, temperature, backend=args.backend, max_concurrent=args.concurrent, env_workers=args.workers)
    anchored = 0
    if router.anchored:
        validation = select_tasks(suite, "train", args.route_validation, args.seed + 1, tiers, families)
        runs: dict[str, dict[str, Any]] = {}
        record = paired_validation(run_with(policy, settings), lambda name: Harness.named(name, limits),
                                   [h0, *siblings], validation, lambda i: args.seed + i, keep=runs)
        anchored = len(validation) * (1 + len(siblings))
        router.anchor(Evidence(record, runs, validation, {h0: siblings}))
    label = Path(h0.split("#", 1)[0]).name if "#" in h0 else h0
    out = Path(args.out or f"evals/route-{label}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    result = routed_evaluation(policy, router, h0, siblings, tasks, args.k, settings, seed=args.seed,
                               on_trajectories=lambda trajectories: save_jsonl(trajectories, out / "trajectories.jsonl"))
    result["meta"] = {"policy": policy.name, "source": spec, "suite": suite, "split": args.split, "k": args.k,
                      "temperature": temperature, "seed": args.seed, "validation_episodes": anchored,
                      "model": run_config.get("model")}
    result.update(router.report(h0))
    (out / "routing.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        k = args.k
        print(f"Rank-1 routing over {h0} and {len(siblings)} siblings ({router.name} router), {len(tasks)} tasks x {k}")
        print(f"{'':<12} {'Pass@1':>7} {f'Pass@{k}':>7} {f'Avg@{k}':>7}")
        for label, key in (("under H0", "under_h0"), ("Rank-1", "under_rank1"), ("margin", "margin")):
            s = result[key]
            cells = ["n/a" if s[m] is None else f"{100 * s[m]:.1f}" for m in ("pass_at_1", "pass_at_k", "avg_at_k")]
            print(f"{label:<12} {cells[0]:>7} {cells[1]:>7} {cells[2]:>7}")
        print(f"H0 is Rank-1 for {100 * result['h0_rank1_share']:.1f}% of tasks; chosen: {result['rank1_counts']}")
        if "votes" in result:
            v = result["votes"]
            print(f"profile votes: {v['asked']} asked, {v['malformed']} malformed (ignored); profiles: "
                  f"{v['profiles_written']} written, {v['profiles_malformed']} malformed (left empty)")
        print(f"results: {out / 'routing.json'}")
    sys.stdout.flush()
    return 0


def run_report(args: argparse.Namespace) -> int:
    from harnessrl.eval.report import write_eval_report, write_run_report

    folder = Path(args.dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder; pass a run, eval or experiment folder")
    if (folder / "experiment.json").exists():
        from harnessrl.experiment import write_experiment_report

        path = write_experiment_report(folder)
    elif (folder / "config.json").exists():
        path = write_run_report(folder)
    elif (folder / "results.json").exists():
        path = write_eval_report(folder)
    else:
        raise FileNotFoundError(
            f"{folder}: not a run (config.json), an eval output (results.json) or an experiment (experiment.json)"
        )
    print(path)
    return 0
