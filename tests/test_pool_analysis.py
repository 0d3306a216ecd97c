"""Pool analysis on a from-space pool and the scripted faulty policy: per-sibling fixes and
regressions against H0 (locality), the oracle union against H0 resampled with the same
rollouts (complementarity), overlap of repair sets, and the `pool analyze` command."""

import json
from dataclasses import replace

import pytest

from harnessrl.cli import main
from harnessrl.harness import HarnessLimits
from harnessrl.policy.faulty import FaultyPolicy, fault_of
from harnessrl.rescue.analysis import coverage_analysis, jaccard
from harnessrl.rescue.pool import from_space
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.suite import load_suite

BASE = "S0-T1-O1-C0-W0"


def test_coverage_analysis_counts_fixes_regressions_union_and_overlap():
    h0 = [{"a": True, "b": False, "c": False, "d": False}, {"a": True, "b": True, "c": False, "d": False},
          {"a": False, "b": False, "c": False, "d": False}]
    members = {"H0": h0[0], "s1": {"a": False, "b": True, "c": True, "d": False}, "s2": {"a": True, "b": False, "c": True, "d": False}}
    analysis = coverage_analysis(members, h0)
    rows = {r["sibling"]: r for r in analysis["siblings"]}
    assert (rows["s1"]["fixed"], rows["s1"]["regressed"], rows["s1"]["net"]) == (2, 1, 1)
    assert (rows["s2"]["fixed"], rows["s2"]["regressed"]) == (1, 0)
    assert analysis["union_passed"] == 3 and analysis["h0_resampled_passed"] == 2
    assert analysis["repaired_by_two_or_more"] == 1 and analysis["mean_repair_overlap"] == 0.5
    assert jaccard(set(), set()) is None


