"""Directional harness evolution, the offline part of Harness-S (Algorithm 1):

    H0 rollouts: G per training task under the frozen start policy
    for round r = 1..R:
        for each parent P:
            diagnose   P's failures -> root causes (diagnoser)
            edit       candidates, each for 2-3 related causes (editor)
            validate   static: the patch applies, the oracle passes a few tasks under it;
                       local: on <= V tasks (P's target failures, then P's successes as
                       controls) it fixes >= 1 target and breaks <= budget controls
        select     up to B valid children maximizing joint coverage |U V(H)| (select.py)
        pool       every valid child joins the pool with its validation record

A round is written when it is complete (children, records, ``evolution.json``), so an
interrupted run resumes at the first unfinished round; given the same options and seed it
makes the same pool.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harnessrl.harness.siblings import BASE_ID, Sibling, build, save_sibling
from harnessrl.policy.base import Policy
from harnessrl.rescue.check import check_siblings
from harnessrl.rescue.diagnose import Diagnoser, OfflineDiagnoser
from harnessrl.rescue.editors import Candidate, Editor, RuleEditor
from harnessrl.rescue.pool import Pool, ValidationRecord
from harnessrl.rescue.runs import pass_rate, pass_table, run_grid
from harnessrl.rescue.select import select_parents
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task
from harnessrl.tasks.suite import load_suite
from harnessrl.trajectory import Trajectory, save_jsonl

STATE_FILE = "evolution.json"
Log = Callable[[str], None]


@dataclass(frozen=True)
class EvolutionConfig:
    """The options of one evolution (all of them but ``rounds`` must match to resume)."""

    base: str = "S0-T1-O1-C0-W0"
    rounds: int = 3  # Harness-S: 3 rounds on AppWorld
    parents: int = 4  # B, parents kept per round
    group: int = 1  # G, rollouts per task when diagnosing (any of G passing counts as solved)
    validate_tasks: int = 30  # local evaluation of a child: at most this many tasks
    regression_budget: int = 0  # control successes a child may break
    candidates_per_parent: int = 4
    oracle_tasks: int = 2  # static check: tasks the oracle must pass under a child
    suite: str = "workspace"
    split: str = "train"
    tasks: int = 24  # training tasks diagnosed
    seed: int = 0
    families: tuple[str, ...] = ()  # only tasks of these families (empty: all)
    tiers: tuple[int, ...] = ()  # only tasks of these tiers (empty: all)

    def __post_init__(self) -> None:
        for name in ("rounds", "parents", "group", "validate_tasks", "candidates_per_parent", "tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"evolution option {name} must be >= 1, got {getattr(self, name)}")


def _validation_tasks(targets: Sequence[str], controls: Sequence[str], limit: int) -> list[str]:
    """Returns the child's local evaluation set: target failures first (at most half when there
    are controls), then controls, ``limit`` in all."""
    n_targets = min(len(targets), max(limit - len(controls), (limit + 1) // 2))
    chosen = list(targets[:n_targets])
    return chosen + list(controls[: limit - len(chosen)])


class Evolution:
    """One evolution run in a pool folder (see the module docstring)."""

    def __init__(self, out: Path, config: EvolutionConfig, policy: Policy, settings: RolloutSettings,
                 diagnoser: Diagnoser | None = None, editor: Editor | None = None, log: Log | None = None) -> None:
        self.out, self.config, self.policy, self.settings = Path(out), config, policy, settings
        self.diagnoser = diagnoser or OfflineDiagnoser()
        self.editor = editor or RuleEditor()
        self.log = log or (lambda line: None)
        self.tasks = [t for t in load_suite(config.suite).tasks(config.split, seed=config.seed)
                      if (not config.families or t.family in config.families)
                      and (not config.tiers or t.tier in config.tiers)][: config.tasks]
        if not self.tasks:
            raise ValueError(f"suite {config.suite!r} split {config.split!r} has no tasks of families "
                             f"{list(config.families) or 'any'} and tiers {list(config.tiers) or 'any'}")
        self.by_id = {t.id: t for t in self.tasks}

    # -- state -------------------------------------------------------------------------
    def _open(self) -> tuple[Pool, dict[str, Any]]:
        path = self.out / STATE_FILE
        # JSON has no tuples: compare as the state file stores them
        wanted = json.loads(json.dumps({k: v for k, v in asdict(self.config).items() if k != "rounds"}))
        if not path.is_file():
            pool = Pool.create(self.out, self.config.base, "evolve", meta={"evolution": asdict(self.config)})
            return pool, {"config": wanted, "h0": None, "rounds": [], "wall_time_s": 0.0}
        state = json.loads(path.read_text(encoding="utf-8"))
        if state["config"] != wanted:
            changed = sorted(k for k in wanted if state["config"].get(k) != wanted[k])
            raise ValueError(f"{self.out} holds an evolution with other options ({', '.join(changed)}); "
                             "resume with the same options or choose a new --out")
        pool = Pool.load(self.out)
        pool.frozen = False  # more rounds may follow
        return pool, state

    def _save(self, state: dict[str, Any]) -> None:
        (self.out / STATE_FILE).write_text(json.dumps(state, indent=2), encoding="utf-8")

    # -- measuring ---------------------------------------------------------------------
    def _run(self, sibling: Sibling, tasks: Sequence[Task], runs: int) -> list[Trajectory]:
        harness = build(sibling, self.settings.limits)
        return run_grid(self.policy, [(sibling.id, harness)], tasks, self.settings, runs=runs).get(sibling.id, [])

    def _validate(self, child: Sibling, candidate: Candidate, parent_table: dict[str, bool],
                  failed_causes: dict[str, list[str]], h0: dict[str, bool]) -> tuple[ValidationRecord | None, str]:
        oracle_sample = self.tasks[: self.config.oracle_tasks]
        compliance = check_siblings([child], oracle_sample, self.settings)[0]
        if not compliance.ok:
            return None, "non-compliant: " + "; ".join(compliance.problems)[:300]
        targets = [t for t, ok in parent_table.items() if not ok and set(failed_causes.get(t, [])) & set(candidate.targets)]
        controls = [t for t, ok in parent_table.items() if ok]
        chosen = _validation_tasks(targets, controls, self.config.validate_tasks)
        table = pass_table(self._run(child, [self.by_id[t] for t in chosen], self.config.group))
        record = ValidationRecord(
            child.id, child.parent, chosen, {t: table.get(t, False) for t in chosen},
            parent_passed={t: parent_table[t] for t in chosen}, h0_passed={t: h0[t] for t in chosen if t in h0},
            targets=[t for t in targets if t in chosen],
        )
        broken = len(record.broken_vs_parent)
        if not record.target_fixed:
            record.valid, record.reason = False, f"fixes none of its {len(record.targets)} target failures"
        elif broken > self.config.regression_budget:
            record.valid, record.reason = False, f"breaks {broken} control successes (budget {self.config.regression_budget})"
        return record, "valid" if record.valid else record.reason

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        pool, state = self._open()
        h0_sibling = pool.h0
        if state["h0"] is None:
            trajectories = self._run(h0_sibling, self.tasks, self.config.group)
            save_jsonl(trajectories, self.out / "rounds" / "H0.jsonl")
            state["h0"] = pass_table(trajectories)
            self._save(state)
        h0: dict[str, bool] = state["h0"]
        self.log(f"H0 {pool.base}: {sum(h0.values())}/{len(h0)} training tasks solved")
        parents = state["rounds"][-1]["selected"] if state["rounds"] else [BASE_ID]
        for round_ in range(len(state["rounds"]) + 1, self.config.rounds + 1):
            if not parents:
                break
            entry = self._round(pool, round_, parents, h0)
            state["rounds"].append(entry)
            self._save(state)
            parents = entry["selected"]
            self.log(f"round {round_}: {entry['valid']} valid of {len(entry['candidates'])} candidates; "
                     f"pool {entry['pool_size']}; parents next {', '.join(parents) or '(none)'}")
        pool.freeze()
        state["wall_time_s"] = round(state.get("wall_time_s", 0.0) + time.perf_counter() - started, 2)
        self._save(state)
        return summarize(pool, state)

    def _round(self, pool: Pool, round_: int, parents: Sequence[str], h0: dict[str, bool]) -> dict[str, Any]:
        rng = random.Random(self.config.seed * 7919 + round_)
        folder = self.out / "rounds" / f"r{round_}"
        known = {s.content_hash for s in pool.members}
        children: list[tuple[Sibling, ValidationRecord]] = []
        log: list[dict[str, Any]] = []
        for parent_id in parents:
            parent = pool.sibling(parent_id)
            trajectories = self._run(parent, self.tasks, self.config.group)
            save_jsonl(trajectories, folder / f"{parent_id}.jsonl")
            parent_table = pass_table(trajectories)
            diagnosis = self.diagnoser.diagnose(trajectories, self.by_id)
            (folder / f"diagnosis-{parent_id}.json").write_text(json.dumps(diagnosis.to_dict(), indent=2), encoding="utf-8")
            failed_causes: dict[str, list[str]] = {}
            for failure in diagnosis.failures:
                failed_causes.setdefault(failure.task_id, []).extend(failure.causes)
            harness = build(parent, self.settings.limits)
            for candidate in self.editor.propose(parent, harness, diagnosis, self.config.candidates_per_parent, rng):
                child = Sibling(f"r{round_}-{len(log) + 1:02d}", pool.base,
                                parent.patch.extended(candidate.edits, candidate.rationale), parent.id, round_)
                item: dict[str, Any] = {"id": child.id, "parent": parent.id, "targets": candidate.targets,
                                        "source": candidate.source, "edits": [e.kind for e in candidate.edits]}
                log.append(item)
                if child.content_hash in known:
                    item["status"] = "duplicate"
                    continue
                known.add(child.content_hash)
                # Every candidate's patch is kept, valid or not: a rejected edit is evidence too
                # (what it targeted, what it broke), and it can be inspected or re-validated.
                item["patch"] = str(save_sibling(child, folder / "candidates" / f"{child.id}.yaml").relative_to(self.out))
                record, item["status"] = self._validate(child, candidate, parent_table, failed_causes, h0)
                if record is not None:
                    item.update(fixed=len(record.target_fixed), broken=len(record.broken_vs_parent),
                                solved=len(record.solved), tasks=len(record.tasks),
                                fixed_tasks=sorted(record.target_fixed), broken_tasks=sorted(record.broken_vs_parent))
                    if record.valid:
                        children.append((child, record))
        covers = {c.id: set(r.solved) for c, r in children}
        selected = select_parents(covers, self.config.parents, {c.id: len(r.broken_vs_h0) for c, r in children})
        for child, record in children:
            pool.add(child)
            pool.save_validation(record)
        return {"round": round_, "parents": list(parents), "candidates": log, "valid": len(children),
                "selected": selected, "coverage": len(set().union(*(covers[c] for c in selected))) if selected else 0,
                "pool_size": len(pool)}


def summarize(pool: Pool, state: dict[str, Any]) -> dict[str, Any]:
    """Returns what an evolution made: pool size per round, parents, H0's training pass rate."""
    return {
        "pool": str(pool.folder), "members": len(pool), "h0_train_pass_rate": round(pass_rate(state["h0"] or {}), 4),
        "rounds": [{k: r[k] for k in ("round", "parents", "valid", "selected", "coverage", "pool_size")}
                   | {"candidates": len(r["candidates"])} for r in state["rounds"]],
        "wall_time_s": state.get("wall_time_s"),
    }


def evolve(out: Path, config: EvolutionConfig, policy: Policy, settings: RolloutSettings,
           diagnoser: Diagnoser | None = None, editor: Editor | None = None, log: Log | None = None) -> dict[str, Any]:
    """Runs (or resumes) an evolution into the pool folder ``out``; returns its summary."""
    return Evolution(out, config, policy, settings, diagnoser, editor, log).run()
