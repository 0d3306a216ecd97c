"""Pairing schedules: neighbours at minimum distance, resumability, balanced coverage."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.design import orthogonal, random_design
from harnessrl.harness.registry import default_space
from harnessrl.pairing import PairingSchedule

DESIGN = orthogonal(default_space())
TASKS = [f"task-{i}" for i in range(50)]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 1000), st.integers(2, 4))
def test_neighbour_pairs_each_anchor_with_a_minimum_distance_config(seed, k):
    configs = random_design(default_space(), 18, seed=seed).configs  # varied distances
    schedule = PairingSchedule(TASKS, configs, tasks_per_step=8, k=k, seed=seed)
    for round_index in range(5):
        for item in range(8):
            chosen = schedule.round_configs(round_index, item)
            anchor, neighbours = chosen[0], chosen[1:]
            assert len(set(chosen)) == k
            others = sorted(anchor.hamming(c) for c in configs if c != anchor)
            assert sorted(anchor.hamming(c) for c in neighbours) == others[: k - 1]


def test_k_configs_of_a_task_come_on_successive_steps():
    schedule = PairingSchedule(TASKS, DESIGN.configs, tasks_per_step=4, k=2, seed=1)
    first, second = schedule.step(0), schedule.step(1)
    assert [p.task for p in first] == [p.task for p in second]
    for a, b in zip(first, second, strict=True):
        assert a.slot == 0 and b.slot == 1 and a.config == b.anchor
        assert a.config.hamming(b.config) == 3  # the OA's nearest neighbours are at distance 3
    assert {p.task for p in schedule.step(2)} != {p.task for p in first} or len(TASKS) <= 4


def test_repeat_and_random_strategies():
    repeat = PairingSchedule(TASKS, DESIGN.configs, 4, k=2, strategy="repeat", seed=0)
    assert [p.config for p in repeat.step(0)] == [p.config for p in repeat.step(1)]
    rand = PairingSchedule(TASKS, DESIGN.configs, 16, k=2, strategy="random", seed=0)
    distances = [b.config.hamming(b.anchor) for t in range(1, 40, 2) for b in rand.step(t)]
    assert min(distances) >= 3 and max(distances) > 3  # random others, not only nearest
    single = PairingSchedule(TASKS, DESIGN.configs, 4, k=1, seed=0)
    assert all(p.slot == 0 and p.config == p.anchor for p in single.step(5))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 200), st.integers(0, 10**6), st.sampled_from(["neighbour", "repeat", "random"]))
def test_schedule_is_identical_after_resume(resume_at, seed, strategy):
    original = PairingSchedule(TASKS, DESIGN.configs, 6, k=2, strategy=strategy, seed=seed)
    reference = [original.step(t) for t in range(resume_at + 5)]
    resumed = PairingSchedule(TASKS, DESIGN.configs, 6, k=2, strategy=strategy, seed=seed)
    assert list(resumed.steps(5, start=resume_at)) == reference[resume_at:]


def test_every_task_once_per_epoch():
    schedule = PairingSchedule(TASKS, DESIGN.configs, tasks_per_step=10, k=2, seed=7)
    rounds = [schedule.step(2 * r) for r in range(5)]  # 5 rounds x 10 tasks = one epoch
    assert sorted(p.task for b in rounds for p in b) == sorted(TASKS)


def test_long_schedule_covers_factor_pair_cells_in_proportion():
    schedule = PairingSchedule(TASKS, DESIGN.configs, tasks_per_step=16, k=2, seed=0)
    stats = schedule.statistics(3000)
    assert set(stats.config_counts) == set(DESIGN.codes)
    for cells in stats.factor_pair_cells.values():
        assert len(cells) == 9  # all 9 level pairs of every factor pair are covered
    assert stats.cell_imbalance() < 1.15
    counts = list(stats.config_counts.values())
    assert max(counts) / min(counts) < 1.25


def test_bad_schedule_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown strategy"):
        PairingSchedule(TASKS, DESIGN.configs, 4, strategy="nearest")
    with pytest.raises(ValueError, match="K=19 needs at least 19"):
        PairingSchedule(TASKS, DESIGN.configs, 4, k=19)
    with pytest.raises(ValueError, match="at least one task"):
        PairingSchedule([], DESIGN.configs, 4)
