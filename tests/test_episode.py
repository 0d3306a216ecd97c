"""The agent loop end to end: the oracle carries every task through every harness; bad output
is an observation; token ids stay aligned; golden renders of the model input."""

import os
import random
from pathlib import Path

import pytest

from harnessrl.design import orthogonal
from harnessrl.harness import Harness, HarnessLimits, out_of_space_names
from harnessrl.harness.base import SPAN_POLICY
from harnessrl.harness.registry import default_space
from harnessrl.policy.base import Generation
from harnessrl.policy.scripted import OraclePolicy, RandomPolicy, ReplayPolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.rollout.episode import Episode, run_episode
from harnessrl.sandbox import open_sandbox
from harnessrl.tasks import Action, AllOf, AnswerEquals, FileEquals, Task
from harnessrl.tasks.suite import load_suite
from harnessrl.trajectory import iter_jsonl, save_jsonl

GOLDEN = Path(__file__).parent / "golden"
SUITE = load_suite("workspace")
# Scripted policies tokenize bytewise: give them room for long gold commands.
BYTE_LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)


def sample_tasks(split, n, seed):
    return list(SUITE.tasks(split, limit=n, seed=seed))


def simple_task():
    return Task(
        id="golden-task",
        instruction="Create a file named hello.txt containing the word hello.",
        verifier=FileEquals("hello.txt", "hello"),
        gold=[Action.write("hello.txt", "hello\n"), Action.submit("")],
    )


def test_space_is_built_from_the_registry():
    space = default_space()
    assert space.letters == ("S", "T", "O", "C", "W") and space.size == 243
    names = [lv.name for lv in space.factor("T").levels]
    assert names == ["shell_block", "shell_editor_json", "fine_grained_tagged"]


def test_oracle_passes_under_every_training_config_and_out_of_space():
    """CI subset: the 18 design configs touch every level of every factor."""
    design = orthogonal(default_space())
    names = design.codes + out_of_space_names()
    tasks = sample_tasks("test", 40, seed=1)
    rng = random.Random(0)
    jobs = [RolloutJob(task, Harness.named(name, BYTE_LIMITS), seed=1) for name in names for task in rng.sample(tasks, 6)]
    trajectories, stats = RolloutEngine(OraclePolicy(), max_concurrent=8, env_workers=4).run(jobs)
    failures = [(t.config, t.task_id, t.status, t.error, t.verdict) for t in trajectories if not t.passed]
    assert not failures, failures[:5]
    assert stats.episodes == len(jobs) and stats.errored == 0
    for t in trajectories:
        assert t.metrics["format_errors"] == 0, (t.config, t.task_id)


def test_oracle_submits_multi_line_answers_under_every_training_config_and_out_of_space():
    """Built-in tasks whose answer has several lines pass through every tool interface whole."""
    tasks = [SUITE.get(f"ws-{split}-search-1-{index}") for split in ("train", "test") for index in (1, 3)]
    assert all("\n" in str(task.gold[-1].answer) for task in tasks)
    names = orthogonal(default_space()).codes + out_of_space_names()
    jobs = [RolloutJob(task, Harness.named(name, BYTE_LIMITS), seed=1) for name in names for task in tasks]
    trajectories, stats = RolloutEngine(OraclePolicy(), max_concurrent=8, env_workers=4).run(jobs)
    failures = [(t.config, t.task_id, t.status, t.verdict) for t in trajectories if not t.passed]
    assert not failures, failures[:5]
    assert stats.episodes == len(jobs) and stats.errored == 0


def test_long_file_contents_and_long_multi_line_answers_pass_through_every_tool_interface():
    """A 120 kB file with fence and edit-block marker lines, and a 28 kB answer of 1,000 lines."""
    content = "".join(f"line {i}: ``` <<<<<<< SEARCH\n" if i % 97 == 0 else f"line {i}: {'y' * (i % 60)}\n"
                      for i in range(3000))
    answer = "\n".join(f"row {i} {'z' * (i % 40)}" for i in range(1000))
    task = Task(id="long-contents", instruction="Write big.txt and submit the rows.", expects_answer=True,
                verifier=AllOf(checks=(FileEquals("big.txt", content, strip=False), AnswerEquals(answer, mode="exact"))),
                gold=[Action.write("big.txt", content), Action.submit(answer)])
    limits = HarnessLimits(max_new_tokens=400_000, context_tokens=2_000_000)
    names = orthogonal(default_space()).codes + out_of_space_names()
    trajectories, _ = RolloutEngine(OraclePolicy(), max_concurrent=4, env_workers=2).run(
        [RolloutJob(task, Harness.named(name, limits), seed=1) for name in names])
    failures = [(t.config, t.status, t.verdict) for t in trajectories if not t.passed]
    assert not failures, failures[:3]


