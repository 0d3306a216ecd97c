"""`harnessrl design` and `harnessrl pairing`: print a training design or preview a schedule."""

from __future__ import annotations

import argparse
import json
from typing import Any

from harnessrl.cli.common import command
from harnessrl.design import DESIGN_KINDS, Design, HeldOut, make_design
from harnessrl.harness.registry import default_space
from harnessrl.pairing import STRATEGIES, PairingSchedule


def register(subparsers: Any) -> None:
    """Adds the `design` and `pairing` sub-commands."""
    p = command(subparsers, "design", example="harnessrl design --kind orthogonal --json",
        help="build, verify and print a training design and its held-out set",
        description="Builds a training design over the default harness space (5 factors x 3 "
        "levels), verifies it (strength, Rao bound, balance, Hamming distances) and prints it "
        "with the held-out in-space test set.",
    )
    p.add_argument("--kind", choices=DESIGN_KINDS, default="orthogonal", help="design kind")
    p.add_argument("--n", type=int, default=None, help="size of a random design (default 18)")
    p.add_argument("--seed", type=int, default=0, help="seed for random designs and the held-out draw")
    p.add_argument("--base", default=None, help="base harness H0 code for single/first-order")
    p.add_argument("--held-out", type=int, default=18, help="held-out configurations to draw")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_design)

    q = command(subparsers, "pairing", example="harnessrl pairing --tasks 4 --steps 3 --k 2 --strategy neighbour",
        help="preview a task-harness pairing schedule",
        description="Previews which (task, configuration) pairs each training step rolls out.",
    )
    q.add_argument("--tasks", type=int, default=16, help="number of tasks (ids task-0 ..)")
    q.add_argument("--steps", type=int, default=4, help="steps to preview")
    q.add_argument("--tasks-per-step", type=int, default=None, help="tasks per step (default: min(tasks, 16))")
    q.add_argument("--k", type=int, default=2, help="configurations per task (K)")
    q.add_argument("--strategy", choices=STRATEGIES, default="neighbour", help="pairing strategy")
    q.add_argument("--design", choices=DESIGN_KINDS, default="orthogonal", help="training design")
    q.add_argument("--seed", type=int, default=0, help="schedule seed")
    q.add_argument("--start", type=int, default=0, help="first step to show (resume preview)")
    q.add_argument("--stats", action="store_true", help="also print coverage statistics")
    q.add_argument("--json", action="store_true", help="print a JSON list of steps")
    q.set_defaults(func=run_pairing)


def format_design(design: Design, held_out: HeldOut) -> str:
    """Returns the design table, its verification report and the held-out set as text."""
    space = design.space
    header = ["#", "code", *[f.name for f in space.factors]]
    rows = [
        [str(i), c.code, *[space.factors[j].levels[lv].name for j, lv in enumerate(c.levels)]]
        for i, c in enumerate(design.configs)
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"design: {design.kind} over {space} ({space.size} configurations), {len(design)} runs"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    rep = design.report
    lines.append("")
    lines.append("verification:")
    lines.append(f"  strength            {rep.strength} (target {rep.target_strength})")
    lines.append(f"  Rao bound           N={rep.n_runs} >= {rep.rao_bound}: {rep.meets_rao_bound}")
    lines.append(f"  per-factor balance  {rep.balanced}")
    for letter, counts in rep.level_counts_per_factor.items():
        lines.append(f"    {letter}: " + ", ".join(f"level {lv}: {c}" for lv, c in counts.items()))
    lines.append(f"  min Hamming         {rep.min_hamming}")
    lines.append(f"  mean Hamming        {rep.mean_hamming:.2f}")
    hist = ", ".join(f"d={d}: {c}" for d, c in rep.nearest_neighbour_hist.items())
    lines.append(f"  nearest neighbour   {hist}")
    lines.append("")
    lines.append(f"held-out in-space test set ({len(held_out.configs)} configurations, seed {held_out.seed}):")
    for c, d in zip(held_out.configs, held_out.distance_to_train, strict=True):
        lines.append(f"  {c.code}  distance to nearest training config: {d}")
    return "\n".join(lines)


def run_design(args: argparse.Namespace) -> int:
    space = default_space()
    design = make_design(space, args.kind, n=args.n, seed=args.seed, base=args.base)
    held_out = design.held_out(n=args.held_out, seed=args.seed)
    if args.json:
        print(json.dumps(design.to_dict(held_out), indent=2))
    else:
        print(format_design(design, held_out))
    return 0


def run_pairing(args: argparse.Namespace) -> int:
    if args.tasks < 1 or args.steps < 0:
        raise ValueError("--tasks must be >= 1 and --steps >= 0")
    space = default_space()
    design = make_design(space, args.design, seed=args.seed)
    task_ids = [f"task-{i}" for i in range(args.tasks)]
    per_step = args.tasks_per_step or min(args.tasks, 16)
    schedule = PairingSchedule(task_ids, design.configs, per_step, args.k, args.strategy, args.seed)
    batches = list(schedule.steps(args.steps, args.start))
    if args.json:
        out: Any = [[{"task": p.task, "config": p.config.code} for p in b] for b in batches]
        if args.stats:
            out = {"steps": out, "stats": schedule.statistics(args.steps, args.start).to_dict()}
        print(json.dumps(out, indent=2))
        return 0
    for t, batch in enumerate(batches, start=args.start):
        print(f"step {t}:")
        for p in batch:
            role = "anchor" if p.slot == 0 else f"neighbour {p.slot} of {p.anchor.code}"
            print(f"  {p.task:<12} {p.config.code}  ({role}, d={p.config.hamming(p.anchor)})")
    if args.stats:
        stats = schedule.statistics(args.steps, args.start)
        print(f"\ncoverage over {stats.n_steps} steps ({stats.n_pairs} pairs):")
        for code in design.codes:
            print(f"  {code}: {stats.config_counts.get(code, 0)}")
        print(f"  factor-pair cell imbalance (max/min): {stats.cell_imbalance():.3f}")
    return 0
