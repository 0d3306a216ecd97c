"""What RL taught a run: the training-reward change between the first and last quarter of its
steps (interval over tasks) and the weights' relative movement, on scripted inputs."""

import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from harnessrl.experiment.learning import GROUPS_KEY, relative_movement, reward_gain, same_task_gain


def record(step, groups):
    return {"step": step, GROUPS_KEY: [[task, reward] for task, reward in groups]}


def test_reward_gain_compares_the_first_and_last_quarter_task_by_task():
    # 8 steps: quarters are steps 1-2 and 7-8; task a appears twice in the first quarter
    records = [record(1, [("a", 0.0), ("b", 0.25)]), record(2, [("a", 0.5), ("c", 0.0)])]
    records += [record(s, [("x", 1.0), ("y", 0.0)]) for s in range(3, 7)]  # the middle does not count
    records += [record(7, [("d", 0.75), ("e", 1.0)]), record(8, [("d", 0.25), ("f", 0.5)])]
    records.append({"step": 9})  # a record without groups (a step written before they were logged)
    gain = reward_gain(records)
    first = np.mean([np.mean([0.0, 0.5]), 0.25, 0.0])  # a's two groups average first: the mean is over tasks
    last = np.mean([np.mean([0.75, 0.25]), 1.0, 0.5])
    assert gain["steps"] == 8 and gain["steps_per_part"] == 2
    assert gain["tasks_first"] == 3 and gain["tasks_last"] == 3
    assert gain["first"] == pytest.approx(first) and gain["last"] == pytest.approx(last)
    assert gain["gain"] == pytest.approx(last - first)
    low, high = gain["ci"]
    assert low < gain["gain"] < high and low > 0  # every resample of these tasks has the last above the first
    assert reward_gain(list(reversed(records)))["gain"] == pytest.approx(gain["gain"])  # order of records is not time


def test_reward_gain_is_none_without_groups_and_its_interval_covers_zero_for_noise():
    assert reward_gain([{"step": 1}, {"step": 2}]) is None
    assert reward_gain([record(1, [("a", 1.0)])]) is None  # one step has no first and last part
    rng = np.random.default_rng(0)
    records = [record(s, [(f"t{s}-{i}", float(rng.integers(0, 2))) for i in range(4)]) for s in range(1, 41)]
    low, high = reward_gain(records)["ci"]
    assert low < 0 < high  # coin flips: no learning to find


def test_same_task_gain_holds_the_tasks_fixed_where_the_frontier_moves_to_harder_ones():
    # The policy learns each task (+0.5 from the first half to the second) while the frontier
    # swaps the easy new tasks of the first half for hard new ones: the quarter measure sees
    # nothing, the same-task measure sees the rise on a, b and c.
    records = [record(s, [("a", 0.25), ("b", 0.0), ("c", 0.25), (f"easy{s}", 0.75)]) for s in range(1, 5)]
    records += [record(s, [("a", 0.75), ("b", 0.5), ("c", 0.75), (f"hard{s}", 0.0)]) for s in range(5, 9)]
    assert reward_gain(records)["gain"] == pytest.approx(0.0)  # (0.25+0+0.25+0.75)/4 both sides
    same = same_task_gain(records)
    assert same["tasks"] == 3 and same["steps_per_part"] == 4
    assert same["first"] == pytest.approx(0.5 / 3) and same["last"] == pytest.approx(2.0 / 3)
    assert same["gain"] == pytest.approx(0.5) and same["ci"] == pytest.approx([0.5, 0.5])
    records[5][GROUPS_KEY][1][1] = 0.0  # b unlearned in one late group: the interval opens around a lower mean
    same = same_task_gain(records)
    assert same["gain"] == pytest.approx((0.5 + 0.375 + 0.5) / 3) and same["ci"][0] < same["gain"] < same["ci"][1]
    # no task in both halves, or a single step: nothing to pair
    assert same_task_gain([record(1, [("a", 0.0)]), record(2, [("b", 1.0)])]) is None
    assert same_task_gain([record(1, [("a", 0.0), ("b", 1.0)])]) is None


def write_model(folder, tensors):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_relative_movement_is_the_norm_of_the_change_over_all_weights(tmp_path):
    start = {"a": torch.tensor([[3.0, 0.0], [0.0, 4.0]]), "b": torch.zeros(3, dtype=torch.bfloat16)}
    moved = {"a": torch.tensor([[3.0, 1.0], [0.0, 4.0]]), "b": torch.tensor([0.0, 2.0, 0.0], dtype=torch.bfloat16),
             "only_here": torch.ones(5)}
    value = relative_movement(write_model(tmp_path / "moved", moved), write_model(tmp_path / "start", start))
    assert value == pytest.approx(math.sqrt(1.0 + 4.0) / 5.0)  # sqrt(1^2 + 2^2) / ||(3, 4)||
    assert relative_movement(tmp_path / "start", tmp_path / "start") == 0.0
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file({"lora_A": torch.ones(2, 2)}, str(adapter / "adapter_model.safetensors"))
    assert relative_movement(adapter, tmp_path / "start") is None  # no adapter config: not a LoRA checkpoint


def test_a_lora_checkpoint_moves_the_merged_weights_by_its_scaled_adapters(tmp_path):
    import json

    start = write_model(tmp_path / "start", {"model.layers.0.q_proj.weight": torch.full((4, 3), 2.0),
                                             "model.embed_tokens.weight": torch.ones(5, 3)})
    a, b = torch.arange(6.0).reshape(2, 3) / 10, torch.arange(8.0).reshape(4, 2) / 10  # r = 2
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file({"base_model.model.model.layers.0.q_proj.lora_A.weight": a,
               "base_model.model.model.layers.0.q_proj.lora_B.weight": b}, str(adapter / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 8, "rank_pattern": {}, "alpha_pattern": {}}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    merged_delta = 4.0 * b @ a  # lora_alpha / r = 4: what peft's merge adds to q_proj
    start_norm = math.sqrt(12 * 4.0 + 15 * 1.0)
    assert relative_movement(adapter, start) == pytest.approx(float(merged_delta.norm()) / start_norm)
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": True}))
    assert relative_movement(adapter, start) == pytest.approx(float((8.0 / math.sqrt(2)) * (b @ a).norm()) / start_norm)
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    assert relative_movement(adapter, start) is None  # DoRA rescales columns: not this formula
