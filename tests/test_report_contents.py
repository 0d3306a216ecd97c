"""What the reports show: decoded prompts for every scripted policy, one Pass@1 column,
``units`` explained, the model named, integer step ticks, the update diagnostics plotted and
bars that are visible at 0."""

from __future__ import annotations

import json

import pytest

from harnessrl.eval.evaluate import score_trajectories
from harnessrl.eval.report import (
    UPDATE_DIAGNOSTICS,
    is_scripted_policy,
    make_decoder,
    plot_learning_curves,
    plot_per_config,
    write_eval_report,
    write_run_report,
)
from harnessrl.harness.harness import Harness
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rollout.episode import run_episode
from harnessrl.tasks.suite import load_suite


@pytest.fixture(scope="module")
def episodes():
    """Returns (task, trajectory) pairs of the oracle under an in-space and an out-of-space harness."""
    tasks = list(load_suite("workspace").tasks("test", limit=2, seed=3))
    return [(task, run_episode(Harness.named(code), task, OraclePolicy()))
            for code in ("S1-T1-O1-C1-W0", "codex-like") for task in tasks]


@pytest.fixture
def oracle_trajectories(episodes):
    return [trajectory for _, trajectory in episodes]


@pytest.mark.parametrize("name", ["oracle", "random", "replay", "gold-replay", "callback", "faulty"])
def test_every_scripted_policy_name_is_decoded_bytewise(name, episodes):
    for _, trajectory in episodes:
        trajectory.policy = name
    decode = make_decoder([trajectory for _, trajectory in episodes])
    for task, trajectory in episodes:
        assert task.instruction.splitlines()[0] in decode(trajectory.turns[0].prompt_ids)


def test_gold_replay_episodes_show_their_task_text_in_the_report(tmp_path, episodes):
    for _, trajectory in episodes:
        trajectory.policy = "gold-replay"
    trajectories = [trajectory for _, trajectory in episodes]
    write_eval_report(tmp_path, score_trajectories(trajectories, 1).to_dict(), trajectories)
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert any(task.instruction.splitlines()[0][:60] in markdown for task, _ in episodes)


def test_model_backed_names_are_not_scripted():
    assert not any(is_scripted_policy(n) for n in ("hf:model", "vllm:x", "openai:gpt@http://h/v1", ""))


def test_eval_report_has_one_pass_at_1_column_explains_units_and_names_the_policy(tmp_path, oracle_trajectories):
    for trajectory in oracle_trajectories:
        trajectory.policy = "oracle"
    results = score_trajectories(oracle_trajectories, 1).to_dict()
    results["meta"] = {"policy": "oracle", "source": "oracle", "model": None, "k": 1}
    write_eval_report(tmp_path, results, oracle_trajectories)
    markdown = (tmp_path / "report" / "report.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| set |"))
    assert [c.strip().lower() for c in header.split("|")].count("pass@1") == 1, header
    assert "units: the (task, harness) pairs" in markdown
    assert "model: oracle" in markdown and "model: None" not in markdown


def test_learning_curves_have_integer_step_ticks_and_the_update_diagnostics(tmp_path):
    records = [{"step": s, "reward_mean": 0.1 * s, "update/pg_loss": 0.5 - 0.1 * s, "update/entropy": 1.0,
                "update/grad_norm": 2.0, "lr": 1e-5, "update/clipfrac_high": 0.0} for s in range(2)]
    fig = plot_learning_curves({"run": records}, ["reward_mean"])
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks), ticks


def test_run_report_plots_the_update_diagnostics(tmp_path):
    from harnessrl.rl.config import load_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(load_config(preset="quick", overrides={"run_dir": str(run)}).model_dump_json())
    records = [{"step": s, "reward_mean": 0.1, "pass_rate": 0.1, "no_signal_fraction": 0.5, "lr": 1e-5,
                **{key: 0.1 * (s + 1) for key in UPDATE_DIAGNOSTICS if key != "lr"}} for s in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_run_report(run)
    assert (run / "report" / "img" / "update-diagnostics.png").stat().st_size > 1000
    assert "update-diagnostics.png" in (run / "report" / "report.md").read_text()


def test_a_zero_bar_is_drawn():
    per_config = {"A": {"pass_at_1": 0.5, "group": "train"}, "B": {"pass_at_1": 0.0, "group": "train"}}
    fig = plot_per_config(per_config, {"A": {"pass_at_1": 0.0}, "B": {"pass_at_1": 0.0}})
    ax = fig.axes[0]
    marks = [point for collection in ax.collections for point in collection.get_offsets().tolist()]
    # Three of the four bars are 0: each has a mark at the axis where its bar would be.
    assert len(marks) == 3 and all(y < 2 for _, y in marks)