def test_pool_analyze_shows_locality_and_complementarity(tmp_path, capsys):
    folder = tmp_path / "p"
    from_space(folder, BASE)
    out = tmp_path / "report"
    assert main(["pool", "analyze", str(folder), "--policy", "faulty", "--limit", "10", "--split", "train",
                 "--max-turns", "10", "--backend", "bwrap", "--workers", "2", "--out", str(out), "--json"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    assert analysis["members"] == 11 and analysis["rollouts_per_task"] == 11
    rows = {r["sibling"]: r for r in analysis["siblings"]}
    tasks = {t.id: t for t in load_suite("workspace").tasks("train", limit=10, seed=0)}
    # T2 removes the JSON-syntax fault: it fixes exactly the syntax tasks H0 failed
    t2 = rows["S0-T2-O1-C0-W0"]
    assert t2["fixed"] > 0 and all(fault_of(tasks[t]) == "syntax" for t in t2["fixed_tasks"])
    # locality: no single sibling fixes every H0 failure; complementarity: the union beats
    # the best sibling and H0 resampled with the same number of rollouts
    assert all(r["fixed"] < analysis["h0_failures"] for r in rows.values())
    assert analysis["union_passed"] > analysis["best_single"]["passed"]
    assert analysis["union_passed"] > analysis["h0_resampled_passed"]
    report = (out / "analysis.md").read_text()
    assert "| S0-T2-O1-C0-W0 |" in report and "Oracle union of the pool" in report


def test_pool_analyze_defaults_to_the_tasks_the_pool_was_evolved_on(tmp_path, capsys):
    from harnessrl.rescue.pool import Pool

    pool = from_space(tmp_path / "p", BASE, radius=1)
    small = Pool(pool.folder, pool.base, pool.members[:2], frozen=True,
                 meta={"evolution": {"families": ["text"], "tiers": [2]}})
    small.save()
    assert main(["pool", "analyze", str(pool.folder), "--policy", "oracle", "--limit", "3", "--json"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    tasks = {t.id: t for t in load_suite("workspace").tasks("test")}
    assert len(analysis["task_ids"]) == 3
    assert {(tasks[i].family, tasks[i].tier) for i in analysis["task_ids"]} == {("text", 2)}
    assert main(["pool", "analyze", str(pool.folder), "--policy", "oracle", "--limit", "2", "--families", "files",
                 "--tiers", "1", "--json"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    assert {(tasks[i].family, tasks[i].tier) for i in analysis["task_ids"]} == {("files", 1)}


def test_analysis_runs_h0_as_often_as_there_are_members(tmp_path):
    from harnessrl.rescue.analysis import analyze_pool
    from harnessrl.rescue.pool import Pool

    pool = from_space(tmp_path / "p", BASE, radius=1)
    small = Pool(pool.folder, pool.base, pool.members[:3], frozen=True)
    tasks = list(load_suite("workspace").tasks("train", limit=3, seed=1))
    settings = RolloutSettings(limits=HarnessLimits(max_turns=8, max_new_tokens=16_384, context_tokens=262_144),
                           backend="bwrap", env_workers=2)
    analysis = analyze_pool(small, FaultyPolicy(), tasks, settings)
    assert analysis["rollouts_per_task"] == 3 and analysis["tasks"] == 3 and len(analysis["siblings"]) == 2


def test_analysis_resumes_from_its_journal_and_refuses_another_measurement(tmp_path):
    """A kill leaves whole episodes and maybe half a line: the resumed analysis runs only the
    episodes the journal lacks, takes the others from it, and equals an uninterrupted one."""
    from harnessrl.rescue.analysis import analyze_pool
    from harnessrl.rescue.pool import Pool
    from harnessrl.rescue.runs import read_journal

    pool = from_space(tmp_path / "p", BASE, radius=1)
    small = Pool(pool.folder, pool.base, pool.members[:3], frozen=True)
    tasks = list(load_suite("workspace").tasks("train", limit=4, seed=2))
    settings = RolloutSettings(limits=HarnessLimits(max_turns=8, max_new_tokens=16_384, context_tokens=262_144),
                               backend="bwrap", env_workers=2)
    journal = tmp_path / "analysis" / "episodes.jsonl"
    whole = analyze_pool(small, FaultyPolicy(), tasks, settings, journal=journal)
    episodes = {job: t.passed for job, t in read_journal(journal).items()}
    lines = journal.read_text().splitlines(keepends=True)
    assert len(lines) == 4 * 2 + 4 * 3 == len(read_journal(journal))  # 2 siblings once, H0 three times

    def without_time(analysis):
        return {k: v for k, v in analysis.items() if k != "wall_time_s"}

    # killed after seven episodes, in the middle of writing the eighth
    kept = lines[:7]
    journal.write_text("".join(kept) + lines[7][: len(lines[7]) // 2])
    assert without_time(analyze_pool(small, FaultyPolicy(), tasks, settings, journal=journal)) == without_time(whole)
    resumed = journal.read_text().splitlines(keepends=True)
    assert resumed[:7] == kept and len(resumed) == len(lines)
    assert {job: t.passed for job, t in read_journal(journal).items()} == episodes  # each once, the same results

    # an episode in the journal is taken from it, not run again: flip one H0 reference result
    first = json.loads(kept[0])
    records = [json.loads(line) for line in resumed]
    h0_first = next(r for r in records if r["metrics"]["tag_key"] == "H0" and r["metrics"]["tag_run"] == 0)
    h0_first["passed"] = not h0_first["passed"]
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    flipped = analyze_pool(small, FaultyPolicy(), tasks, settings, journal=journal)
    assert flipped["h0_passed"] == whole["h0_passed"] + (1 if h0_first["passed"] else -1)
    assert first["metrics"]["tag_key"] in {m.id for m in small.members}

    # another measurement in the same folder: refused while this one is unfinished, naming what
    # differs; once it finished, the other one replaces it
    meta = journal.with_suffix(".json")
    unfinished = {**json.loads(meta.read_text()), "finished": False}
    meta.write_text(json.dumps(unfinished))
    with pytest.raises(ValueError, match="temperature"):
        analyze_pool(small, FaultyPolicy(), tasks, replace(settings, temperature=0.7), journal=journal)
    with pytest.raises(ValueError, match="tasks"):
        analyze_pool(small, FaultyPolicy(), tasks[:3], settings, journal=journal)
    meta.write_text(json.dumps({**unfinished, "finished": True}))
    other = analyze_pool(small, FaultyPolicy(), tasks[:3], settings, journal=journal)
    assert other["tasks"] == 3 and len(read_journal(journal)) == 3 * 2 + 3 * 3


def test_an_episode_that_cannot_start_keeps_its_job_tags_for_the_journal(tmp_path, monkeypatch):
    """A sandbox that fails to open gives a bare error record; it still names its job, so a
    journal holding it resumes instead of refusing itself."""
    from harnessrl.harness import Harness
    from harnessrl.policy.scripted import OraclePolicy
    from harnessrl.rescue.runs import read_journal, run_grid
    from harnessrl.rollout import engine

    def no_sandbox(**_kwargs):
        raise OSError("no sandbox")

    monkeypatch.setattr(engine, "open_sandbox", no_sandbox)
    tasks = list(load_suite("workspace").tasks("train", limit=2, seed=0))
    journal = tmp_path / "episodes.jsonl"
    out = run_grid(OraclePolicy(), [("H0", Harness.named(BASE))], tasks, RolloutSettings(), runs=2, journal=journal)
    assert [t.status for t in out["H0"]] == ["error"] * 4
    assert sorted(read_journal(journal)) == sorted(("H0", r, t.id, r) for t in tasks for r in range(2))
