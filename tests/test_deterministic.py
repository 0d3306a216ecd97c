"""`deterministic: true` gives the same numbers twice whatever else the machine runs: the engine's
batches are a function of the jobs (lockstep, job order), observations carry no wall-clock
values, and two tiny-model trainings, one beside a CPU-heavy process, write the same metrics,
rollouts and summaries."""

import json
import subprocess
import sys
import time

import pytest

from harnessrl.harness import Harness, HarnessLimits
from harnessrl.harness.base import CallVerdict, EpisodeHooks
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks import Action, FileEquals, Task
from harnessrl.trajectory import load_jsonl

BYTE_LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)


class SlowFirstCall(EpisodeHooks):
    """Holds one episode's first tool call for ``delay_s`` seconds: a slow sandbox step."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def before_call(self, call, state):
        if state.turn == 0:
            time.sleep(self.delay_s)
        return CallVerdict()


class BatchRecorder(OraclePolicy):
    """The oracle, recording which jobs (by seed) each policy call batched, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    def generate(self, requests):
        self.batches.append([request.context.seed for request in requests])
        return super().generate(requests)


def three_step_task(index: int) -> Task:
    return Task(
        id=f"steps-{index}", instruction=f"Write a.txt, b.txt and c.txt, each containing {index}.",
        verifier=FileEquals("c.txt", f"{index}"),
        gold=[Action.write(name, f"{index}\n") for name in ("a.txt", "b.txt", "c.txt")] + [Action.submit("")],
    )


def batches_with_slow_job(slow: int, deterministic: bool) -> list[list[int]]:
    """Runs 6 jobs, 4 in flight, job ``slow``'s first tool call held 1.5 s; returns the batches."""
    policy = BatchRecorder()
    jobs = []
    for index in range(6):
        harness = Harness.named("S0-T0-O2-C0-W0", BYTE_LIMITS)
        harness.hooks = SlowFirstCall(1.5 if index == slow else 0.0)
        jobs.append(RolloutJob(three_step_task(index), harness, seed=index))
    engine = RolloutEngine(policy, max_concurrent=4, env_workers=4, batch_wait_s=0.3, deterministic=deterministic)
    trajectories, _ = engine.run(jobs)
    assert all(t.passed for t in trajectories), [(t.task_id, t.status, t.error) for t in trajectories]
    return policy.batches


def test_lockstep_batches_do_not_depend_on_which_episode_is_slow():
    first, second = batches_with_slow_job(0, True), batches_with_slow_job(1, True)
    assert first == second
    assert all(batch == sorted(batch) for batch in first)
    assert first[0] == [0, 1, 2, 3]  # four in flight; the two left join as the first finish
    assert sorted(seed for batch in first for seed in batch) == sorted(list(range(6)) * 4)  # 4 turns each


def test_without_lockstep_a_slow_episode_moves_the_batches():
    """The control: the engine's default batches whoever is ready, so timing decides."""
    first, second = batches_with_slow_job(0, False), batches_with_slow_job(1, False)
    assert first != second, first


def oracle_observations(code: str, limits: HarnessLimits, task: Task) -> list[str]:
    trajectories, _ = RolloutEngine(OraclePolicy(), max_concurrent=1, env_workers=1).run(
        [RolloutJob(task, Harness.named(code, limits))]
    )
    return [turn.observation for turn in trajectories[0].turns if turn.observation]


SLEEPY = Task(id="sleepy", instruction="Run sleep, then write done.txt.", verifier=FileEquals("done.txt", "done"),
              gold=[Action.run("sleep 0.2 && echo slept"), Action.run("sleep 5"), Action.write("done.txt", "done\n"),
                    Action.submit("")])


def test_structured_observations_show_a_fixed_wall_time_stand_in():
    limits = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144, command_timeout_s=1.0)
    measured = [json.loads(o.splitlines()[0]) for o in oracle_observations("S0-T0-O2-C0-W0", limits, SLEEPY)]
    assert measured[0]["stdout"] == "slept\n" and measured[0]["wall_time_s"] >= 0.2  # O2 shows the clock
    fixed_limits = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144, command_timeout_s=1.0,
                                 fixed_wall_time=True)
    fixed = [json.loads(o.splitlines()[0]) for o in oracle_observations("S0-T0-O2-C0-W0", fixed_limits, SLEEPY)]
    assert fixed[0]["stdout"] == "slept\n" and fixed[0]["wall_time_s"] == 0.0
    assert fixed[1]["timed_out"] is True and fixed[1]["wall_time_s"] == 1.0  # a timeout shows its limit
    assert all(record["wall_time_s"] in (0.0, 1.0) for record in fixed)


def test_codex_header_shows_the_stand_in_too():
    limits = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144, command_timeout_s=1.0, fixed_wall_time=True)
    observations = oracle_observations("codex-like", limits, SLEEPY)
    assert observations[0].startswith("Exit code: 0\nWall time: 0.0 seconds")
    assert "command timed out after 1000 milliseconds" in observations[1]


