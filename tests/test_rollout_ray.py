"""The Ray rollout backend returns what the in-process engine returns, in job order, errors included."""

import dataclasses
import functools
import os
import shutil
import sys
import threading

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend is optional: pip install 'harnessrl[ray]'")

from harnessrl.harness import Harness, HarnessLimits  # noqa: E402
from harnessrl.policy.scripted import OraclePolicy, RandomPolicy  # noqa: E402
from harnessrl.rollout.engine import RolloutEngine, RolloutJob, RolloutStats  # noqa: E402
from harnessrl.rollout.ray_engine import RayRolloutEngine, merge_stats  # noqa: E402
from harnessrl.tasks import TaskSetup  # noqa: E402
from harnessrl.tasks.suite import load_suite  # noqa: E402

# Scripted policies tokenize bytewise: give them room for long gold commands.
BYTE_LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)
CODES = ("S0-T0-O0-C0-W0", "S1-T2-O1-C2-W1", "codex-like")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local 2-CPU Ray instance for the module; the engines join it and leave it running."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # Workers can't import this test module: ship its functions (builders below) by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def broken_setup(task):
    """Returns a copy of ``task`` whose setup builder fails (it copies a fixture that is missing)."""
    builder = functools.partial(shutil.copytree, "/nonexistent/harnessrl-fixture")
    return dataclasses.replace(task, id=f"{task.id}-broken", setup=TaskSetup(builder=builder))


def exit_process(root):
    """A setup builder that ends the process it runs in, as a crashing native library would."""
    os._exit(1)


