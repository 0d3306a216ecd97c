"""`report_to: [tensorboard]`: the TensorBoard event files hold the scalars of metrics.jsonl
at each step, and the evaluations as text; metrics.jsonl stays the source of truth."""

import json

import pytest

from harnessrl.rl.config import load_config
from harnessrl.rl.tracking import Tracker, eval_table, scalars

pytest.importorskip("tensorboard", reason="tensorboard is in the dev extra: pip install 'harnessrl[dev]'")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def events(run_dir):
    accumulator = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def test_scalars_flatten_nested_numbers_and_leave_out_the_rest():
    record = {"step": 2, "reward_mean": 0.5, "pairs": [["t", "S0"]], "eval": {"in_space": {"pass_at_1": 0.25}},
              "flag": True, "note": "x", "nan": float("nan")}
    assert dict(scalars(record)) == {"step": 2.0, "reward_mean": 0.5, "eval/in_space/pass_at_1": 0.25}


def test_eval_table_has_a_row_per_set():
    table = eval_table("final", {"in_space": {"pass_at_1": 0.5, "pass_at_1_ci": [0.25, 0.75], "episodes": 4}})
    assert "| in_space | 0.500 | 0.250 to 0.750 | 4 |" in table


def test_tracker_writes_every_logged_scalar_per_step(tmp_path):
    records = [{"step": s, "reward_mean": 0.1 * s, "update/grad_norm": 1.0 + s, "pairs": []} for s in range(3)]
    tracker = Tracker(tmp_path, ["tensorboard"], {}, log=lambda message: None)
    for record in records:
        tracker.log_step(record)
    tracker.log_eval("final", {"in_space": {"pass_at_1": 0.5, "episodes": 2}}, step=3)
    tracker.close()
    accumulator = events(tmp_path)
    got = [(e.step, e.value) for e in accumulator.Scalars("update/grad_norm")]
    assert got == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert [e.step for e in accumulator.Scalars("reward_mean")] == [0, 1, 2]
    assert accumulator.Scalars("eval_final/in_space/pass_at_1")[0].value == 0.5
    text = accumulator.Tensors("eval/final/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| in_space | 0.500 |" in text
    assert "eval/final/text_summary" in accumulator.Tags()["tensors"]


def test_a_tiny_run_reports_the_keys_of_metrics_jsonl_to_tensorboard(tiny_model, tmp_path):
    from harnessrl.rl.loop import train

    run_dir = tmp_path / "run"
    overrides = {
        "model": str(tiny_model), "run_dir": str(run_dir), "steps": 2, "tasks_per_step": 1, "group_size": 2,
        "max_turns": 1, "max_new_tokens": 8, "max_train_tasks": 4, "sft_warm_start_steps": 0, "eval_base": False,
        "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": False, "seed": 3, "report_to": ["tensorboard"],
    }
    train(load_config(preset="quick", overrides=overrides), log=lambda message: None)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accumulator = events(run_dir)
    tags = set(accumulator.Tags()["scalars"])
    for record in records:
        for key, value in scalars(record):
            logged = {e.step: e.value for e in accumulator.Scalars(key)}
            assert logged[record["step"]] == pytest.approx(value, rel=1e-6), key
    assert {"reward_mean", "pass_rate", "lr"} <= tags
    assert "eval/final/text_summary" in accumulator.Tags()["tensors"]


def test_report_to_refuses_an_unknown_tracker():
    with pytest.raises(ValueError, match="report_to"):
        load_config(preset="quick", overrides={"report_to": ["mlflow"]})