def test_a_listing_of_the_starting_files_shows_a_fixed_date():
    """``ls -l`` of the files a task lays out shows when the episode ran, unless the run is
    deterministic: then every starting entry carries 2026-01-01 (an RL run's turn-2 prompts
    differed between two runs of one experiment by this alone)."""
    from harnessrl.tasks.model import TaskSetup

    listing = Task(id="listing", instruction="List the notes.", verifier=FileEquals("notes/a.md", "a\n"),
                   setup=TaskSetup(files={"notes/a.md": "a\n", "b.txt": "b\n"}),
                   gold=[Action.run("ls -l --time-style=+%Y-%m-%d notes b.txt; stat -c %Y notes ."), Action.submit("")])
    measured = oracle_observations("S0-T0-O0-C0-W0", HarnessLimits(max_new_tokens=16_384, context_tokens=262_144),
                                   listing)[0]
    assert "notes" in measured and "2026-01-01" not in measured and "1767225600" not in measured
    fixed = oracle_observations("S0-T0-O0-C0-W0", HarnessLimits(max_new_tokens=16_384, context_tokens=262_144,
                                                                fixed_wall_time=True), listing)[0]
    assert fixed.count("2026-01-01") == 2  # notes/a.md and b.txt
    assert fixed.count("1767225600") == 2  # the folder and the workspace itself


# -- two trainings ---------------------------------------------------------------------------

# metrics.jsonl keys that measure the machine, not the run: left out of the comparison.
TIMING_KEYS = ("rollout_time_s", "update_time_s", "memory/rss_mb", "memory/peak_rss_mb")
# Per-trajectory metrics that are timings.
TRAJECTORY_TIMING_KEYS = ("sandbox_time_s", "harness_time_s")


def run_record(run_dir):
    """Returns what two runs must share: metrics without timings, the summary without its
    folder, and every rollout's and evaluation episode's tokens, log-probs and observations."""
    metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
               for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = {k: v for k, v in json.loads((run_dir / "summary.json").read_text()).items() if k != "run_dir"}
    episodes = {}
    for path in sorted([*(run_dir / "rollouts").glob("*.jsonl"), *(run_dir / "eval").glob("*.jsonl")]):
        episodes[path.name] = [
            (t.task_id, t.config, t.status, t.reward,
             {k: v for k, v in t.metrics.items() if k not in TRAJECTORY_TIMING_KEYS},
             [(turn.prompt_ids, turn.completion_ids, turn.completion_logprobs, turn.observation) for turn in t.turns])
            for t in load_jsonl(path)
        ]
    return metrics, summary, episodes


def train_twice_one_beside_a_cpu_hog(tiny_model, tmp_path, deterministic: bool):
    pytest.importorskip("torch", reason="torch is installed by `make test`")
    from checkpoint_helpers import train_command, train_env, write_run_config

    # Multi-turn episodes and warm-start demonstrations under O2 (the 4th design configuration),
    # and every group trained (zero advantages, but log-probs, entropy and the KL to the
    # rollout policy are measured on every sampled token).
    overrides = {
        "model": str(tiny_model), "steps": 3, "tasks_per_step": 2, "group_size": 2, "max_turns": 2,
        "max_new_tokens": 16, "max_train_tasks": 8, "sft_warm_start_steps": 2, "sft_tasks": 4, "eval_tasks": 2,
        "eval_held_out": 1, "eval_out_of_space": True, "micro_batch_tokens": 4096, "learning_rate": 1e-3,
        "temperature": 1.0, "seed": 3, "save_every": 100, "keep_checkpoints": 1, "skip_no_signal_groups": False,
        "deterministic": deterministic,
    }
    config = write_run_config(tmp_path / "run.yaml", overrides)
    records = []
    for name, beside in (("quiet", False), ("loaded", True)):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if beside else None
        try:
            out = subprocess.run(train_command(config, tmp_path / name), env=train_env(), capture_output=True,
                                 text=True, timeout=900)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        assert out.returncode == 0, out.stderr[-3000:]
        records.append(run_record(tmp_path / name))
    return records


def test_two_tiny_trainings_one_beside_a_cpu_hog_give_the_same_numbers(tiny_model, tmp_path):
    quiet, loaded = train_twice_one_beside_a_cpu_hog(tiny_model, tmp_path, deterministic=True)
    (quiet_metrics, quiet_summary, quiet_episodes), (loaded_metrics, loaded_summary, loaded_episodes) = quiet, loaded
    assert len(quiet_metrics) == 3
    for a, b in zip(quiet_metrics, loaded_metrics, strict=True):
        assert a == b, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
    assert quiet_summary == loaded_summary
    assert quiet_summary["warm_start"]["demonstrations"] >= 4  # the O2 demonstrations were trained on
    assert quiet_episodes.keys() == loaded_episodes.keys() and len(quiet_episodes) >= 5
    for name in quiet_episodes:
        assert quiet_episodes[name] == loaded_episodes[name], name
