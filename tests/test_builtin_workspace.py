"""The built-in ``workspace`` suite: determinism, split disjointness, coverage, and proven verifiers."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from harnessrl.tasks.base import TaskSuite
from harnessrl.tasks.builtin.families import FAMILIES
from harnessrl.tasks.builtin.families.common import ALL_TEMPLATES
from harnessrl.tasks.builtin.families.vocab import TEST, TRAIN
from harnessrl.tasks.builtin.workspace import WorkspaceSuite, suite
from harnessrl.tasks.model import Task
from harnessrl.tasks.suite import load_suite

FAMILY_NAMES = ("files", "text", "data", "sqlite", "code", "search", "state", "recovery")
STRUCTURAL_FILE_NAMES = {"__init__.py"}  # package markers, the only names both splits use


def fingerprint(task: Task) -> dict:
    """Returns everything that defines a task as plain JSON-able data."""
    builder = task.setup.builder
    return {
        "id": task.id,
        "instruction": task.instruction,
        "verifier": task.verifier.to_dict(),
        "gold": [a.to_dict() for a in task.gold],
        "files": {p: c if isinstance(c, str) else c.hex() for p, c in task.setup.files.items()},
        "script": task.setup.script,
        "builder": None if builder is None else [builder.func.__name__, builder.keywords],
        "protected": task.protected_files,
        "tags": list(task.tags),
        "family": task.family,
        "tier": task.tier,
        "split": task.split,
        "expects_answer": task.expects_answer,
        "metadata": task.metadata,
    }


def digest(tasks: list[Task]) -> str:
    blob = json.dumps([fingerprint(t) for t in tasks], sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


@pytest.fixture(scope="module")
def workspace() -> WorkspaceSuite:
    return suite()


@pytest.fixture(scope="module")
def train_tasks(workspace: WorkspaceSuite) -> list[Task]:
    return list(workspace.tasks("train"))


@pytest.fixture(scope="module")
def test_tasks(workspace: WorkspaceSuite) -> list[Task]:
    return list(workspace.tasks("test"))


# --- interface and counts ------------------------------------------------------------------


def test_entry_point_loads_the_workspace_suite() -> None:
    loaded = load_suite("workspace")
    assert isinstance(loaded, TaskSuite) and isinstance(loaded, WorkspaceSuite)
    assert loaded.name == "workspace"
    assert loaded.splits() == ("train", "test")


def test_train_has_at_least_2000_and_test_at_least_300_distinct_ids(
    workspace: WorkspaceSuite, train_tasks: list[Task], test_tasks: list[Task]
) -> None:
    train_ids = [t.id for t in train_tasks]
    test_ids = [t.id for t in test_tasks]
    assert len(set(train_ids)) == len(train_ids) >= 2000
    assert len(set(test_ids)) == len(test_ids) >= 300
    limited = [t.id for t in workspace.tasks("train", limit=2000)]
    assert len(limited) == len(set(limited)) == 2000
    assert workspace.task_ids("train", limit=2000) == limited


def test_ids_name_split_family_tier_and_index(train_tasks: list[Task], test_tasks: list[Task]) -> None:
    for task in [*train_tasks, *test_tasks]:
        match = re.fullmatch(r"ws-(train|test)-([a-z]+)-([1-4])-(\d+)", task.id)
        assert match, task.id
        assert (match[1], match[2], int(match[3])) == (task.split, task.family, task.tier)


def test_every_family_and_tier_is_present_in_both_splits(
    train_tasks: list[Task], test_tasks: list[Task]
) -> None:
    assert set(FAMILIES) == set(FAMILY_NAMES)
    for tasks in (train_tasks, test_tasks):
        cells = Counter((t.family, t.tier) for t in tasks)
        assert set(cells) == {(f, tier) for f in FAMILY_NAMES for tier in (1, 2, 3, 4)}
        assert len(set(cells.values())) == 1  # every cell equally represented


def test_a_limit_is_stratified_over_families_and_tiers(workspace: WorkspaceSuite) -> None:
    sample = list(workspace.tasks("train", limit=64, seed=5))
    assert Counter((t.family, t.tier) for t in sample) == Counter(
        {(f, tier): 2 for f in FAMILY_NAMES for tier in (1, 2, 3, 4)}
    )


def test_tags_name_the_family_and_the_key_skills(train_tasks: list[Task]) -> None:
    for task in train_tasks:
        assert task.family in task.tags
        assert ("answer" in task.tags) == task.expects_answer
    by_family = defaultdict(set)
    for task in train_tasks:
        by_family[task.family].update(task.tags)
    assert "sqlite" in by_family["sqlite"]
    assert "state-tracking" in by_family["state"]
    assert "error-recovery" in by_family["recovery"]


def test_tiers_grow_in_number_of_gold_actions(train_tasks: list[Task]) -> None:
    steps = defaultdict(list)
    for task in train_tasks:
        steps[task.tier].append(len(task.gold))
    assert max(steps[1]) <= 4
    mean = {tier: sum(v) / len(v) for tier, v in steps.items()}
    assert mean[1] < mean[3] < mean[4]
    assert min(steps[4]) >= 3


def test_both_answer_tasks_and_workspace_tasks_exist_in_each_split(
    train_tasks: list[Task], test_tasks: list[Task]
) -> None:
    for tasks in (train_tasks, test_tasks):
        share = sum(t.expects_answer for t in tasks) / len(tasks)
        assert 0.2 < share < 0.6


def test_code_tasks_protect_their_test_file(train_tasks: list[Task]) -> None:
    code_tasks = [t for t in train_tasks if t.family == "code"]
    assert code_tasks
    for task in code_tasks:
        (test_path,) = task.protected_files
        assert task.verifier.to_dict() == {"kind": "pytest_passes", "test_path": test_path, "timeout_s": 60.0}
        assert task.setup.files[test_path] == task.protected_files[test_path]


# --- determinism ---------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_tasks(workspace: WorkspaceSuite) -> None:
    first = list(workspace.tasks("train", limit=200, seed=11))
    again = list(suite().tasks("train", limit=200, seed=11))
    assert digest(first) == digest(again)
    other = list(workspace.tasks("train", limit=200, seed=12))
    assert [t.id for t in other] != [t.id for t in first]


def test_get_regenerates_each_task_from_its_id(workspace: WorkspaceSuite, test_tasks: list[Task]) -> None:
    for task in test_tasks[::3]:
        assert fingerprint(workspace.get(task.id)) == fingerprint(task)


def test_get_rejects_ids_that_are_not_workspace_ids(workspace: WorkspaceSuite) -> None:
    for bad in ("ws-train-cooking-1-0", "ws-dev-files-1-0", "ws-train-files-7-0", "files-1-0"):
        with pytest.raises(KeyError):
            workspace.get(bad)


def test_generation_does_not_depend_on_hash_seed_or_process(workspace: WorkspaceSuite) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_builtin_workspace as t; "
        "from harnessrl.tasks.builtin.workspace import suite; "
        "print(t.digest(list(suite().tasks('test', limit=120, seed=3))))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent)],
        env=env, capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == digest(list(workspace.tasks("test", limit=120, seed=3)))


# --- train/test disjointness ---------------------------------------------------------------


def test_split_vocabularies_are_disjoint_field_by_field() -> None:
    for name in ("words", "people", "items", "places", "categories", "statuses", "years"):
        assert not set(getattr(TRAIN, name)) & set(getattr(TEST, name)), name
    assert TRAIN.code_prefix != TEST.code_prefix and TRAIN.marker != TEST.marker
    assert not TRAIN.all_names() & TEST.all_names()


def test_no_file_name_is_shared_between_splits(train_tasks: list[Task], test_tasks: list[Task]) -> None:
    def names(tasks: list[Task]) -> set[str]:
        out = set()
        for task in tasks:
            out.update(Path(p).name for p in task.setup.files)
            out.update(Path(a.path).name for a in task.gold if a.path)
        return out - STRUCTURAL_FILE_NAMES

    shared = names(train_tasks) & names(test_tasks)
    assert not shared, sorted(shared)[:20]


def test_instructions_never_use_the_other_splits_vocabulary(
    train_tasks: list[Task], test_tasks: list[Task]
) -> None:
    train_only = TRAIN.all_names() - TEST.all_names()
    test_only = TEST.all_names() - TRAIN.all_names()
    for tasks, foreign in ((train_tasks, test_only), (test_tasks, train_only)):
        for task in tasks:
            tokens = set(re.findall(r"[a-z0-9]+", task.instruction.lower()))
            assert not tokens & foreign, (task.id, sorted(tokens & foreign))


def test_test_wordings_are_never_used_in_train(train_tasks: list[Task], test_tasks: list[Task]) -> None:
    train_templates = {t.metadata["template"] for t in train_tasks}
    test_templates = {t.metadata["template"] for t in test_tasks}
    assert not train_templates & test_templates
    assert all("/train/" in k for k in train_templates) and all("/test/" in k for k in test_templates)
    train_texts = {text for tpl in ALL_TEMPLATES for text in tpl.train}
    test_texts = {text for tpl in ALL_TEMPLATES for text in tpl.test}
    assert not train_texts & test_texts
    # the wording a test task shows is not any train wording (up to the filled-in names)
    skeletons = {re.sub(r"\{[^}]*\}", "", text) for text in train_texts}
    for tpl in ALL_TEMPLATES:
        for text in tpl.test:
            assert re.sub(r"\{[^}]*\}", "", text) not in skeletons, text


def test_code_functions_differ_between_splits(train_tasks: list[Task], test_tasks: list[Task]) -> None:
    def functions(tasks: list[Task]) -> set[str]:
        found = set()
        for task in tasks:
            if task.family == "code":
                for content in task.setup.files.values():
                    found.update(re.findall(r"^def (\w+)\(", str(content), re.MULTILINE))
        return {f for f in found if not f.startswith("test_")}

    train_functions, test_functions = functions(train_tasks), functions(test_tasks)
    assert len(train_functions) >= 8 and len(test_functions) >= 5
    assert not train_functions & test_functions


def test_no_test_instruction_appears_in_train(train_tasks: list[Task], test_tasks: list[Task]) -> None:
    assert not {t.instruction for t in train_tasks} & {t.instruction for t in test_tasks}
    assert not {t.id for t in train_tasks} & {t.id for t in test_tasks}


# --- paraphrase variety --------------------------------------------------------------------


def test_every_family_and_task_type_uses_at_least_three_wordings_per_split(
    train_tasks: list[Task], test_tasks: list[Task]
) -> None:
    for tasks, minimum_per_type in ((train_tasks, 3), (test_tasks, 2)):
        per_family = defaultdict(set)
        per_type = defaultdict(set)
        for task in tasks:
            per_family[task.family].add(task.metadata["template"])
            per_type[task.metadata["subtype"]].add(task.metadata["template"])
        for family in FAMILY_NAMES:
            assert len(per_family[family]) >= 3, family
        for subtype, templates in per_type.items():
            assert len(templates) >= minimum_per_type, subtype
    for tpl in ALL_TEMPLATES:
        assert len(set(tpl.train)) >= 3 and len(set(tpl.test)) >= 3, tpl.key


def test_instructions_are_self_contained_and_name_their_files(test_tasks: list[Task]) -> None:
    for task in test_tasks:
        assert not re.search(r"\{[a-z_]+\}", task.instruction), task.id  # no unfilled field
        if task.family != "code":  # code tasks write the module the instruction names
            for action in task.gold:
                if action.kind == "write_file":
                    assert action.path in task.instruction, (task.id, action.path)


# --- gold passes, doing nothing fails (real sandbox) ----------------------------------------


def _sandbox_or_skip() -> None:
    from harnessrl.sandbox import SandboxUnavailableError, open_sandbox

    try:
        with open_sandbox() as sandbox:
            assert sandbox.exec("true").ok
    except SandboxUnavailableError as exc:  # pragma: no cover - machines without bwrap/unshare
        pytest.skip(f"no sandbox backend: {exc}")


def _check(tasks: list[Task]) -> None:
    from harnessrl.tasks.check import check_tasks

    results = check_tasks(tasks, workers=4, progress=False)
    assert len(results) == len(tasks)
    offenders = [f"{r.id}: {r.problem}" for r in results if not r.ok]
    assert not offenders, "\n".join(offenders[:20])


def test_gold_passes_and_noop_fails_for_every_test_task(test_tasks: list[Task]) -> None:
    _sandbox_or_skip()
    _check(test_tasks)


def test_gold_passes_and_noop_fails_for_a_stratified_train_sample(workspace: WorkspaceSuite) -> None:
    _sandbox_or_skip()
    sample = list(workspace.tasks("train", limit=160, seed=2024))  # 5 per family x tier
    assert Counter((t.family, t.tier) for t in sample) == Counter(
        {(f, tier): 5 for f in FAMILY_NAMES for tier in (1, 2, 3, 4)}
    )
    _check(sample)


@pytest.mark.slow
def test_gold_passes_and_noop_fails_for_every_train_task(train_tasks: list[Task]) -> None:
    _sandbox_or_skip()
    _check(train_tasks)


def test_a_wrong_answer_or_a_half_done_workspace_fails(workspace: WorkspaceSuite) -> None:
    """Verifiers are not fooled by the first gold steps alone or by a wrong answer."""
    from harnessrl.sandbox import open_sandbox
    from harnessrl.tasks.model import apply_action, prepare_workspace, verify_task

    _sandbox_or_skip()
    for family in FAMILY_NAMES:
        task = workspace.get(f"ws-test-{family}-4-1")
        with open_sandbox() as sandbox:
            prepare_workspace(task, sandbox)
            for action in task.gold[:1]:
                apply_action(action, sandbox)
            answer = "0" if task.expects_answer else None
            assert not verify_task(task, sandbox, answer).passed, task.id
