"""The AgentBench OS adapter: loads inspect-evals' data, counts what it skips and why, and a
sample of tasks (each kind of source task) passes check with its example solution."""

from __future__ import annotations

import importlib.util

import pytest

from harnessrl.tasks.check import check_tasks
from harnessrl.tasks.external import agentbench_os
from harnessrl.tasks.external.agentbench_os import (
    SKIP_BACKGROUND,
    SKIP_EXAMPLE_FAILS,
    SKIP_HOST_PATH,
    SKIP_PROCESS_TABLE,
    SKIP_REPO_FILE,
    SKIP_ROOT,
    AgentBenchOSSuite,
    AgentBenchUnavailable,
    deterministic,
    to_workspace,
)
from harnessrl.tasks.suite import load_suite
from harnessrl.tasks.verify import AnswerEquals, AnyOf, CheckContext, CommandExit, evaluate


def _source_installed() -> bool:
    try:
        agentbench_os.data_dir()
    except AgentBenchUnavailable:
        return False
    return True


needs_source = pytest.mark.skipif(
    not _source_installed(),
    reason="inspect-evals is not installed: pip install --no-deps 'inspect-evals==0.28.0'",
)

SOURCE_COUNTS = {"dev": 26, "test": 119}
KNOWN_REASONS = {
    SKIP_BACKGROUND, SKIP_EXAMPLE_FAILS, SKIP_HOST_PATH, SKIP_PROCESS_TABLE, SKIP_REPO_FILE, SKIP_ROOT,
}

# One or more of each kind of source task: a background writer (dev 0), a literal answer with a
# script comparison (dev 6), size-match (dev 8), an environment question (dev 13), a command to
# implement checked by a script (dev 3, test 18, 19, 20), state checks by command (test 31 SUID,
# test 32 modes), randomised setups made repeatable (test 57, 62, 71), a string answer (test 46),
# /home and /tmp relocated into the workspace (test 44, 91).
SAMPLE = [
    "agentbench-os-dev-0", "agentbench-os-dev-3", "agentbench-os-dev-6", "agentbench-os-dev-8",
    "agentbench-os-dev-13", "agentbench-os-test-18", "agentbench-os-test-19", "agentbench-os-test-20",
    "agentbench-os-test-31", "agentbench-os-test-32", "agentbench-os-test-44", "agentbench-os-test-46",
    "agentbench-os-test-57", "agentbench-os-test-62", "agentbench-os-test-71", "agentbench-os-test-91",
]


@pytest.fixture(scope="module")
def suite() -> AgentBenchOSSuite:
    return AgentBenchOSSuite()


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(AgentBenchUnavailable, match=r"pip install --no-deps 'inspect-evals==0\.28\.0'"):
        agentbench_os.data_dir()
    with pytest.raises(ImportError, match="harnessrl\\[agentbench\\]"):
        load_suite("agentbench-os")


def test_paths_move_from_the_container_layout_into_the_workspace():
    assert to_workspace("cat /home/agent/stock.log ~/x") == "cat /workspace/stock.log ~/x"
    assert to_workspace("mkdir -p /home/user/a /tmp/b") == "mkdir -p /workspace/home/user/a /workspace/tmp/b"
    assert to_workspace("ls /etc /usr/bin /proc/sys /home/agentx") == "ls /etc /usr/bin /proc/sys /workspace/home/agentx"
    # The source's own rewrite runs first: /root and /usr become the agent's home.
    assert agentbench_os._source_rewrite("echo 1 > /root/a; cat /usr/stock.log") == (
        "echo 1 > /home/agent/a; cat /home/agent/stock.log"
    )


def test_randomness_is_seeded_including_subshells():
    script = deterministic('n=$((RANDOM % 5)); echo "$(head -c $((RANDOM % 9)) /dev/urandom)"', 7)
    assert script.startswith("RANDOM=7; __harnessrl_r=7\n")
    assert "RANDOM %" not in script and "/dev/urandom" not in script


@needs_source
def test_every_source_task_is_offered_or_skipped_with_a_reason(suite):
    for split, count in SOURCE_COUNTS.items():
        offered = suite.task_ids(split)
        skipped = suite.skipped_in(split)
        assert len(offered) + sum(skipped.values()) == count, (split, skipped)
        assert set(skipped) <= KNOWN_REASONS
    ids = suite.skipped_ids
    assert sum(suite.skipped.values()) == sum(len(v) for v in ids.values())
    assert "agentbench-os-dev-24" in ids[SKIP_ROOT]  # useradd jack
    assert "agentbench-os-test-0" in ids[SKIP_REPO_FILE]  # init/stock-log.sh from the repository
    assert "agentbench-os-test-37" in ids[SKIP_BACKGROUND]  # sleep infinity &
    assert "agentbench-os-test-112" in ids[SKIP_PROCESS_TABLE]  # ps
    assert "agentbench-os-test-74" in ids[SKIP_HOST_PATH]  # /var/log
    with pytest.raises(KeyError, match="is skipped: needs root"):
        suite.get("agentbench-os-test-30")


@needs_source
def test_tasks_map_onto_answers_and_workspace_checks(suite):
    dev6 = suite.get("agentbench-os-dev-6")
    assert dev6.expects_answer and dev6.split == "dev"
    assert dev6.verifier == AnswerEquals(expected="6", mode="number", tolerance=0.0)
    assert dev6.metadata["source_match"] == "6"  # derived in the sandbox, agrees with the source
    assert [a.kind for a in dev6.gold] == ["run", "submit"]
    assert "/workspace/home" in dev6.instruction and "/home/agent" not in dev6.setup.script

    calc = suite.get("agentbench-os-test-18")
    assert not calc.expects_answer and isinstance(calc.verifier, CommandExit)
    assert "/workspace/local/bin" in calc.instruction

    size = suite.get("agentbench-os-dev-8")
    assert isinstance(size.verifier, AnyOf)
    expected = size.gold[-1].answer
    assert expected.endswith("K")
    in_bytes = str(int(float(expected[:-1]) * 1024))
    for answer, passed in ((expected, True), (in_bytes, True), ("1M", False)):
        assert evaluate(size.verifier, CheckContext(sandbox=None, answer=answer)).passed is passed


@needs_source
def test_sample_of_tasks_passes_check_with_example_solutions(suite):
    tasks = [suite.get(task_id) for task_id in SAMPLE]
    results = check_tasks(tasks, workers=2, progress=False)
    offenders = {r.id: r.problem for r in results if not r.ok}
    assert not offenders


@needs_source
def test_derived_answers_are_the_same_in_every_sandbox():
    first, second = AgentBenchOSSuite(), AgentBenchOSSuite()
    for task_id in ("agentbench-os-test-57", "agentbench-os-test-62", "agentbench-os-test-71"):
        assert first.get(task_id).gold[-1].answer == second.get(task_id).gold[-1].answer


@needs_source
def test_registered_under_its_entry_point_name():
    loaded = load_suite("agentbench-os")
    assert isinstance(loaded, AgentBenchOSSuite)
    assert loaded.splits() == ("dev", "test")


@needs_source
@pytest.mark.slow
def test_every_offered_task_passes_check():
    full = AgentBenchOSSuite()
    for split in full.splits():
        tasks = list(full.tasks(split))
        assert len(tasks) == len(full.task_ids(split)), full.example_failures
        results = check_tasks(tasks, workers=2, progress=False)
        assert not {r.id: r.problem for r in results if not r.ok}
    assert not full.example_failures
