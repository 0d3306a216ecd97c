"""Task files: round trips, located error messages (file, line, task, field, fix), the registry."""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path

import pytest

from harnessrl.tasks.base import ListSuite
from harnessrl.tasks.files import (
    TaskFileError,
    dump_tasks,
    load_task_suite,
    load_tasks,
    task_to_dict,
)
from harnessrl.tasks.model import Action, Task, TaskSetup
from harnessrl.tasks.suite import available_suites, load_suite
from harnessrl.tasks.verify import (
    AllOf,
    AnswerEquals,
    CommandExit,
    FileContains,
    FileEquals,
    JsonField,
    Not,
    PythonCheck,
    SqliteQuery,
    check_from_dict,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "tasks" / "example.yaml"


def _rich_tasks() -> list[Task]:
    """Tasks that use every part of the format: binary files, scripts, nested checks, metadata."""
    return [
        Task(
            id="rt-files",
            instruction="Fix it.\nSecond line with: colons and 'quotes'",
            verifier=AllOf(
                checks=(
                    FileEquals(path="out.txt", content="a\nb\n"),
                    Not(check=FileContains(path="log.txt", text="ERROR")),
                    JsonField(path="c.json", field="a.b.0", value=[1, 2.5, "x"]),
                )
            ),
            gold=[
                Action.write("out.txt", "a\nb\n"),
                Action.edit("log.txt", "ERROR", "ok"),
                Action.run("echo hi > x"),
                Action.submit("done"),
            ],
            setup=TaskSetup(
                files={"log.txt": "ERROR here\n", "bin/blob.bin": bytes(range(256)), "empty.txt": ""},
                script="mkdir -p d\necho 1 > d/one\n",
            ),
            family="files",
            tier=3,
            split="test",
            tags=("a", "b"),
            protected_files={"tests/test_x.py": "def test_x():\n    assert True\n"},
            expects_answer=True,
            metadata={"source": "unit", "n": 3, "nested": {"k": [1, 2]}},
        ),
        Task(
            id="rt-sql",
            instruction="Query.",
            verifier=SqliteQuery(db="db.sqlite", query="select 1", expected=[[1]], ordered=False),
            gold=[Action.run("true")],
        ),
        Task(
            id="rt-answer",
            instruction="Answer.",
            verifier=AnswerEquals(expected="42", mode="number"),
            gold=[Action.submit("42")],
            expects_answer=True,
        ),
    ]


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json", ".jsonl"])
def test_dump_then_load_round_trips_every_field(tmp_path, suffix):
    tasks = _rich_tasks()
    path = dump_tasks(tasks, tmp_path / f"suite{suffix}", name="rt", description="round trip")
    loaded = load_tasks(path)
    assert [task_to_dict(t) for t in loaded] == [task_to_dict(t) for t in tasks]
    assert loaded[0].setup.files["bin/blob.bin"] == bytes(range(256))
    assert loaded[0].tags == ("a", "b")
    assert loaded[0].verifier == check_from_dict(tasks[0].verifier.to_dict())
    # A second round trip writes the same text.
    again = dump_tasks(loaded, tmp_path / f"again{suffix}", name="rt", description="round trip")
    assert again.read_text() == path.read_text()


def test_suite_fields_and_splits_come_from_the_file(tmp_path):
    path = dump_tasks(_rich_tasks(), tmp_path / "s.yaml", name="my-suite", description="desc")
    suite = load_task_suite(path)
    assert isinstance(suite, ListSuite)
    assert (suite.name, suite.description) == ("my-suite", "desc")
    assert suite.splits() == ("test", "train")
    assert [t.id for t in suite.tasks("train")] == ["rt-sql", "rt-answer"]
    assert suite.get("rt-files").tier == 3


def test_example_file_loads():
    suite = load_task_suite(EXAMPLE)
    assert suite.name == "example"
    assert len(suite) >= 4
    kinds = {t.verifier.kind for t in suite.all_tasks()}
    assert {"file_equals", "pytest_passes", "answer_equals", "all"} <= kinds


def test_dump_refuses_python_builder_and_python_check(tmp_path):
    builder_task = Task(
        id="b", instruction="x", verifier=FileEquals(path="a", content="b"), gold=[Action.run("true")],
        setup=TaskSetup(builder=functools.partial(print)),
    )
    with pytest.raises(ValueError, match=r"task b: its setup uses a Python builder.*task file cannot hold"):
        dump_tasks([builder_task], tmp_path / "x.yaml")
    python_task = Task(
        id="p", instruction="x", gold=[Action.run("true")],
        verifier=AllOf(checks=(CommandExit(command="true"), PythonCheck(fn=bool, name="truthy"))),
    )
    with pytest.raises(ValueError, match=r"task p: its verifier uses a PythonCheck"):
        dump_tasks([python_task], tmp_path / "x.jsonl")
    assert not (tmp_path / "x.yaml").exists()


# --- located errors ---------------------------------------------------------------------------

GOOD = {
    "id": "good",
    "instruction": "Write a.",
    "verifier": {"kind": "file_exists", "path": "a"},
    "gold": [{"kind": "write_file", "path": "a", "content": "x"}],
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def _line_of(path: Path, needle: str) -> int:
    """Returns the 1-based number of the first line that starts with ``needle`` (indent ignored)."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if line.strip().startswith(needle))


def _error(path: Path) -> str:
    with pytest.raises(TaskFileError) as info:
        load_task_suite(path)
    return str(info.value)


def test_unknown_check_kind_names_file_line_task_field_and_choices(tmp_path):
    path = _write(tmp_path, "tasks.yaml", """
        tasks:
          - id: fine
            instruction: ok
            verifier: {kind: file_exists, path: a}
            gold: [{kind: write_file, path: a, content: x}]
          - id: x
            instruction: do it
            verifier:
              kind: file_exist
              path: a
            gold: [{kind: run, command: "true"}]
        """)
    message = _error(path)
    line = _line_of(path, "kind: file_exist")
    assert message.startswith(
        f"tasks.yaml line {line}, task 1 (id 'x'), field verifier.kind: unknown check kind 'file_exist'; use one of"
    )
    assert "file_exists" in message and "sqlite_query" in message


def test_unknown_field_suggests_the_close_name(tmp_path):
    path = _write(tmp_path, "t.yaml", """
        - id: y
          instructions: typo here
          verifier: {kind: file_exists, path: a}
          gold: [{kind: run, command: "true"}]
        """)
    message = _error(path)
    assert f"t.yaml line {_line_of(path, 'instructions:')}, task 0 (id 'y'), field instructions: " in message
    assert "unknown field 'instructions'; did you mean 'instruction'?" in message
    assert f"t.yaml line {_line_of(path, '- id: y')}, task 0 (id 'y'), field instruction: required field is missing" in message


def test_bad_gold_action_and_nested_verifier_point_at_their_lines(tmp_path):
    path = _write(tmp_path, "g.yaml", """
        tasks:
          - id: z
            instruction: do
            verifier:
              kind: all
              checks:
                - {kind: file_exists, path: a}
                - {kind: file_exists, path: b, bogus: 1}
            gold:
              - {kind: write_file, path: a, content: x}
              - {kind: writefile, path: a}
        """)
    message = _error(path)
    assert (
        f"g.yaml line {_line_of(path, '- {kind: file_exists, path: b')}, task 0 (id 'z'), field verifier.checks[1]: "
        "unknown field(s) bogus for check 'file_exists'; allowed: path"
    ) in message
    # Structural errors are reported first; fix them and the verifier is checked in the same pass.
    assert (
        f"g.yaml line {_line_of(path, '- {kind: writefile')}, task 0 (id 'z'), field gold[1].kind: "
        "unknown action kind 'writefile'; use one of write_file, edit_file, delete_file, run, submit"
    ) in message


def test_gold_action_missing_its_field_and_tier_out_of_range(tmp_path):
    path = _write(tmp_path, "m.yaml", """
        - id: w
          instruction: do
          verifier: {kind: file_exists, path: a}
          gold:
            - {kind: write_file, path: a}
          tier: 7
        """)
    message = _error(path)
    assert f"m.yaml line {_line_of(path, 'tier: 7')}, task 0 (id 'w'), field tier: " in message
    assert "less than or equal to 4 (got int 7)" in message
    path.write_text(path.read_text().replace("tier: 7", "tier: 2"))
    message = _error(path)
    assert (
        f"m.yaml line {_line_of(path, '- {kind: write_file')}, task 0 (id 'w'), field gold[0]: "
        "action 'write_file' needs field(s) content"
    ) in message


def test_setup_paths_must_stay_in_the_workspace_and_base64_must_decode(tmp_path):
    path = _write(tmp_path, "s.yaml", """
        - id: s
          instruction: do
          setup:
            files: {../evil.txt: x, /etc/passwd: y}
            files_b64: {blob.bin: "not base64!"}
          verifier: {kind: file_exists, path: a}
          gold: [{kind: run, command: "true"}]
        """)
    message = _error(path)
    assert "field setup.files['../evil.txt']: path '../evil.txt' must not leave the workspace" in message
    assert "field setup.files['/etc/passwd']: path '/etc/passwd' must be a relative path" in message
    assert "field setup.files_b64['blob.bin']: not valid base64" in message
    assert f"s.yaml line {_line_of(path, 'files:')}" in message


def test_jsonl_errors_name_the_line_number(tmp_path):
    lines = [
        json.dumps(GOOD),
        "",
        json.dumps({**GOOD, "id": "b", "tier": "2"}),
        '{"id": "c", broken',
        json.dumps({**GOOD, "id": "d", "verifier": {"kind": "answer_equals", "expected": "1", "mode": "fuzzy"}}),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    message = _error(path)
    assert "t.jsonl line 3, task 1 (id 'b'), field tier: Input should be a valid integer (got str '2')" in message
    assert "t.jsonl line 4, task 2: invalid JSON" in message
    assert (
        "t.jsonl line 5, task 3 (id 'd'), field verifier: check 'answer_equals': mode 'fuzzy' is not one of"
    ) in message


def test_invalid_yaml_and_bad_top_level_name_the_line(tmp_path):
    path = _write(tmp_path, "broken.yaml", """
        tasks:
          - id: a
            instruction: [unclosed
        """)
    assert _error(path).startswith("broken.yaml line ")
    path = _write(tmp_path, "top.yaml", """
        name: s
        task:
          - id: a
        """)
    message = _error(path)
    assert message.startswith(f"top.yaml line {_line_of(path, 'task:')}: unknown top-level key 'task'")
    assert "name, description, requires, mounts, tasks" in message


def test_duplicate_ids_within_a_file_and_across_a_directory(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "instruction": "again"}) + "\n")
    message = _error(path)
    assert "d.jsonl line 2, task 1 (id 'good'), field id: duplicate id 'good' (first at d.jsonl line 1, task 0" in message

    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    dump_tasks(load_tasks(folder / "a.jsonl"), folder / "b.yaml")
    message = _error(folder)
    line = _line_of(folder / "b.yaml", "- id: good")
    assert f"b.yaml line {line}, task 0 (id 'good'), field id: duplicate id 'good' (first at a.jsonl line 1" in message


def test_directory_of_files_is_one_suite(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    (folder / "b.json").write_text(json.dumps({"tasks": [{**GOOD, "id": "other", "split": "test"}]}))
    suite = load_task_suite(folder)
    assert suite.name == "mine"
    assert sorted(t.id for s in suite.splits() for t in suite.tasks(s)) == ["good", "other"]


# --- the registry -----------------------------------------------------------------------------


def test_registry_lists_builtin_suites_and_rejects_unknown_names_listing_them():
    names = available_suites()
    assert {"workspace", "agentbench-os"} <= set(names)
    with pytest.raises(ValueError, match=r"unknown task suite 'nope'; available: .*agentbench-os.*workspace"):
        load_suite("nope")


def test_load_suite_accepts_a_task_file_path(tmp_path):
    path = dump_tasks(_rich_tasks(), tmp_path / "mine.jsonl")
    suite = load_suite(str(path))
    assert suite.name == "mine"
    assert suite.get("rt-answer").verifier == AnswerEquals(expected="42", mode="number")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_suite(tmp_path / "missing.yaml")


def test_list_suite_samples_and_orders_with_a_seed_and_seed_0_keeps_file_order():
    tasks = [
        Task(id=f"t{i}", instruction="x", verifier=FileEquals(path="a", content="b"), gold=[Action.run("true")])
        for i in range(20)
    ]
    suite = ListSuite.from_tasks("s", tasks)
    first = [t.id for t in suite.tasks("train", limit=5, seed=1)]
    assert first == [t.id for t in suite.tasks("train", limit=5, seed=1)]
    assert first != [t.id for t in suite.tasks("train", limit=5, seed=2)]
    # seed 0 keeps the file's order (a sample stays in it); another seed orders the whole
    # split by the seed, so without a limit seeds 1 and 2 come back in different orders too
    zero = [t.id for t in suite.tasks("train", limit=5, seed=0)]
    assert zero == sorted(zero, key=lambda i: int(i[1:]))
    assert [t.id for t in suite.tasks("train")] == [f"t{i}" for i in range(20)]
    whole = [t.id for t in suite.tasks("train", seed=1)]
    assert sorted(whole) == sorted(t.id for t in tasks) and whole[:5] == first
    assert whole != [t.id for t in suite.tasks("train", seed=2)] != [f"t{i}" for i in range(20)]
    assert len(list(suite.tasks("train"))) == 20
    with pytest.raises(ValueError, match="has no split 'test'; use one of train"):
        list(suite.tasks("test"))
    with pytest.raises(ValueError, match="duplicate task id 't0'"):
        ListSuite("dup", {"train": tasks[:1], "test": tasks[:1]})


def test_a_file_outside_the_workspace_is_refused_with_the_reason_and_the_fix(tmp_path):
    path = tmp_path / "abs.yaml"
    path.write_text("- {id: a, instruction: x, setup: {files: {/testbed/a.py: 'x'}}, "
                    "verifier: {kind: file_exists, path: a.py}, gold: [{kind: run, command: 'true'}]}\n")
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    message = str(caught.value)
    assert "files are placed only there" in message and "write 'testbed/a.py' instead" in message
    assert "mounts" in message
