"""`harnessrl external list | install | check | run`: real agent programs on our tasks."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from harnessrl.cli.common import agent_named, command, policy_from_spec, suite_named
from harnessrl.external.agents import AGENTS, get_agent
from harnessrl.external.install import (
    AgentInstallError,
    agent_dir,
    agents_root,
    install,
    read_manifest,
)
from harnessrl.external.run import ExternalConfig
from harnessrl.trajectory import Trajectory


def register(subparsers: Any) -> None:
    """Adds the `external` sub-command and its actions."""
    parser = command(subparsers, "external", example="harnessrl external run mini-swe-agent --limit 3",
        help="install and run external agents (mini-swe-agent, Claude Code, Codex, ...)",
        description="External agents run against `harnessrl serve` inside the sandbox and are "
        "scored by the tasks' verifiers. Agents: " + ", ".join(AGENTS) + ".",
    )
    actions = parser.add_subparsers(dest="external_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)

    p = command(actions, "list", example="harnessrl external list --json", help="list the agents and what is installed")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run_list)

    p = command(actions, "install", example="harnessrl external install mini-swe-agent", help="install an agent (pinned version) into the cache")
    p.add_argument("name", metavar="NAME", help=f"one of {', '.join(AGENTS)}, or 'all'")
    p.add_argument("--force", action="store_true", help="install again even when installed")
    p.set_defaults(func=run_install)

    p = command(actions, "check", example="harnessrl external check mini-swe-agent", help="prove an installed agent runs inside the sandbox")
    p.add_argument("name", metavar="NAME", help=f"one of {', '.join(AGENTS)}")
    p.add_argument("--backend", default="auto", help="sandbox backend: auto, bwrap, unshare")
    p.set_defaults(func=run_check)

    p = command(actions, "run", example="harnessrl external run codex --limit 3", help="run an agent on tasks with a policy behind harnessrl serve",
        description="Runs the agent on each task in the sandbox, pointed at harnessrl serve over "
        "the policy, and scores the workspace with the task's verifier.")
    p.add_argument("name", metavar="NAME", help=f"one of {', '.join(AGENTS)}")
    p.add_argument("--policy", default="gold",
                   help="'gold' or 'oracle' (replays each task's gold solution through the agent's"
                   " own tools) or any policy spec of `harnessrl rollout`")
    p.add_argument("--suite", default="workspace", help="task suite name or task file")
    p.add_argument("--split", default="test", help="task split")
    p.add_argument("--limit", type=int, default=3, help="tasks to run")
    p.add_argument("--seed", type=int, default=0, help="seed of the task sample")
    p.add_argument("--k", type=int, default=1, help="runs per task")
    p.add_argument("--model", default="harnessrl", help="model name the agent is told to use")
    p.add_argument("--max-steps", type=int, default=40, help="the agent's own step limit")
    p.add_argument("--time-limit", "--agent-time-limit", dest="time_limit", type=float,
                   default=ExternalConfig.time_limit_s, metavar="SECONDS",
                   help="wall-clock seconds per agent run; it is killed at the limit and scored as it is")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="output limit of requests that name none (default: 1024 on CPU, 4096 on a GPU;"
                   " 65536 for gold replay)")
    p.add_argument("--checkpoint", default=None,
                   help="serve a trained checkpoint (a run folder, a step-* folder or a model folder)"
                   " instead of --policy")
    p.add_argument("--backend", default="auto", help="sandbox backend: auto, bwrap, unshare")
    p.add_argument("--log-dir", default=None, help="keep each run's agent logs here")
    p.add_argument("--out", default=None, help="write trajectories to this JSONL file")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.set_defaults(func=run_run)


def run_line(t: Trajectory) -> str:
    """Returns the line printed for one finished agent run: verdict, task, target, status,
    requests, and for a failed run the agent's exit status and the reason."""
    exit_code = t.metrics.get("exit_code")
    return (f"{'PASS' if t.passed else 'FAIL'} {t.task_id} [{t.config}] status={t.status} requests={len(t.turns)}"
            + (f" exit={exit_code}" if exit_code not in (0, None) and not t.metrics.get("timed_out") else "")
            + (f" error={t.error}" if t.error else ""))


