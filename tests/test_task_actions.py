"""Gold actions and checks beyond text files: deleting a file, writing binary content, the
executable bit, symlinks, binary equality, answers checked against a command's output, and
host checks that hang; each through the task-file form and every tool interface."""

import time

import pytest

from harnessrl.design import orthogonal
from harnessrl.harness import Harness, HarnessLimits, out_of_space_names
from harnessrl.harness.registry import default_space
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks import (
    Action,
    AllOf,
    AnswerMatchesOutput,
    BytesEqual,
    CheckContext,
    FileAbsent,
    IsExecutable,
    IsSymlink,
    Not,
    PythonCheck,
    Task,
    TaskSetup,
    apply_action,
    check_from_dict,
    evaluate,
)
from harnessrl.tasks.files import dump_tasks, load_tasks

BINARY = bytes(range(256)) * 3 + b"\n```\n\x00"
BYTE_LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)


def delete_and_binary_task() -> Task:
    return Task(
        id="delete-and-binary",
        instruction="Delete stale.txt, write the binary blob to data/blob.bin and make run.sh executable.",
        setup=TaskSetup(files={"stale.txt": "old\n", "run.sh": "echo hi\n"}),
        verifier=AllOf(checks=(FileAbsent("stale.txt"), BytesEqual.of("data/blob.bin", BINARY),
                               IsExecutable("run.sh"))),
        gold=[Action.delete("stale.txt"), Action.write("data/blob.bin", BINARY),
              Action.run("chmod +x run.sh"), Action.submit("")],
    )


def test_delete_and_binary_write_replay_through_every_training_config_and_out_of_space():
    names = orthogonal(default_space()).codes + out_of_space_names()
    jobs = [RolloutJob(delete_and_binary_task(), Harness.named(name, BYTE_LIMITS), seed=1) for name in names]
    trajectories, stats = RolloutEngine(OraclePolicy(), max_concurrent=8, env_workers=4).run(jobs)
    failures = [(t.config, t.status, t.verdict) for t in trajectories if not t.passed]
    assert not failures, failures[:3]
    assert stats.errored == 0 and all(t.metrics["format_errors"] == 0 for t in trajectories)


def test_delete_and_binary_actions_round_trip_through_a_task_file(tmp_path):
    task = delete_and_binary_task()
    path = dump_tasks([task], tmp_path / "suite.yaml")
    assert "content_b64" in path.read_text() and "delete_file" in path.read_text()
    (loaded,) = load_tasks(path)
    assert loaded.gold == task.gold and loaded.verifier == task.verifier
    assert Action.from_dict(Action.write("a.bin", BINARY).to_dict()).content == BINARY
    with pytest.raises(ValueError, match="needs field"):
        Action("delete_file")


def test_apply_action_deletes_and_writes_bytes(sandbox):
    sandbox.write_file("gone.txt", "x")
    apply_action(Action.delete("gone.txt"), sandbox)
    apply_action(Action.write("b.bin", BINARY), sandbox)
    assert not sandbox.exists("gone.txt") and sandbox.read_bytes("b.bin") == BINARY


def test_file_kind_checks_pass_and_fail_and_round_trip_to_dicts(sandbox):
    sandbox.write_file("tool.sh", "echo ok\n")
    sandbox.write_file("blob.bin", BINARY)
    sandbox.exec("chmod +x tool.sh && ln -s tool.sh link.sh")
    ctx = CheckContext(sandbox=sandbox)
    passing = [IsExecutable("tool.sh"), IsSymlink("link.sh"), IsSymlink("link.sh", target="tool.sh"),
               BytesEqual.of("blob.bin", BINARY), IsExecutable("blob.bin", executable=False)]
    failing = [IsExecutable("blob.bin"), IsSymlink("tool.sh"), IsSymlink("link.sh", target="other"),
               BytesEqual.of("blob.bin", BINARY + b"!"), IsExecutable("link.sh"), IsSymlink("nope"),
               BytesEqual.of("nope", b"")]
    for check in passing + failing:
        assert check_from_dict(check.to_dict()) == check
        assert evaluate(check, ctx).passed == (check in passing), check
    assert evaluate(Not(IsSymlink("tool.sh")), ctx).passed
    with pytest.raises(ValueError, match="64 lowercase hex"):
        BytesEqual("x", "abc")


def test_answer_matches_output_compares_stdout_stderr_or_both(sandbox):
    command = "echo out; echo err >&2"
    for streams, answer in (("stdout", "out"), ("stderr", "err"), ("both", "out\nerr")):
        check = AnswerMatchesOutput(command, streams=streams)
        assert check_from_dict(check.to_dict()) == check
        assert evaluate(check, CheckContext(sandbox=sandbox, answer=answer)).passed, streams
        assert not evaluate(check, CheckContext(sandbox=sandbox, answer="out")).passed or streams == "stdout"
    assert not evaluate(AnswerMatchesOutput(command, streams="both"),
                        CheckContext(sandbox=sandbox, answer="out")).passed
    with pytest.raises(ValueError, match="streams"):
        AnswerMatchesOutput(command, streams="all")


def hangs(ctx):
    time.sleep(30)
    return True


def test_a_host_python_check_that_hangs_fails_at_its_timeout(sandbox):
    check = PythonCheck(hangs, name="hangs", on_host=True, timeout_s=0.5)
    with pytest.warns(RuntimeWarning, match="ON THE HOST"):
        verdict = evaluate(check, CheckContext(sandbox=sandbox))
    assert not verdict.passed and "timed out after 0.5 s" in verdict.explain()
