"""Sibling pools: from-space pools (radius 1 gives 10 siblings; a design's rows), the folder
format (index, one file per sibling, validation records), the oracle compliance check (a
guard that blocks gold actions makes a sibling invalid), `pool:DIR` / `DIR#ID` harness sets,
and the `pool from-space | show | check` commands."""

import json

import pytest

from harnessrl.cli import main
from harnessrl.design import orthogonal
from harnessrl.eval.sets import resolve_eval_set
from harnessrl.harness import Harness
from harnessrl.harness.registry import default_space
from harnessrl.harness.siblings import (
    GuardRule,
    Patch,
    PatchError,
    Sibling,
    ToolHint,
    save_sibling,
    sibling_file,
)
from harnessrl.rescue.check import check_siblings
from harnessrl.rescue.pool import INDEX_FILE, Pool, ValidationRecord, from_space
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.suite import load_suite

BASE = "S0-T1-O1-C0-W0"
SETTINGS = RolloutSettings(backend="bwrap", max_concurrent=8, env_workers=2)


def sample(n, seed=0, split="train"):
    return list(load_suite("workspace").tasks(split, limit=n, seed=seed))


def test_radius_one_pool_has_ten_siblings_each_one_swap(tmp_path):
    pool = from_space(tmp_path / "p", BASE)
    assert len(pool) == 11 and pool.ids[0] == "H0" and pool.frozen
    base = default_space().parse(BASE)
    for sibling in pool.members[1:]:
        assert default_space().parse(sibling.id).hamming(base) == 1
        assert [e.kind for e in sibling.patch.edits] == ["set_level"] and sibling.parent == "H0"
        assert Harness.named(pool.member_name(sibling.id)).tools.name == Harness.named(sibling.id).tools.name
    assert len(from_space(tmp_path / "r2", BASE, radius=2)) == 1 + 10 + 40


def test_design_rows_pool(tmp_path):
    pool = from_space(tmp_path / "d", "S0-T0-O0-C0-W0", design="orthogonal")
    rows = set(orthogonal(default_space()).codes)
    assert set(pool.ids[1:]) == rows - {"S0-T0-O0-C0-W0"}


def test_pool_folder_round_trips_and_freezes(tmp_path):
    folder = tmp_path / "p"
    pool = from_space(folder, BASE)
    assert (folder / INDEX_FILE).is_file() and len(list((folder / "siblings").glob("*.yaml"))) == 11
    with pytest.raises(ValueError, match="frozen"):
        pool.add(Sibling("extra", BASE))
    record = ValidationRecord("S0-T2-O1-C0-W0", "H0", ["a", "b", "c"], {"a": True, "b": False, "c": True},
                              parent_passed={"a": False, "b": True, "c": True}, h0_passed={"a": False, "b": True, "c": True},
                              targets=["a"])
    pool.save_validation(record)
    again = Pool.load(folder)
    assert again.ids == pool.ids and again.base == BASE and again.frozen
    loaded = again.validation("S0-T2-O1-C0-W0")
    assert loaded.fixed_vs_h0 == ["a"] and loaded.broken_vs_h0 == ["b"] and loaded.target_fixed == ["a"]
    assert again.validation("H0") is None
    members = list(again.harnesses())
    assert [i for i, _ in members] == again.ids and all(h.sibling["id"] == i for i, h in members)
    # a sibling file edited after the pool was built no longer matches its hash
    path = sibling_file(folder, "S0-T2-O1-C0-W0")
    path.write_text(path.read_text().replace("level: 2", "level: 0"))
    with pytest.raises(PatchError, match=r"content hash .* differs"):
        Pool.load(folder)


def test_oracle_passes_every_member_of_a_from_space_pool(tmp_path):
    pool = from_space(tmp_path / "p", BASE)
    results = check_siblings(pool.members, sample(3, seed=2), SETTINGS)
    assert all(r.ok for r in results), [(r.sibling, r.problems) for r in results if not r.ok]
    assert all(r.oracle_passed == r.oracle_tasks == 3 for r in results)


def test_a_guard_that_blocks_gold_actions_makes_a_sibling_invalid():
    tasks = sample(3, seed=4)
    blocks_everything = Sibling("strict", BASE, Patch((GuardRule(effect="block", message="no shell", tool="bash"),)))
    harmless = Sibling("harmless", BASE, Patch((GuardRule(effect="block", message="no rm -rf /", pattern=r"rm -rf /$"),)))
    broken = Sibling("broken", BASE, Patch((ToolHint(tool="Bash", text="wrong tool name"),)))
    strict, ok, bad = check_siblings([blocks_everything, harmless, broken], tasks, SETTINGS)
    assert ok.ok and not strict.ok and not bad.ok
    assert "blocked by a guard rule" in strict.problems[0] and strict.oracle_passed < 3
    assert "does not build" in bad.problems[0] and "does not offer" in bad.problems[0]


def test_pool_sets_resolve_where_harness_sets_are_accepted(tmp_path):
    pool = from_space(tmp_path / "p", BASE)
    design = orthogonal(default_space())
    targets = resolve_eval_set(f"pool:{pool.folder},S0-T0-O0-C0-W0", design)
    assert [t.name for t in targets[:11]] == [pool.member_name(i) for i in pool.ids]
    assert {t.group for t in targets[:11]} == {"sibling"}
    one = resolve_eval_set(f"{pool.folder}#S0-T2-O1-C0-W0", design)
    assert [t.name for t in one] == [pool.member_name("S0-T2-O1-C0-W0")]
    with pytest.raises(ValueError, match="no member 'nope'"):
        resolve_eval_set(f"{pool.folder}#nope", design)
    with pytest.raises(FileNotFoundError, match="not a sibling pool"):
        resolve_eval_set(f"pool:{tmp_path}/missing", design)


def test_cli_from_space_show_check_and_rollout(tmp_path, capsys):
    folder = tmp_path / "p"
    assert main(["pool", "from-space", "--base", BASE, "--out", str(folder)]) == 0
    assert "H0 S0-T1-O1-C0-W0 + 10 siblings" in capsys.readouterr().out
    assert main(["pool", "show", str(folder), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["members"]) == 11 and shown["members"][1]["edits"][0].startswith("set_level(factor=")
    assert main(["pool", "check", str(folder), "--limit", "2", "--backend", "bwrap"]) == 0
    assert "all 11 members compliant" in capsys.readouterr().out
    assert main(["rollout", "--configs", f"{folder}#S0-T2-O1-C0-W0", "--limit", "1", "--split", "train",
                 "--backend", "bwrap", "--show"]) == 0
    out = capsys.readouterr().out
    assert "=== sibling S0-T2-O1-C0-W0 (hash" in out and "1/1 passed" in out
    # an offender makes `pool check` fail, naming it
    pool = Pool(folder, BASE, Pool.load(folder).members, source="test")
    pool.members.append(Sibling("strict", BASE, Patch((GuardRule(effect="block", message="no", tool="submit"),))))
    save_sibling(pool.members[-1], sibling_file(folder, "strict"))
    pool.save()
    assert main(["pool", "check", str(folder), "--limit", "1", "--backend", "bwrap"]) == 1
    captured = capsys.readouterr()
    assert "strict" in captured.err and "INVALID" in captured.out
