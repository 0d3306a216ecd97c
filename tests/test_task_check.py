"""`tasks.check` on the real sandbox: every verifier kind passes its gold and fails doing nothing;
weak verifiers, wrong gold and broken setups are named as offenders."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harnessrl.tasks.base import ListSuite
from harnessrl.tasks.check import CheckReport, TaskCheck, check_suite, check_task, check_tasks
from harnessrl.tasks.files import load_task_suite
from harnessrl.tasks.model import Action, Task, TaskSetup
from harnessrl.tasks.verify import (
    AllOf,
    AnswerEquals,
    AnyOf,
    CommandExit,
    FileAbsent,
    FileContains,
    FileEquals,
    FileExists,
    FileMatches,
    JsonField,
    Not,
    PytestPasses,
    SqliteQuery,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "tasks" / "example.yaml"

CALC_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def build_shop_db(root: Path) -> None:
    """Setup builder: a sqlite database with two cancelled orders (module-level: picklable)."""
    path = Path(root) / "data" / "shop.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.executescript(
        "create table orders(id integer primary key, status text, total real);"
        "insert into orders values (1, 'paid', 9.5), (2, 'cancelled', 3.0), (3, 'paid', 1.25),"
        " (4, 'cancelled', 7.0);"
    )
    con.commit()
    con.close()  # prepare_workspace hands the files to the sandbox user afterwards


def explode(root: Path) -> None:
    """Setup builder that fails."""
    raise OSError("disk on fire")


def _task(task_id: str, verifier, gold, **kwargs) -> Task:
    return Task(id=task_id, instruction=f"do {task_id}", verifier=verifier, gold=gold, **kwargs)


def kind_tasks() -> list[Task]:
    """One task per verifier kind (and composition), each with a correct gold solution."""
    return [
        _task("file-exists", FileExists(path="out/report.txt"), [Action.write("out/report.txt", "r")]),
        _task("file-absent", FileAbsent(path="junk.log"), [Action.run("rm junk.log")],
              setup=TaskSetup(files={"junk.log": "x"})),
        _task("file-equals", FileEquals(path="a.txt", content="alpha\nbeta"),
              [Action.write("a.txt", "alpha\nbeta\n")]),
        _task(
            "file-contains-all",
            AllOf(checks=(
                FileContains(path="app.ini", text="debug = false"),
                FileContains(path="app.ini", text="debug = true", negate=True),
            )),
            [Action.edit("app.ini", "debug = true", "debug = false")],
            setup=TaskSetup(files={"app.ini": "[app]\ndebug = true\nport = 80\n"}),
        ),
        _task("file-matches", FileMatches(path="year.txt", pattern=r"^\d{4}$"),
              [Action.run("date +%Y > year.txt")]),
        _task(
            "json-field",
            AllOf(checks=(
                JsonField(path="cfg.json", field="server.ports.1", value=8443),
                JsonField(path="cfg.json", field="name", value="api"),
            )),
            [Action.run(
                "python3 -c \"import json; c = json.load(open('cfg.json')); "
                "c['server']['ports'].append(8443); json.dump(c, open('cfg.json', 'w'))\""
            )],
            setup=TaskSetup(files={"cfg.json": '{"name": "api", "server": {"ports": [80]}}'}),
        ),
        _task(
            "sqlite-query",
            AllOf(checks=(
                SqliteQuery(db="data/shop.db", query="select count(*) from orders where status = 'cancelled'",
                            expected=[[0]]),
                SqliteQuery(db="data/shop.db", query="select id, total from orders", expected=[[3, 1.25], [1, 9.5]],
                            ordered=False),
            )),
            [Action.run(
                "python3 -c \"import sqlite3; c = sqlite3.connect('data/shop.db'); "
                "c.execute(\\\"delete from orders where status = 'cancelled'\\\"); c.commit()\""
            )],
            setup=TaskSetup(builder=build_shop_db),
        ),
        _task("command-exit", CommandExit(command="./greet.sh", code=0, stdout="hi"),
              [Action.run("chmod +x greet.sh")],
              setup=TaskSetup(files={"greet.sh": "#!/bin/sh\necho hi\n"})),
        _task(
            "pytest-protected",
            PytestPasses(test_path="test_calc.py"),
            [Action.edit("calc.py", "a - b", "a + b")],
            setup=TaskSetup(files={"calc.py": "def add(a, b):\n    return a - b\n", "test_calc.py": CALC_TEST}),
            protected_files={"test_calc.py": CALC_TEST},
        ),
        _task(
            "any-not",
            AllOf(checks=(
                AnyOf(checks=(FileExists(path="notes.md"), FileExists(path="notes.txt"))),
                Not(check=FileExists(path="draft.tmp")),
            )),
            [Action.run("mv draft.tmp notes.md")],
            setup=TaskSetup(files={"draft.tmp": "text"}),
        ),
        *[
            _task(f"answer-{mode}", AnswerEquals(expected=expected, mode=mode),
                  [Action.run("true"), Action.submit(right)], expects_answer=True)
            for mode, expected, right, _wrong in ANSWER_CASES
        ],
    ]


# mode, expected, a right answer, a wrong answer
ANSWER_CASES = [
    ("exact", "Paris", "  Paris\n", "paris"),
    ("casefold", "New  York", "new york", "New Yorkshire"),
    ("number", "42", "The answer is 42.0", "41.9"),
    ("lines", "a\nb\nc", "c\na\n\nb", "a\nb"),
    ("contains", "ERROR 17", "line 3: error 17 here", "ERROR 1"),
]


@pytest.fixture(scope="module")
def kind_results() -> dict[str, TaskCheck]:
    return {r.id: r for r in check_tasks(kind_tasks(), workers=2, progress=False)}


@pytest.mark.parametrize("task_id", [t.id for t in kind_tasks()])
def test_each_verifier_kind_passes_gold_and_fails_doing_nothing(kind_results, task_id):
    result = kind_results[task_id]
    assert result.ok, result.problem
    assert result.gold_passed and result.noop_failed and not result.error
    assert result.duration_s > 0


@pytest.mark.parametrize(("mode", "expected", "right", "wrong"), ANSWER_CASES)
def test_answer_modes_reject_a_wrong_answer(mode, expected, right, wrong):
    task = _task(f"wrong-{mode}", AnswerEquals(expected=expected, mode=mode), [Action.submit(wrong)],
                 expects_answer=True)
    result = check_task(task)
    assert not result.gold_passed and result.noop_failed
    assert result.problem.startswith(f"gold failed: FAIL answer_equals({expected!r}, {mode}): got")


def test_rewriting_a_protected_test_cannot_pass():
    cheat = _task(
        "pytest-cheat",
        PytestPasses(test_path="test_calc.py"),
        [Action.write("test_calc.py", "def test_add():\n    pass\n")],
        setup=TaskSetup(files={"calc.py": "def add(a, b):\n    return a - b\n", "test_calc.py": CALC_TEST}),
        protected_files={"test_calc.py": CALC_TEST},
    )
    result = check_task(cheat)
    assert not result.gold_passed
    assert "gold failed: FAIL pytest_passes(test_calc.py)" in result.problem


def test_weak_verifier_is_flagged_because_doing_nothing_passes():
    weak = _task("weak", FileExists(path="a.txt"), [Action.write("a.txt", "new")],
                 setup=TaskSetup(files={"a.txt": "already here"}))
    result = check_task(weak)
    assert result.gold_passed and not result.noop_failed and not result.ok
    assert result.problem == "noop passed: PASS file_exists(a.txt): present"


def test_wrong_gold_is_flagged():
    wrong = _task("wrong-gold", FileEquals(path="a.txt", content="42"), [Action.write("a.txt", "41")])
    result = check_task(wrong)
    assert result.problem.startswith("gold failed: FAIL file_equals(a.txt): differs; got '41'")


def test_gold_action_that_raises_is_a_gold_failure():
    task = _task("bad-edit", FileEquals(path="a.txt", content="b"), [Action.edit("a.txt", "zzz", "b")],
                 setup=TaskSetup(files={"a.txt": "a"}))
    result = check_task(task)
    assert result.problem.startswith("gold failed: gold action 0 (edit_file) raised SandboxError")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (TaskSetup(script="echo broken >&2; exit 3"), "setup script failed (exit 3): broken"),
        (TaskSetup(builder=explode), "OSError: disk on fire"),
    ],
)
def test_setup_error_is_an_offender_not_a_crash(setup, message):
    task = _task("broken-setup", FileExists(path="x"), [Action.write("x", "1")], setup=setup)
    result = check_task(task)
    assert not result.ok
    assert result.problem.startswith("error: gold run: ")
    assert message in result.problem


def test_example_task_file_passes_check():
    report = check_suite(load_task_suite(EXAMPLE), "test", workers=2, progress=False)
    assert report.ok, report.summary()
    assert report.checked == len(load_task_suite(EXAMPLE))


def test_report_names_offenders_and_carries_skips():
    good = _task("good", FileEquals(path="a", content="1"), [Action.write("a", "1")])
    weak = _task("weak", FileAbsent(path="nothing"), [Action.run("true")])
    suite = ListSuite("mini", {"test": [weak, good]}, skipped={"needs a GPU": 2})
    report = check_suite(suite, "test", workers=2, progress=False)
    assert isinstance(report, CheckReport)
    assert [r.id for r in report.results] == ["weak", "good"]  # input order, whatever finished first
    assert report.to_dict() == {
        "suite": "mini",
        "split": "test",
        "checked": 2,
        "passed": 1,
        "offenders": [{"id": "weak", "problem": "noop passed: PASS file_absent(nothing): absent"}],
        "skipped": {"needs a GPU": 2},
    }
    assert not report.ok
    summary = report.summary()
    assert "OFFENDER weak: noop passed" in summary
    assert "checked 2, passed 1, offenders 1" in summary
    assert "2  needs a GPU" in summary