def exit_process_once(marker, builder, root):
    """A setup builder whose first call (in any process) ends the process it runs in, as a lost
    node would; later calls lay the task's workspace with ``builder``."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        if builder is not None:
            builder(root)
        return
    os._exit(1)


def make_jobs():
    """12 jobs over 3 harness codes; job 5 has a task whose setup builder fails."""
    tasks = list(load_suite("workspace").tasks("test", limit=4, seed=3))
    jobs = [
        RolloutJob(task, Harness.named(code, BYTE_LIMITS), seed=i, tags={"job": i})
        for i, (task, code) in enumerate((t, c) for t in tasks for c in CODES)
    ]
    jobs[5] = dataclasses.replace(jobs[5], task=broken_setup(jobs[5].task))
    return jobs


def signature(trajectory):
    """What must agree between backends: identity, outcome, and every sampled token."""
    return (
        trajectory.task_id,
        trajectory.config,
        trajectory.status,
        trajectory.passed,
        [turn.completion_ids for turn in trajectory.turns],
    )


def test_ray_backend_matches_in_process_engine_for_the_oracle():
    jobs = make_jobs()
    in_process = RolloutEngine(OraclePolicy(), max_concurrent=4, env_workers=2)
    expected, expected_stats = in_process.run(jobs)
    seen = []
    with RayRolloutEngine(
        functools.partial(OraclePolicy),
        num_workers=2,
        max_concurrent=4,
        env_workers=2,
        chunk_size=2,
        on_trajectory=lambda index, trajectory: seen.append(index),
    ) as engine:
        trajectories, stats = engine.run(jobs)

    assert [signature(t) for t in trajectories] == [signature(t) for t in expected]
    assert [t.metrics.get("tag_job") for t in trajectories[:5]] == [0, 1, 2, 3, 4]
    broken = trajectories[5]
    assert broken.task_id.endswith("-broken") and broken.status == "error"
    assert "FileNotFoundError" in broken.error
    assert sum(t.passed for t in trajectories) == 11  # the oracle passes every sound job
    assert sorted(seen) == list(range(len(jobs)))
    assert (stats.episodes, stats.errored, stats.passed) == (12, 1, 11)
    assert stats.tokens_generated == expected_stats.tokens_generated > 0


def test_ray_backend_matches_in_process_engine_for_a_seeded_random_policy():
    """RandomPolicy draws every episode's text from one RNG, so a worker's output depends on the
    jobs it ran before: with one chunk per worker, each worker's chunk must match a fresh
    in-process engine (one episode at a time, so the draw order is fixed) over that chunk."""
    jobs = make_jobs()
    halves = [jobs[:6], jobs[6:]]
    expected = []
    for half in halves:
        engine = RolloutEngine(RandomPolicy(seed=7), max_concurrent=1, env_workers=1)
        expected += engine.run(half)[0]
    with RayRolloutEngine(
        functools.partial(RandomPolicy, seed=7),
        num_workers=2,
        max_concurrent=1,
        env_workers=1,
        chunk_size=6,
    ) as engine:
        trajectories, stats = engine.run(jobs)

    assert [signature(t) for t in trajectories] == [signature(t) for t in expected]
    assert trajectories[5].status == "error"
    assert stats.errored == sum(t.status == "error" for t in expected)
    assert any(len(t.turns) > 1 for t in trajectories)  # the comparison covers multi-turn episodes


def test_episodes_of_a_worker_that_dies_mid_step_run_again_on_another():
    jobs = make_jobs()[:6]
    expected, _ = RolloutEngine(OraclePolicy(), max_concurrent=2).run(jobs)
    marker = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"harnessrl-ray-death-{os.getpid()}-{id(jobs)}")
    task = jobs[2].task
    dies_once = dataclasses.replace(task.setup, builder=functools.partial(exit_process_once, marker, task.setup.builder))
    jobs[2] = dataclasses.replace(jobs[2], task=dataclasses.replace(task, setup=dies_once))
    engine = RayRolloutEngine(functools.partial(OraclePolicy), num_workers=2, max_concurrent=2, chunk_size=2)
    try:
        with engine:
            trajectories, stats = engine.run(jobs)
            survivors = len(engine._actors)
    finally:
        died = os.path.exists(marker)
        if died:
            os.remove(marker)
    assert died  # a worker process really ended mid-chunk
    assert [signature(t) for t in trajectories] == [signature(t) for t in expected]
    # Job 5's task is broken (an error inside its episode, as in process); the others pass.
    assert [t.passed for t in trajectories] == [True] * 5 + [False] and (stats.episodes, stats.errored) == (6, 1)
    assert engine.rerun_jobs == 2 and survivors == 1  # jobs 2 and 3 ran again on the other worker


def test_jobs_of_a_worker_that_dies_are_errors_and_the_others_finish():
    """Without retries (``max_chunk_retries=0``) a dead worker's jobs are error trajectories;
    with them, a task that kills every worker it reaches is bounded the same way."""
    jobs = make_jobs()[:6]
    crash = dataclasses.replace(jobs[2].task, setup=TaskSetup(builder=exit_process))
    jobs[2] = dataclasses.replace(jobs[2], task=crash)
    engine = RayRolloutEngine(
        functools.partial(OraclePolicy), num_workers=2, max_concurrent=2, chunk_size=2, max_chunk_retries=0
    )
    with engine:
        trajectories, stats = engine.run(jobs)
        survivors = len(engine._actors)

    assert [t.task_id for t in trajectories] == [job.task.id for job in jobs]
    assert [t.status == "error" for t in trajectories] == [False, False, True, True, False, True]
    assert (
        "ray worker failed" in trajectories[2].error
        and "ray worker failed" in trajectories[3].error
    )
    assert [t.passed for t in trajectories] == [True, True, False, False, True, False]
    assert survivors == 1 and (stats.episodes, stats.errored) == (6, 3)

    retried = RayRolloutEngine(functools.partial(OraclePolicy), num_workers=2, max_concurrent=2, chunk_size=2,
                               max_chunk_retries=1)
    with retried:
        trajectories, stats = retried.run(jobs)
    assert [t.status == "error" for t in trajectories][2:4] == [True, True]
    assert "ray worker failed" in trajectories[2].error and retried.rerun_jobs == 2
    # The crash reached both workers: none is left, and the jobs no one ran are errors too.
    assert retried._actors == [] and trajectories[0].passed and trajectories[1].passed
    assert stats.errored == sum(t.status == "error" for t in trajectories) >= 2


def test_unpicklable_job_is_a_clear_error_before_any_episode_runs():
    jobs = make_jobs()[:3]
    locked = dataclasses.replace(jobs[1].task, metadata={"lock": threading.Lock()})
    jobs[1] = dataclasses.replace(jobs[1], task=locked)
    engine = RayRolloutEngine(functools.partial(OraclePolicy), num_workers=1)
    engine._start = lambda: setattr(engine, "_actors", ["no actor needed"])  # fail before any work
    with pytest.raises(
        TypeError, match=r"rollout job 1 \(task .*\) cannot be sent to a Ray worker"
    ):
        engine.run(jobs)


def test_policy_that_cannot_be_built_is_a_clear_error():
    engine = RayRolloutEngine(functools.partial(int, "not a policy"), num_workers=1)
    with pytest.raises(RuntimeError, match="could not build its policy"):
        engine.run(make_jobs()[:1])
    assert engine._actors == []


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'harnessrl\[ray\]'"):
        RayRolloutEngine(functools.partial(OraclePolicy))


def test_merged_stats_add_counts_and_weight_batch_sizes():
    parts = [
        RolloutStats(
            episodes=2, passed=1, generation_calls=1, tokens_generated=10, mean_batch_size=2.0
        ),
        RolloutStats(
            episodes=3, errored=1, generation_calls=3, tokens_generated=5, mean_batch_size=1.0
        ),
    ]
    merged = merge_stats(parts, wall_time_s=2.0)
    assert merged.episodes == 5 and merged.errored == 1 and merged.passed == 1
    assert merged.tokens_generated == 15
    assert merged.mean_batch_size == pytest.approx((2.0 * 1 + 1.0 * 3) / 4)
    assert merged.tokens_per_s == pytest.approx(7.5)