@pytest.mark.slow
def test_oracle_passes_every_config_of_the_space():
    tasks = sample_tasks("test", 300, seed=2) + sample_tasks("train", 300, seed=2)
    rng = random.Random(1)
    names = [c.code for c in default_space().all_configs] + out_of_space_names()
    jobs = [RolloutJob(task, Harness.named(name, BYTE_LIMITS)) for name in names for task in rng.sample(tasks, 8)]
    trajectories, _ = RolloutEngine(OraclePolicy(), max_concurrent=8, env_workers=4).run(jobs)
    failures = [(t.config, t.task_id, t.status, t.error) for t in trajectories if not t.passed]
    assert not failures, failures[:5]


@pytest.mark.parametrize(
    "code", ["S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "codex-like", "aider-like"]
)
def test_rendered_model_input_matches_golden(code):
    harness = Harness.named(code)
    policy = OraclePolicy()
    with open_sandbox() as sandbox:
        episode = Episode(harness, simple_task(), sandbox, policy.tokenizer)
        episode.start()
        request = episode.request()
    text = policy.tokenizer.decode(request.prompt_ids)
    path = GOLDEN / f"{code}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"golden file {path.name} is missing; run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8"), f"rendered input changed for {code}; UPDATE_GOLDEN=1 to accept"


def test_token_in_token_out_policy_ids_are_reused_verbatim():
    harness = Harness.named("S0-T1-O0-C0-W0", BYTE_LIMITS)
    task = sample_tasks("test", 1, seed=3)[0]
    traj = run_episode(harness, task, OraclePolicy())
    assert traj.passed and len(traj.turns) >= 2
    last = traj.turns[-1]
    labels = last.prompt_labels()
    policy_in_prompt = [i for i, s in zip(last.prompt_ids, labels, strict=True) if s == SPAN_POLICY]
    assert policy_in_prompt == [i for t in traj.turns[:-1] for i in t.completion_ids]
    samples = traj.training_samples()
    assert len(samples) == 1  # append-only context trains as one sequence
    trained = [i for i, m in zip(samples[0].input_ids, samples[0].loss_mask, strict=True) if m]
    assert trained == [i for t in traj.turns for i in t.completion_ids]


@pytest.mark.parametrize(
    "code", ["S0-T0-O1-C0-W0", "S1-T1-O2-C1-W1", "S2-T2-O0-C2-W2", "codex-like", "aider-like"]
)
def test_random_policy_never_crashes_and_errors_are_counted(code):
    limits = HarnessLimits(max_turns=8, max_consecutive_format_errors=3)
    for seed in range(3):
        traj = run_episode(Harness.named(code, limits), simple_task(), RandomPolicy(seed=seed))
        assert traj.status in {"submitted", "max_turns", "format_errors"}, (traj.status, traj.error)
        assert traj.error is None
        flagged = sum(1 for t in traj.turns if t.error)
        assert traj.metrics["format_errors"] + traj.metrics["tool_errors"] >= flagged


class GarbagePolicy(OraclePolicy):
    name = "garbage"

    def generate(self, requests):
        ids = self.tokenizer.completion_ids("I am thinking...")
        return [Generation(ids, [0.0] * len(ids), "stop") for _ in requests]


def test_consecutive_format_errors_end_the_episode():
    limits = HarnessLimits(max_turns=10, max_consecutive_format_errors=3)
    traj = run_episode(Harness.named("S0-T0-O1-C0-W0", limits), simple_task(), GarbagePolicy())
    assert traj.status == "format_errors" and len(traj.turns) == 3 and not traj.passed
    assert traj.metrics["format_errors"] == 3
    assert "<error" in traj.turns[0].observation


def test_context_exceeded_is_a_status():
    limits = HarnessLimits(max_turns=10, context_tokens=600, max_new_tokens=300)
    traj = run_episode(Harness.named("S2-T2-O0-C0-W0", limits), simple_task(), OraclePolicy())
    assert traj.status == "context_exceeded" and not traj.passed


def test_replay_policy_reproduces_a_trajectory():
    harness = Harness.named("S1-T2-O1-C0-W2", BYTE_LIMITS)
    task = sample_tasks("test", 1, seed=5)[0]
    original = run_episode(harness, task, OraclePolicy())
    replayed = run_episode(harness, task, ReplayPolicy(original))
    assert replayed.passed == original.passed
    assert [t.completion_ids for t in replayed.turns] == [t.completion_ids for t in original.turns]
    assert [t.prompt_ids for t in replayed.turns] == [t.prompt_ids for t in original.turns]


class ExplodingPolicy(OraclePolicy):
    def generate(self, requests):
        raise RuntimeError("boom")


def test_engine_isolates_failures_and_returns_every_episode():
    tasks = sample_tasks("test", 3, seed=6)
    jobs = [RolloutJob(t, Harness.named("S0-T0-O0-C0-W0")) for t in tasks]
    trajectories, stats = RolloutEngine(ExplodingPolicy(), max_concurrent=2).run(jobs)
    assert len(trajectories) == 3 and all(t.status == "error" and "boom" in t.error for t in trajectories)
    assert [t.task_id for t in trajectories] == [t.id for t in tasks]
    assert stats.errored == 3


def test_verification_runs_from_the_workspace_root_after_the_agent_changed_directory():
    from harnessrl.tasks import CommandExit
    from harnessrl.tasks.model import verify_task

    task = Task(id="cd-away", instruction="x", verifier=CommandExit("test -f marker.txt"), gold=[])
    with open_sandbox() as sandbox:
        sandbox.write_file("marker.txt", "1")
        sandbox.exec("mkdir -p sub && cd sub")
        assert sandbox.exec("pwd").stdout.strip().endswith("/sub")
        assert verify_task(task, sandbox).passed


def test_rollout_command_json_and_transcript(capsys):
    import json

    from harnessrl.cli import main

    assert main(["rollout", "--policy", "oracle", "--configs", "S2-T1-O2-C2-W1,codex-like", "--limit", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pass_rate"] == 1.0 and out["episodes"] == 4
    assert set(out["per_config"]) == {"S2-T1-O2-C2-W1", "codex-like"}
    assert main(["rollout", "--policy", "random", "--configs", "S0-T0-O1-C0-W0", "--limit", "1", "--show"]) == 0
    text = capsys.readouterr().out
    assert "--- turn 0 (action) policy:" in text and "pass_rate:" in text
    assert main(["rollout", "--configs", "S9-T0-O0-C0-W0"]) == 2
    assert "out of range" in capsys.readouterr().err


class RecordingOracle(OraclePolicy):
    def __init__(self):
        super().__init__()
        self.batch_sizes = []

    def generate(self, requests):
        self.batch_sizes.append(len(requests))
        return super().generate(requests)


def test_engine_keeps_concurrent_episodes_in_one_batch():
    tasks = sample_tasks("test", 6, seed=7)
    jobs = [RolloutJob(t, Harness.named("S0-T0-O0-C0-W0", BYTE_LIMITS)) for t in tasks]
    policy = RecordingOracle()
    trajectories, stats = RolloutEngine(policy, max_concurrent=6, env_workers=2).run(jobs)
    assert all(t.passed for t in trajectories)
    # Every episode waits for the model at the same time on its first turn.
    assert policy.batch_sizes[0] == 6
    assert stats.generation_calls == len(policy.batch_sizes) and sum(policy.batch_sizes) == sum(len(t.turns) for t in trajectories)


def test_non_utf8_file_names_and_output_do_not_end_the_episode(tmp_path):
    """A file whose name is not UTF-8 reaches W2's review listing (and the tools' output) as
    undecodable bytes: the episode still tokenizes them, is verified and can be saved."""
    task = Task(
        id="non-utf8-names",
        instruction="Create a file named hello.txt containing the word hello.",
        verifier=FileEquals("hello.txt", "hello"),
        gold=[Action.run("printf x > $'\\xff\\xfe.txt'; mkdir $'d\\xe9'; printf 'a\\xffb\\n'; ls"),
              Action.write("hello.txt", "hello\n"), Action.submit("")],
    )
    names = [c for c in orthogonal(default_space()).codes if c.endswith("W2")]
    jobs = [RolloutJob(task, Harness.named(name, BYTE_LIMITS), seed=1) for name in names]
    trajectories, stats = RolloutEngine(OraclePolicy(), max_concurrent=3, env_workers=2).run(jobs)
    assert [(t.status, t.reward) for t in trajectories] == [("submitted", 1.0)] * len(names), [
        (t.config, t.status, t.error) for t in trajectories]
    assert stats.errored == 0
    reviews = [turn.observation for t in trajectories for turn in t.turns if "Review before" in turn.observation]
    assert reviews and all("\ufffd" in review for review in reviews)
    save_jsonl(trajectories, tmp_path / "out.jsonl")
    assert len(list(iter_jsonl(tmp_path / "out.jsonl"))) == len(names)
