"""Dynamic sampling and the task frontier inside the real trainer on a tiny model: the rounds
and rollouts are logged and counted, a run killed with SIGKILL resumes with the same frontier
state and sampling rounds, and the learning-curve plots are drawn from metrics.jsonl."""

import json

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from checkpoint_helpers import kill_train_when, write_run_config  # noqa: E402
from harnessrl.eval.report import curve_keys, eval_curve, plot_learning_curves, write_run_report  # noqa: E402
from harnessrl.experiment.compare import executor_rollouts  # noqa: E402
from harnessrl.rl.config import load_config  # noqa: E402
from harnessrl.rl.loop import train  # noqa: E402

SAMPLING = ("sampling/rounds", "sampling/groups_drawn", "sampling/groups_kept", "sampling/extra_rollouts",
            "sampling/first_pass_reward", "frontier/size", "frontier/seen", "frontier/drawn_estimates")


def overrides(model, run_dir, steps):
    return {
        "model": str(model), "run_dir": str(run_dir), "steps": steps, "tasks_per_step": 2, "group_size": 2,
        "k": 2, "max_turns": 1, "max_new_tokens": 8, "max_train_tasks": 12, "sft_warm_start_steps": 0,
        "eval_base": True, "eval_every": 2, "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": False,
        "learning_rate": 1e-3, "temperature": 1.0, "seed": 4, "save_every": 1, "keep_checkpoints": 2,
        "frontier": True, "dynamic_sampling_rounds": 2, "frontier_explore": 0.5,
    }


def records_of(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_frontier_run_logs_its_rounds_and_resumes_after_sigkill_with_the_same_state(tiny_model, tmp_path):
    steps = 4
    reference_dir = tmp_path / "reference"
    train(load_config(preset="quick", overrides=overrides(tiny_model, reference_dir, steps)), log=lambda m: None)
    reference = records_of(reference_dir)
    assert [r["step"] for r in reference] == list(range(steps))
    for record in reference:
        assert set(SAMPLING) <= set(record)
        assert record["episodes"] == 2 * 2  # the trained step keeps tasks_per_step groups
        # Each round redraws every group still without signal; each drawn group is G rollouts.
        assert record["sampling/extra_rollouts"] == 2 * (record["sampling/groups_drawn"] - 2)
        assert record["sampling/rounds"] <= 2
        assert record["trained_tokens"] >= 0
    # The K-step pairing: the tasks of step 2r (when no replacement took over) continue at step 2r+1.
    for r in range(steps // 2):
        first, second = reference[2 * r]["pairs"], reference[2 * r + 1]["pairs"]
        if reference[2 * r]["sampling/groups_kept"] == 0:
            assert [p[0] for p in first] == [p[0] for p in second]
    spent = executor_rollouts(reference_dir)
    assert spent["sampling"] == sum(r["sampling/extra_rollouts"] for r in reference)
    assert spent["vs_grpo"] == pytest.approx((spent["first_pass"] + spent["sampling"]) / spent["first_pass"])

    killed_dir = tmp_path / "killed"
    config_file = write_run_config(tmp_path / "run.yaml", overrides(tiny_model, killed_dir, steps))
    kill_train_when(config_file, killed_dir, (killed_dir / "checkpoints" / "step-000001").exists)  # inside round 0
    train(load_config(config_file, overrides={"run_dir": str(killed_dir)}), resume=True, log=lambda m: None)
    resumed = records_of(killed_dir)
    assert [r["step"] for r in resumed] == list(range(steps))
    for key in ("pairs", "tokens_generated", *SAMPLING):
        assert [r[key] for r in resumed] == [r[key] for r in reference], key


def test_learning_curves_are_drawn_from_the_recorded_metrics(tiny_model, tmp_path):
    run_dir = tmp_path / "curves"
    train(load_config(preset="quick", overrides=overrides(tiny_model, run_dir, 3)), log=lambda m: None)
    records = records_of(run_dir)
    keys = curve_keys(records)
    assert {"sampling/first_pass_reward", "valid_group_ratio", "frontier/size"} <= set(keys)
    figure = plot_learning_curves({"run": records}, keys)
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
    for key in keys:  # each panel holds its series, step by step, as recorded
        (line,) = panels[key].get_lines()
        assert list(line.get_xdata()) == [r["step"] + 1 for r in records]
        assert list(line.get_ydata()) == pytest.approx([r[key] for r in records])
    curve = eval_curve(run_dir, records)["in_space"]
    assert [p["step"] for p in curve] == [-1, 1, 2]  # before step 1, after 2 (eval_every), after the last (3)
    assert curve[1]["pass_at_1"] == records[1]["eval"]["in_space"]["pass_at_1"]
    control = {"before step 1": curve[0]["pass_at_1"]}
    figure = plot_learning_curves({"in_space": curve}, ["pass_at_1"], lines=control)
    (ax,) = [a for a in figure.axes if a.get_visible()]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and set(dashed[0].get_ydata()) == {curve[0]["pass_at_1"]}
    html = write_run_report(run_dir).read_text()
    assert "img/learning-curves.png" in html and "img/eval-curve.png" in html
    assert (run_dir / "report" / "img" / "eval-curve.png").stat().st_size > 1000
