"""Token-level rendering and trajectories: exact ids, span labels, save/load, training samples."""

import pytest

from harnessrl.harness.base import (
    SPAN_FORMAT,
    SPAN_OBSERVATION,
    SPAN_POLICY,
    SPAN_SYSTEM,
    SPAN_TASK,
    Message,
)
from harnessrl.harness.chat import ByteTokenizer
from harnessrl.trajectory import Trajectory, Turn, load_jsonl, run_length, save_jsonl

TOK = ByteTokenizer()


def test_render_labels_every_token_and_reuses_sampled_ids():
    sampled = [*TOK.encode("ls -la"), TOK.im_end_id]
    messages = [
        Message("system", "sys", SPAN_SYSTEM),
        Message("user", "do it", SPAN_TASK),
        Message("assistant", "IGNORED TEXT", SPAN_POLICY, token_ids=tuple(sampled)),
        Message("user", "out", SPAN_OBSERVATION),
    ]
    rendered = TOK.render(messages)
    assert len(rendered.ids) == len(rendered.spans)
    text = TOK.decode(rendered.ids)
    assert text == (
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\ndo it<|im_end|>\n"
        "<|im_start|>assistant\nls -la<|im_end|>\n<|im_start|>user\nout<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    policy_ids = [i for i, s in zip(rendered.ids, rendered.spans, strict=True) if s == SPAN_POLICY]
    assert policy_ids == sampled  # the sampled ids, stop token included, never re-tokenized
    task_text = TOK.decode([i for i, s in zip(rendered.ids, rendered.spans, strict=True) if s == SPAN_TASK])
    assert task_text == "do it"
    assert rendered.spans[-1] == SPAN_FORMAT


def test_truncated_policy_message_gets_a_closing_footer():
    sampled = TOK.encode("partial")  # finish_reason length: no stop token
    rendered = TOK.render([Message("assistant", "", SPAN_POLICY, token_ids=tuple(sampled))], add_generation_prompt=False)
    assert TOK.decode(rendered.ids).endswith("partial<|im_end|>\n")


def make_turn(index, prompt, completion):
    return Turn(
        index=index,
        prompt_ids=prompt,
        prompt_spans=run_length(["task"] * len(prompt)),
        completion_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        finish_reason="stop",
    )


def test_training_samples_merge_append_only_turns_and_split_rewrites():
    t0 = make_turn(0, [1, 2, 3], [4, 5])
    t1 = make_turn(1, [1, 2, 3, 4, 5, 6, 7], [8])  # extends prompt+completion: merged
    t2 = make_turn(2, [1, 2, 9], [10, 11])  # rewritten context: new sequence
    traj = Trajectory(task_id="t", config="S0-T0-O0-C0-W0", harness="S0-T0-O0-C0-W0", turns=[t0, t1, t2])
    samples = traj.training_samples()
    assert len(samples) == 2
    assert samples[0].input_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert samples[0].loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert samples[0].old_logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5]
    assert samples[1].loss_mask == [0, 0, 0, 1, 1]
    unmerged = traj.training_samples(merge=False)
    assert len(unmerged) == 3
    trained = [i for s in samples for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m]
    assert trained == [4, 5, 8, 10, 11]  # exactly the sampled ids


def test_trajectory_jsonl_round_trip(tmp_path):
    traj = Trajectory(
        task_id="t1", config="S1-T2-O0-C1-W2", harness="S1-T2-O0-C1-W2",
        turns=[make_turn(0, [1, 2], [3])], reward=1.0, passed=True, status="submitted", answer="42",
        metrics={"turns": 1},
    )
    path = tmp_path / "traj.jsonl"
    save_jsonl([traj, traj], path)
    loaded = load_jsonl(path)
    assert len(loaded) == 2 and loaded[0] == traj


def test_bad_jsonl_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "x", "config": "c", "harness": "h"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        load_jsonl(path)


def test_turn_rejects_misaligned_spans():
    with pytest.raises(ValueError, match="spans do not cover"):
        Turn(0, [1, 2], [("task", 1)], [3], [0.0], "stop")
