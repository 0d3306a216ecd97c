"""Bringing your own suite: Python files and modules as suites, seeded selection by id or
'all', and the packages and host directories a suite declares it needs in the sandbox."""

import json
import os
import shutil
import sys
import tempfile

import pytest

from harnessrl.cli import main
from harnessrl.tasks.check import check_tasks
from harnessrl.tasks.files import dump_tasks
from harnessrl.tasks.needs import SuiteNeedsError
from harnessrl.tasks.suite import load_suite, parse_limit, select_tasks

PY_SUITE = '''
from harnessrl.tasks import Action, AnswerEquals, Task

requires = ["json"]
tasks = [
    Task(id=f"py-{i}", instruction=f"Submit {i}.", verifier=AnswerEquals(str(i)),
         gold=[Action.submit(str(i))], expects_answer=True, split="test")
    for i in range(12)
]


def suite():
    return tasks
'''


@pytest.fixture(scope="module")
def py_suite(tmp_path_factory):
    folder = tmp_path_factory.mktemp("byo")
    path = folder / "byo_suite_file.py"
    path.write_text(PY_SUITE)
    sys.path.insert(0, str(folder))
    yield path
    sys.path.remove(str(folder))
    sys.modules.pop("byo_suite_file", None)


def test_a_python_file_or_module_attr_is_a_suite(py_suite):
    by_file = load_suite(str(py_suite))  # the callable `suite`
    by_attr = load_suite(f"{py_suite}:tasks")  # the list itself
    by_module = load_suite("byo_suite_file:tasks")
    for suite in (by_file, by_attr, by_module):
        assert suite.name == "byo_suite_file" and suite.requires == ("json",)
        assert [t.id for t in suite.tasks("test")][:3] == ["py-0", "py-1", "py-2"]
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        load_suite(f"{py_suite}:missing")


def test_list_suites_are_sampled_and_ordered_by_the_seed(py_suite):
    seeds = [[t.id for t in select_tasks(str(py_suite), "test", 4, seed)] for seed in (0, 1, 2)]
    assert seeds[0] == ["py-0", "py-1", "py-2", "py-3"]
    assert len({tuple(s) for s in seeds}) == 3
    assert [t.id for t in select_tasks(str(py_suite), "test", 9, 0, task_ids=["py-7", "py-2"])] == ["py-7", "py-2"]
    with pytest.raises(ValueError, match=r"has no task.*py-99"):
        select_tasks(str(py_suite), "test", None, 0, task_ids=["py-99"])
    assert parse_limit("all") is None and parse_limit("5") == 5


def test_rollout_says_it_sampled_and_runs_ids_or_all(py_suite, capsys):
    assert main(["rollout", "--suite", str(py_suite), "--json"]) == 0
    tasks = json.loads(capsys.readouterr().out)["tasks"]
    assert tasks["sampled"] and tasks["selected"] == 3 and tasks["available"] == 12
    assert main(["rollout", "--suite", str(py_suite), "--limit", "all"]) == 0
    out = capsys.readouterr().out
    assert "pass_rate: 1.000 over 12 episodes" in out and "tasks: all 12 test tasks" in out
    assert main(["rollout", "--suite", str(py_suite), "--task-ids", "py-5,py-6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"]["task_ids"] == ["py-5", "py-6"]
    assert main(["tasks", "check", "--suite", str(py_suite), "--task-ids", "py-1", "--quiet"]) == 0
    assert "checked 1, passed 1" in capsys.readouterr().out


def test_tasks_show_json_keeps_non_ascii(tmp_path, capsys):
    path = tmp_path / "u.yaml"
    path.write_text('- {id: u, instruction: "Schreibe Grüße → ✓", verifier: {kind: answer_equals, '
                    'expected: "ü"}, gold: [{kind: submit, answer: "ü"}]}\n', encoding="utf-8")
    assert main(["tasks", "show", "u", "--suite", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert "Grüße → ✓" in out and "\\u" not in out


def test_a_suite_declares_packages_and_read_only_mounts_it_needs(tmp_path):
    fixture = tempfile.mkdtemp(prefix="harnessrl-fixture-")
    os.chmod(fixture, 0o755)
    with open(os.path.join(fixture, "expected.txt"), "w") as f:
        f.write("from the host\n")
    os.chmod(os.path.join(fixture, "expected.txt"), 0o644)
    body = (
        "requires: [{pkg}]\nmounts: [{{source: {src}, target: /opt/fixture}}]\ntasks:\n"
        "- id: uses-mount\n  instruction: Copy /opt/fixture/expected.txt to got.txt.\n"
        "  verifier: {{kind: file_equals, path: got.txt, content: from the host}}\n"
        "  gold: [{{kind: run, command: cp /opt/fixture/expected.txt got.txt}}]\n"
    )
    good = tmp_path / "good.yaml"
    good.write_text(body.format(pkg="json", src=fixture))
    suite = load_suite(good)
    (task,) = suite.tasks("train")
    assert [m.target for m in task.mounts] == ["/opt/fixture"]
    (result,) = check_tasks([task], workers=1, progress=False)
    assert result.ok, result
    again = load_suite(dump_tasks([task], tmp_path / "again.yaml", requires=suite.requires, mounts=suite.mounts))
    assert (again.requires, again.mounts) == (("json",), suite.mounts)
    missing_pkg = tmp_path / "pkg.yaml"
    missing_pkg.write_text(body.format(pkg="no_such_package_xyz", src=fixture))
    with pytest.raises(SuiteNeedsError, match="no_such_package_xyz cannot be imported by"):
        load_suite(missing_pkg)
    missing_dir = tmp_path / "dir.yaml"
    missing_dir.write_text(body.format(pkg="json", src=fixture + "-gone"))
    with pytest.raises(ValueError, match=r"mounts\[0\].*is not a directory"):
        load_suite(missing_dir)
    shutil.rmtree(fixture)


def test_every_suite_orders_its_tasks_by_the_seed():
    """The built-in suite and the AgentBench OS adapter (list suites: test_task_files): seeds give
    different orders."""
    from harnessrl.tasks.external.agentbench_os import suite as agentbench_suite

    for suite in (load_suite("workspace"), agentbench_suite()):
        split = suite.splits()[-1]
        orders = {tuple(suite.task_ids(split, seed=seed)) if hasattr(suite, "task_ids") else
                  tuple(t.id for t in suite.tasks(split, seed=seed)) for seed in (0, 1, 2)}
        assert len(orders) == 3, suite.name


def test_eval_takes_task_ids_and_limit_all(py_suite, capsys):
    base = ["eval", "--policy", "oracle", "--configs", "S0-T0-O0-C0-W0", "--suite", str(py_suite), "--json"]
    assert main([*base, "--task-ids", "py-3,py-9"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["tasks"] == 2
    assert main([*base, "--limit", "all"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["tasks"] == 12
