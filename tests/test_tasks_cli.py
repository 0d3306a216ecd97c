"""`harnessrl tasks list | show | check` through `harnessrl.cli.main`, on a small YAML suite."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harnessrl.cli import main

SUITE_YAML = """
name: mini
description: a tiny suite for the CLI tests
tasks:
  - id: mini-write
    instruction: |
      Write 42 into answer.txt.
      Nothing else.
    verifier: {kind: file_equals, path: answer.txt, content: "42"}
    gold: [{kind: write_file, path: answer.txt, content: "42\\n"}]
    family: files
    tier: 1
    split: test
  - id: mini-count
    instruction: How many lines does data.txt have?
    setup:
      files: {data.txt: "a\\nb\\nc\\n"}
    verifier: {kind: answer_equals, expected: "3", mode: number}
    gold: [{kind: run, command: wc -l data.txt}, {kind: submit, answer: "3"}]
    expects_answer: true
    family: shell
    tier: 2
    split: test
  - id: mini-train
    instruction: Delete old.log.
    setup:
      files: {old.log: x}
    verifier: {kind: file_absent, path: old.log}
    gold: [{kind: run, command: rm old.log}]
    split: train
"""

BROKEN_YAML = SUITE_YAML + """
  - id: mini-weak
    instruction: Keep data.txt.
    setup:
      files: {data.txt: "x"}
    verifier: {kind: file_exists, path: data.txt}
    gold: [{kind: run, command: "true"}]
    split: test
  - id: mini-wrong-gold
    instruction: Write 7 into seven.txt.
    verifier: {kind: file_equals, path: seven.txt, content: "7"}
    gold: [{kind: write_file, path: seven.txt, content: "8"}]
    split: test
"""


@pytest.fixture
def suite_file(tmp_path) -> Path:
    path = tmp_path / "mini.yaml"
    path.write_text(textwrap.dedent(SUITE_YAML).lstrip())
    return path


def test_list_prints_a_table_of_every_split(suite_file, capsys):
    assert main(["tasks", "list", "--suite", str(suite_file)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["id", "family", "tier", "split", "instruction"]
    row = next(line for line in lines if line.startswith("mini-write"))
    assert row.split()[:4] == ["mini-write", "files", "1", "test"]
    assert row.endswith("Write 42 into answer.txt.")  # first line of the instruction only
    assert "mini-train" in out
    assert lines[-1] == "3 task(s) in suite 'mini'"


def test_list_json_with_split_and_limit(suite_file, capsys):
    assert main(["tasks", "list", "--suite", str(suite_file), "--split", "test", "--limit", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["split"] == "test"
    assert set(rows[0]) >= {"id", "family", "tier", "split", "instruction"}


def test_list_suites(capsys):
    assert main(["tasks", "list", "--suites"]) == 0
    assert {"workspace", "agentbench-os"} <= set(capsys.readouterr().out.split())


def test_show_prints_instruction_setup_verifier_and_gold(suite_file, capsys):
    assert main(["tasks", "show", "mini-count", "--suite", str(suite_file)]) == 0
    out = capsys.readouterr().out
    for expected in ("id: mini-count", "How many lines does data.txt have?", "setup files:", "data.txt:",
                     "verifier:", "kind: answer_equals", "gold:", "1. run", "command: wc -l data.txt",
                     "2. submit", "answer: 3"):
        assert expected in out
    assert main(["tasks", "show", "mini-count", "--suite", str(suite_file), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["verifier"] == {"kind": "answer_equals", "expected": "3", "mode": "number", "tolerance": 1e-6}
    assert view["setup"]["files"] == {"data.txt": "a\nb\nc\n"}


def test_show_unknown_id_suggests_close_ids(suite_file, capsys):
    assert main(["tasks", "show", "mini-cont", "--suite", str(suite_file)]) == 2
    assert "has no task 'mini-cont'; did you mean mini-count" in capsys.readouterr().err


def test_check_passes_a_sound_suite(suite_file, capsys):
    assert main(["tasks", "check", "--suite", str(suite_file), "--quiet", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "suite 'mini' split 'test': checked 2, passed 2, offenders 0" in out


def test_check_exits_nonzero_and_names_each_offender(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text(textwrap.dedent(BROKEN_YAML).lstrip())
    assert main(["tasks", "check", "--suite", str(path), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "OFFENDER mini-weak: noop passed: PASS file_exists(data.txt): present" in out
    assert "OFFENDER mini-wrong-gold: gold failed: FAIL file_equals(seven.txt): differs; got '8'" in out
    assert "checked 4, passed 2, offenders 2" in out

    assert main(["tasks", "check", "--suite", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["suite"], report["split"], report["checked"], report["passed"]) == ("mini", "test", 4, 2)
    assert {o["id"] for o in report["offenders"]} == {"mini-weak", "mini-wrong-gold"}
    assert all(o["problem"] for o in report["offenders"])
    assert report["skipped"] == {}


def test_check_other_split_and_unknown_split(suite_file, capsys):
    assert main(["tasks", "check", "--suite", str(suite_file), "--split", "train", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checked"] == 1
    assert main(["tasks", "check", "--suite", str(suite_file), "--split", "dev"]) == 2
    assert "has no split 'dev'; use one of test, train" in capsys.readouterr().err


def test_bad_task_file_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("- id: a\n  instruction: x\n  verifier: {kind: nope}\n  gold: [{kind: run, command: ls}]\n")
    assert main(["tasks", "list", "--suite", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml line 3, task 0 (id 'a'), field verifier.kind: unknown check kind 'nope'" in err


def test_unknown_suite_lists_the_available_ones(capsys):
    assert main(["tasks", "list", "--suite", "no-such-suite"]) == 2
    assert "unknown task suite 'no-such-suite'; available: agentbench-os" in capsys.readouterr().err
