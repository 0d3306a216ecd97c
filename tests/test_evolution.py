"""Directional evolution measured on a scripted faulty policy: the diagnosis finds its faults,
the rule editor quotes the wrong call, selection maximizes coverage (against brute force),
the evolved siblings target the root causes and raise the pass rate over H0 on held-out
tasks, every member stays oracle-compliant, and a run resumes and repeats by seed."""

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from harnessrl.harness import Harness, HarnessLimits
from harnessrl.harness.siblings import Sibling, ToolHint, load_sibling
from harnessrl.policy.faulty import WRONG_KEY, FaultyPolicy, fault_of
from harnessrl.rescue.check import check_siblings
from harnessrl.rescue.diagnose import OfflineDiagnoser
from harnessrl.rescue.editors import RuleEditor, cluster_causes
from harnessrl.rescue.evolve import EvolutionConfig, evolve
from harnessrl.rescue.pool import Pool
from harnessrl.rescue.runs import pass_rate, pass_table, run_grid
from harnessrl.rescue.select import coverage, exact_cover, greedy_cover, select_parents
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.suite import load_suite

BASE = "S0-T1-O1-C0-W0"
SETTINGS = RolloutSettings(limits=HarnessLimits(max_turns=10, max_new_tokens=16_384, context_tokens=262_144),
                       backend="bwrap", env_workers=2)
TRAIN = list(load_suite("workspace").tasks("train", limit=12, seed=0))
FAULT_CAUSE = {"syntax": "unparseable_output", "never_submit": "never_submitted", "ignore_error": "error_ignored"}


def brute_force_best(covers, budget):
    names = list(covers)
    return max(coverage(list(c), covers) for k in range(budget + 1) for c in itertools.combinations(names, k))


