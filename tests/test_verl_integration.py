"""The parts of the verl integration that need nothing of verl (they run in the project's
environment): one sequence per episode, the pairing dataset, the rescue rows. The agent loop
itself runs against verl in tests_verl/ (`make test-verl`)."""

from __future__ import annotations

import pytest

from harnessrl.design import make_design
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.harness.registry import default_space
from harnessrl.integrations.verl import AGENT_NAME
from harnessrl.integrations.verl.dataset import append_only_configs, build_rows
from harnessrl.integrations.verl.rescue import dead_group_keys, rescue_rows
from harnessrl.integrations.verl.sequence import (
    NotAppendOnly,
    episode_sequence,
    require_append_only,
)
from harnessrl.pairing import PairingSchedule
from harnessrl.policy.scripted import CallbackPolicy, OraclePolicy
from harnessrl.rescue.router import RandomRouter
from harnessrl.rollout.episode import run_episode
from harnessrl.tasks.model import Action
from harnessrl.tasks.suite import select_tasks

# The oracle writes whole files in bytes (ByteTokenizer): give it room.
BYTE_LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)


@pytest.fixture(scope="module")
def tasks():
    return select_tasks("workspace", "train", 6, 0)


def test_an_append_only_episode_is_one_sequence_with_exactly_the_policy_tokens_masked_in(tasks):
    trajectory = run_episode(Harness.named("S1-T2-O1-C0-W2", BYTE_LIMITS), tasks[0], OraclePolicy())
    assert trajectory.passed and len(trajectory.turns) >= 2
    sequence = episode_sequence(trajectory.turns)
    assert sequence.prompt_ids == trajectory.turns[0].prompt_ids
    full = sequence.prompt_ids + sequence.response_ids
    for turn in trajectory.turns:  # each turn saw prompt + response so far, and sampled the next ids
        start = len(turn.prompt_ids)
        assert full[:start] == turn.prompt_ids
        assert full[start:start + len(turn.completion_ids)] == turn.completion_ids
    sampled = [t for t, m in zip(sequence.response_ids, sequence.response_mask, strict=True) if m]
    assert sampled == [t for turn in trajectory.turns for t in turn.completion_ids]
    assert sequence.policy_tokens == trajectory.n_policy_tokens
    assert len(sequence.response_logprobs) == len(sequence.response_ids)


def test_a_masking_context_is_refused_up_front_and_on_its_tokens(tasks):
    with pytest.raises(NotAppendOnly, match="ObservationWindow"):
        require_append_only(Harness.named("S0-T0-O0-C1-W0"))
    with pytest.raises(NotAppendOnly, match="Compaction"):
        require_append_only(Harness.named("S0-T0-O0-C2-W0"))
    # A C1 episode with more observations than it keeps is not one sequence, and says so.
    harness = Harness.named("S0-T0-O0-C1-W0", HarnessLimits(max_turns=6, max_new_tokens=16_384, context_tokens=262_144))
    keep_running = CallbackPolicy(lambda episode: episode.harness.tools.render(Action.run("echo step")))
    trajectory = run_episode(harness, tasks[0], keep_running)
    assert trajectory.status == "max_turns" and len(trajectory.turns) > type(harness.context).keep + 1
    with pytest.raises(NotAppendOnly, match="context was rewritten"):
        episode_sequence(trajectory.turns)
    # the same commands under C0 are one sequence
    episode_sequence(run_episode(Harness.named("S0-T0-O0-C0-W0", harness.limits), tasks[0], keep_running).turns)


def test_the_dataset_rows_reproduce_the_pairing_schedule(tasks):
    configs = append_only_configs(make_design(default_space(), "orthogonal").configs, "keep-c0")
    assert configs and all(c["C"] == 0 for c in configs)
    rows = build_rows("workspace", tasks, make_design(default_space(), "orthogonal").configs,
                      n_steps=6, tasks_per_step=3, k=2, seed=5, append_only="keep-c0")
    schedule = PairingSchedule([t.id for t in tasks], configs, 3, 2, "neighbour", 5)
    assert len(rows) == 6 * 3
    for step, pairs in enumerate(schedule.steps(6)):
        batch = rows[step * 3:(step + 1) * 3]  # verl's batch of step t with train_batch_size=3, no shuffle
        assert [(r["task_id"], r["harness"], r["slot"], r["anchor"]) for r in batch] == [
            (p.task, p.config.code, p.slot, p.anchor.code) for p in pairs
        ]
        assert all(r["agent_name"] == AGENT_NAME and r["step"] == step and r["suite"] == "workspace" for r in batch)
    # K=2: each task's two configurations are Hamming neighbours within one round
    by_round: dict[tuple[int, str], list[str]] = {}
    for row in rows:
        by_round.setdefault((row["round"], row["task_id"]), []).append(row["harness"])
    space = default_space()
    for codes in by_round.values():
        assert len(codes) == 2 and codes[0] != codes[1]
        a, b = space.parse(codes[0]), space.parse(codes[1])
        assert sum(x != y for x, y in zip(a.levels, b.levels, strict=True)) >= 1


def test_a_design_with_rewriting_contexts_is_refused_by_default(tasks):
    with pytest.raises(NotAppendOnly, match="12 of 18 design configurations"):
        build_rows("workspace", tasks, make_design(default_space(), "orthogonal").configs, 2, 3)
    with pytest.raises(ValueError, match="unknown append_only"):
        append_only_configs(make_design(default_space(), "orthogonal").configs, "drop")


def test_rescue_rows_put_each_dead_group_under_k_siblings(tasks):
    rows = build_rows("workspace", tasks, make_design(default_space(), "orthogonal").configs,
                      n_steps=1, tasks_per_step=3, append_only="keep-c0")
    groups = {f"uid{i}": row for i, row in enumerate(rows)}
    keys = ["uid0", "uid0", "uid1", "uid1", "uid2", "uid2"]
    dead = dead_group_keys(keys, [False, False, True, False, False, False])
    assert dead == ["uid0", "uid2"]
    siblings = {row["harness"]: [c.code for c in default_space().neighbours(default_space().parse(row["harness"]))]
                for row in rows}
    rescue = rescue_rows(groups, dead, "siblings", 2, RandomRouter(), siblings.__getitem__, seed=0)
    assert [r["rescues"] for r in rescue] == ["uid0", "uid0", "uid2", "uid2"]
    for row in rescue:
        base = groups[row["rescues"]]
        assert row["task_id"] == base["task_id"] and row["harness"] in siblings[base["harness"]]
        assert row["harness"] != base["harness"] and row["agent_name"] == AGENT_NAME
    assert [r["harness"] for r in rescue_rows(groups, dead, "h0", 2, None, siblings.__getitem__, 0)] == [
        groups["uid0"]["harness"]] * 2 + [groups["uid2"]["harness"]] * 2
    with pytest.raises(ValueError, match="2 group keys but 1 outcomes"):
        dead_group_keys(["a", "b"], [True])