def run_list(args: argparse.Namespace) -> int:
    rows = []
    for name, agent_class in AGENTS.items():
        agent = agent_class()
        manifest = read_manifest(name)
        wanted = agent.plan().specs
        state = "not installed" if manifest is None else (
            "installed" if manifest.get("packages") == wanted else "installed (other version)")
        rows.append({"name": name, "api": agent.api, "packages": wanted, "state": state,
                     "folder": str(agent_dir(name)), "description": agent.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"agents folder: {agents_root()}")
    for row in rows:
        print(f"{row['name']:<16} {row['api']:<10} {row['state']:<26} {' '.join(row['packages'])}")
    return 0


def run_install(args: argparse.Namespace) -> int:
    names = list(AGENTS) if args.name == "all" else [agent_named(args.name).name]
    failed = 0
    for name in names:
        agent = get_agent(name)
        print(f"installing {name} ({' '.join(agent.plan().specs)}) into {agent_dir(name)} ...", file=sys.stderr)
        try:
            manifest = install(name, agent.plan(), force=args.force)
        except AgentInstallError as exc:
            print(f"harnessrl external install: {name}: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"{name} {manifest['version']}: {manifest['folder']}/{manifest['entry']}")
    return 1 if failed else 0


def run_check(args: argparse.Namespace) -> int:
    from harnessrl.external.run import check_agent

    agent_named(args.name)
    try:
        print(check_agent(args.name, backend=args.backend))
    except (AgentInstallError, RuntimeError) as exc:
        print(f"harnessrl external check: {exc}", file=sys.stderr)
        return 1
    return 0


def run_run(args: argparse.Namespace) -> int:
    from harnessrl.cli.rollout import summarize
    from harnessrl.external.gold_replay import GoldReplayPolicy
    from harnessrl.external.run import evaluate_external, policy_for_external
    from harnessrl.tasks.suite import load_suite
    from harnessrl.trajectory import save_jsonl

    agent_named(args.name)
    suite = suite_named(args.suite, lambda: load_suite(args.suite))
    suite.check_split(args.split)
    tasks = list(suite.tasks(args.split, limit=args.limit, seed=args.seed))
    if not tasks:
        raise ValueError(f"suite {args.suite!r} split {args.split!r} has no tasks")
    if args.checkpoint:
        from harnessrl.cli.serve import checkpoint_policy

        policy = checkpoint_policy(args.checkpoint)
    else:
        policy = (GoldReplayPolicy(tasks) if args.policy == "gold"
                  else policy_for_external(policy_from_spec(args.policy, args.seed), tasks))
    config = ExternalConfig(model=args.model, max_steps=args.max_steps, time_limit_s=args.time_limit,
                            backend=args.backend, log_dir=args.log_dir, max_tokens=args.max_tokens)
    total = len(tasks) * args.k
    finished: list[Trajectory] = []

    def report(t: Trajectory) -> None:
        # One line per finished run as it finishes: a run can take minutes with a real model.
        finished.append(t)
        print(f"[{time.strftime('%H:%M:%S')}] {len(finished)}/{total} {run_line(t)}",
              file=sys.stderr if args.json else sys.stdout, flush=True)

    try:
        trajectories = evaluate_external(args.name, policy, tasks, k=args.k, config=config, on_trajectory=report)
    except AgentInstallError as exc:
        print(f"harnessrl external run: {exc}", file=sys.stderr)
        return 1
    if args.out:
        save_jsonl(trajectories, args.out)
    summary = summarize(trajectories)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"pass_rate: {summary['pass_rate']:.3f} over {summary['episodes']} runs")
    return 0
