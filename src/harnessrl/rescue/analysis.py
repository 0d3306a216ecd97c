"""Pool analysis, the shape of Harness-S Figures 1 and 5, for one policy on one task set.

With N members (H0 included), each member runs every task once; H0 runs N times
(seeds ``seed .. seed + N - 1``) and its first run is the reference. Then, per sibling:
the failures of H0 it fixes and the successes it regresses (locality); the oracle union
(a task counts when any member solves it) against H0 resampled with the same N rollouts
per task (complementarity); and the overlap of the siblings' repair sets. With a journal the
episodes are kept as they end, and a run cut short resumes where it stopped.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harnessrl.harness.siblings import BASE_ID
from harnessrl.policy.base import Policy
from harnessrl.rescue.pool import Pool
from harnessrl.rescue.runs import finish_journal, open_journal, pass_table, run_grid
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task


def jaccard(a: set[str], b: set[str]) -> float | None:
    """Returns |a & b| / |a | b|, or None when both are empty."""
    return len(a & b) / len(a | b) if a | b else None


def coverage_analysis(member_tables: dict[str, dict[str, bool]], h0_runs: Sequence[dict[str, bool]]) -> dict[str, Any]:
    """Returns the analysis of pass tables: ``member_tables`` (one run per member, H0's being
    ``h0_runs[0]``) and ``h0_runs`` (H0 resampled, as many runs as members)."""
    tasks = sorted(h0_runs[0])
    reference = h0_runs[0]
    h0_failed = {t for t in tasks if not reference[t]}
    rows, repairs = [], {}
    for sibling, table in member_tables.items():
        if sibling == BASE_ID:
            continue
        fixed = {t for t in tasks if table.get(t) and not reference[t]}
        regressed = {t for t in tasks if reference[t] and not table.get(t)}
        repairs[sibling] = fixed
        rows.append({"sibling": sibling, "passed": sum(bool(table.get(t)) for t in tasks), "fixed": len(fixed),
                     "regressed": len(regressed), "net": len(fixed) - len(regressed),
                     "fixed_tasks": sorted(fixed), "regressed_tasks": sorted(regressed)})
    union = {t for t in tasks if any(table.get(t) for table in member_tables.values())}
    resampled = {t for t in tasks if any(run.get(t) for run in h0_runs)}
    pairs = [(a, b, jaccard(repairs[a], repairs[b])) for a, b in itertools.combinations(sorted(repairs), 2)]
    overlaps = [j for _, _, j in pairs if j is not None]
    repaired_by = {t: [s for s, fixed in repairs.items() if t in fixed] for t in sorted(h0_failed)}
    best = max(rows, key=lambda r: r["passed"], default=None)
    return {
        "tasks": len(tasks), "members": len(member_tables), "rollouts_per_task": len(h0_runs),
        "h0_passed": sum(reference.values()), "siblings": rows,
        "union_passed": len(union), "h0_resampled_passed": len(resampled),
        "best_single": {"sibling": best["sibling"], "passed": best["passed"]} if best else None,
        "h0_failures": len(h0_failed),
        "repaired_by_any": sum(1 for s in repaired_by.values() if s),
        "repaired_by_two_or_more": sum(1 for s in repaired_by.values() if len(s) >= 2),
        "mean_repair_overlap": round(sum(overlaps) / len(overlaps), 4) if overlaps else None,
        "overlap_pairs": [{"a": a, "b": b, "jaccard": None if j is None else round(j, 4)} for a, b, j in pairs],
    }


def analyze_pool(pool: Pool, policy: Policy, tasks: Sequence[Task], settings: RolloutSettings,
                 journal: str | Path | None = None, policy_source: str | None = None) -> dict[str, Any]:
    """Runs the pool analysis (see the module docstring); returns it as a dict.

    ``journal``: a JSONL file that keeps every episode as it ends; an analysis of the same pool,
    policy, tasks and settings resumes from it (``wall_time_s`` then counts this sitting only);
    another one replaces it once it finished and is refused while it has not. ``policy_source``
    says what the policy was loaded from (a checkpoint folder or a policy spec; default its
    name), so that two checkpoints are never taken for one."""
    started = time.perf_counter()
    harnesses = list(pool.harnesses(settings.limits))
    siblings = [(key, h) for key, h in harnesses if key != BASE_ID]
    h0 = [(key, h) for key, h in harnesses if key == BASE_ID]
    if journal is not None:
        journal = open_journal(journal, {
            "pool": [m.id for m in pool.members], "base": pool.base, "policy": policy_source or policy.name,
            "tasks": [t.id for t in tasks], "temperature": settings.temperature, "top_p": settings.top_p,
            "seed": settings.seed, "max_new_tokens": settings.max_new_tokens, "limits": asdict(settings.limits)})
    member_runs = run_grid(policy, siblings, tasks, settings, runs=1, journal=journal)
    h0_trajectories = run_grid(policy, h0, tasks, settings, runs=len(harnesses), journal=journal)[BASE_ID]
    if journal is not None:
        finish_journal(journal)
    h0_runs = [pass_table([t for t in h0_trajectories if t.seed == settings.seed + r]) for r in range(len(harnesses))]
    tables = {BASE_ID: h0_runs[0], **{key: pass_table(ts) for key, ts in member_runs.items()}}
    analysis = coverage_analysis(tables, h0_runs)
    analysis.update(pool=str(pool.folder), base=pool.base, policy=policy.name, task_ids=[t.id for t in tasks],
                    temperature=settings.temperature,
                    seed=settings.seed, wall_time_s=round(time.perf_counter() - started, 2))
    return analysis


def render_analysis(analysis: dict[str, Any]) -> str:
    """Returns the analysis as Markdown."""
    n = analysis["tasks"]
    lines = [
        f"# Pool analysis: {analysis.get('pool', '')}",
        "",
        f"H0 {analysis.get('base', '')}, policy {analysis.get('policy', '')}, {n} tasks, "
        f"{analysis['members']} members, temperature {analysis.get('temperature')}.",
        "",
        "| sibling | passed | fixed (H0 failures) | regressed (H0 successes) | net |",
        "|---|---|---|---|---|",
        f"| H0 | {analysis['h0_passed']}/{n} | | | |",
    ]
    lines += [f"| {r['sibling']} | {r['passed']}/{n} | {r['fixed']} | {r['regressed']} | {r['net']:+d} |"
              for r in analysis["siblings"]]
    best = analysis["best_single"]
    overlap = analysis["mean_repair_overlap"]
    lines += [
        "",
        f"- Oracle union of the pool: {analysis['union_passed']}/{n} tasks; H0 resampled with the same "
        f"{analysis['rollouts_per_task']} rollouts per task: {analysis['h0_resampled_passed']}/{n}.",
        f"- Best single sibling: {best['sibling']} with {best['passed']}/{n}." if best else "- No siblings.",
        f"- H0 failures repaired by any sibling: {analysis['repaired_by_any']} of {analysis['h0_failures']}; "
        f"by two or more: {analysis['repaired_by_two_or_more']}.",
        f"- Mean pairwise overlap (Jaccard) of repair sets: {'n/a' if overlap is None else f'{overlap:.2f}'}.",
    ]
    if "wall_time_s" in analysis:
        lines.append(f"- Wall time: {analysis['wall_time_s']} s.")
    return "\n".join(lines) + "\n"


def write_analysis(analysis: dict[str, Any], out: str | Path) -> Path:
    """Writes ``analysis.json`` and ``analysis.md`` to ``out``; returns the Markdown path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(analysis, indent=2), encoding="utf-8")
    path = out / "analysis.md"
    path.write_text(render_analysis(analysis), encoding="utf-8")
    return path