@pytest.mark.parametrize("seed", range(20))
def test_selection_maximizes_coverage_against_brute_force(seed):
    rng = random.Random(seed)
    tasks = [f"t{i}" for i in range(rng.randint(4, 14))]
    covers = {f"c{j}": set(rng.sample(tasks, rng.randint(0, len(tasks) // 2 + 1))) for j in range(rng.randint(1, 9))}
    budget = rng.randint(1, 4)
    best = brute_force_best(covers, budget)
    chosen = select_parents(covers, budget)
    assert len(chosen) <= budget and coverage(chosen, covers) == best
    assert coverage(exact_cover(covers, budget), covers) == best
    assert coverage(greedy_cover(covers, budget), covers) >= (1 - 1 / math.e) * best


def test_greedy_is_not_always_optimal_which_is_why_small_cases_are_exact():
    covers = {"wide": {1, 2, 3, 4}, "left": {1, 2, 5}, "right": {3, 4, 6}}
    assert coverage(greedy_cover(covers, 2), covers) == 5
    assert set(select_parents(covers, 2)) == {"left", "right"}


def test_offline_diagnosis_finds_each_fault_of_the_faulty_policy():
    by_id = {t.id: t for t in TRAIN}
    trajectories = run_grid(FaultyPolicy(), [("H0", Harness.named(BASE, SETTINGS.limits))], TRAIN, SETTINGS)["H0"]
    diagnosis = OfflineDiagnoser().diagnose(trajectories, by_id)
    causes = {f.task_id: f.causes for f in diagnosis.failures}
    for trajectory in trajectories:
        fault = fault_of(by_id[trajectory.task_id])
        if not trajectory.passed and fault in FAULT_CAUSE:
            assert FAULT_CAUSE[fault] in causes[trajectory.task_id], (fault, causes[trajectory.task_id])
        if fault == "none":
            assert trajectory.passed
    supported = diagnosis.supported()
    assert {"unparseable_output", "never_submitted", "error_ignored"} <= set(supported)
    clusters = cluster_causes(diagnosis)
    assert all(1 <= len(c) <= 3 for c in clusters)
    assert any({"never_submitted", "same_action_repeated"} <= set(c) for c in clusters)
    # the rule editor quotes the exact call the policy wrote
    parent = Sibling("H0", BASE)
    candidates = RuleEditor().propose(parent, Harness.named(BASE), diagnosis, 6, random.Random(0))
    hints = [e for c in candidates for e in c.edits if isinstance(e, ToolHint)]
    assert hints and WRONG_KEY in hints[0].text and '"name"' in hints[0].text
    assert all(len(c.targets) <= 3 and set(c.targets) <= set(supported) for c in candidates)


def test_evolution_targets_the_root_causes_and_raises_the_pass_rate_over_h0(tmp_path):
    summary = evolve(tmp_path / "pool", EvolutionConfig(base=BASE, rounds=2, tasks=12, validate_tasks=10),
                     FaultyPolicy(), SETTINGS)
    pool = Pool.load(tmp_path / "pool")
    assert pool.frozen and len(pool) == summary["members"] > 3
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    targeted = {cause for s in pool.members for cause in s.root_causes}
    assert {"unparseable_output", "never_submitted", "error_ignored"} <= targeted
    for sibling in pool.members[1:]:
        record = pool.validation(sibling.id)
        assert record.valid and record.target_fixed and not record.broken_vs_parent
    # measured on held-out tasks the evolution never saw
    test_tasks = list(load_suite("workspace").tasks("test", limit=12, seed=3))
    tables = {key: pass_table(ts) for key, ts in
              run_grid(FaultyPolicy(), list(pool.harnesses(SETTINGS.limits)), test_tasks, SETTINGS).items()}
    h0 = pass_rate(tables["H0"])
    best = max(pass_rate(t) for key, t in tables.items() if key != "H0")
    union = sum(any(t[task.id] for t in tables.values()) for task in test_tasks) / len(test_tasks)
    assert h0 < 0.6 and best > h0 + 0.25 and union >= best
    # every evolved member stays protocol-compliant
    assert all(r.ok for r in check_siblings(pool.members, test_tasks[:2], SETTINGS))


def test_evolution_resumes_and_repeats_by_seed(tmp_path):
    config = EvolutionConfig(base=BASE, rounds=1, tasks=8, validate_tasks=6, candidates_per_parent=2, parents=2)
    evolve(tmp_path / "a", config, FaultyPolicy(), SETTINGS)
    assert len(Pool.load(tmp_path / "a")) > 1
    two = EvolutionConfig(**{**config.__dict__, "rounds": 2})
    resumed = evolve(tmp_path / "a", two, FaultyPolicy(), SETTINGS)
    fresh = evolve(tmp_path / "b", two, FaultyPolicy(), SETTINGS)
    a, b = Pool.load(tmp_path / "a"), Pool.load(tmp_path / "b")
    assert [s.content_hash for s in a.members] == [s.content_hash for s in b.members]
    assert resumed["rounds"] == fresh["rounds"]
    with pytest.raises(ValueError, match=r"other options .*seed"):
        evolve(tmp_path / "a", EvolutionConfig(**{**two.__dict__, "seed": 5}), FaultyPolicy(), SETTINGS)
    assert Path(tmp_path / "a" / "rounds" / "r2").is_dir()
    # every candidate's patch is kept, the rejected ones too, and loads as the child it was
    state = json.loads((tmp_path / "a" / "evolution.json").read_text())
    candidates = [c for r in state["rounds"] for c in r["candidates"] if c.get("status") != "duplicate"]
    assert candidates and all((tmp_path / "a" / c["patch"]).exists() for c in candidates)
    members = {s.id: s.content_hash for s in a.members}
    for c in candidates:
        child = load_sibling(tmp_path / "a" / c["patch"])
        assert child.id == c["id"] and (c["id"] not in members or members[c["id"]] == child.content_hash)
        if "fixed" in c:  # a child that failed the static check has no local evaluation
            assert len(c["fixed_tasks"]) == c["fixed"] and len(c["broken_tasks"]) == c["broken"]
