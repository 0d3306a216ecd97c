"""Dynamic sampling and the task frontier (rl/sampling.py, rl/frontier.py) over scripted runs:
only mixed groups are kept, the round limit holds, the rollouts are counted, the frontier's
estimates match a slow reference, and the K-step pairing survives both."""

import numpy as np
import pytest

from harnessrl.design import make_design
from harnessrl.harness.registry import default_space
from harnessrl.pairing import PairingSchedule
from harnessrl.rl.frontier import FrontierSettings, TaskFrontier
from harnessrl.rl.sampling import StepSampler, has_signal
from harnessrl.trajectory import Trajectory

G = 4


def schedule(n_tasks=12, tasks_per_step=3, k=2, seed=0):
    design = make_design(default_space(), "orthogonal", seed=seed)
    return PairingSchedule([f"t{i}" for i in range(n_tasks)], design.configs, tasks_per_step, k, "neighbour", seed)


class ScriptedRuns:
    """Rolls out G episodes per pair; each task passes with a fixed probability (0, 1 or
    mixed), drawn from a seeded stream per (step, round, task). Records every call."""

    def __init__(self, pass_rates, step=0):
        self.pass_rates, self.step, self.calls = pass_rates, step, []

    def __call__(self, pairs, round_):
        self.calls.append((round_, [(p.task, p.config.code, p.slot) for p in pairs]))
        groups = []
        for pair in pairs:
            rng = np.random.default_rng([self.step, round_, int(pair.task[1:])])
            rate = self.pass_rates[pair.task]
            passed = [bool(rng.random() < rate) for _ in range(G)]
            groups.append([Trajectory(pair.task, pair.config.code, pair.config.code, reward=float(p), passed=p)
                           for p in passed])
        return groups, None


def test_dynamic_sampling_keeps_only_mixed_groups_and_counts_its_rollouts():
    sched = schedule()
    rates = {t: (0.5 if int(t[1:]) % 3 == 0 else 0.0) for t in sched.task_ids}  # t0, t3, t6, t9 mixed
    sampler = StepSampler(sched, seed=1, max_rounds=5)
    runs = ScriptedRuns(rates)
    out = sampler.run(0, runs)
    assert len(out.groups) == 3 and all(len(g) == G for g in out.groups)
    kept = [g for g in out.groups if has_signal(g)]
    drawn = sum(len(pairs) for _, pairs in runs.calls)
    assert out.metrics["sampling/groups_drawn"] == drawn
    assert out.metrics["sampling/extra_rollouts"] == G * (drawn - 3)
    assert out.metrics["sampling/rounds"] == len(runs.calls) - 1 <= 5
    assert out.metrics["sampling/groups_kept"] == len(kept)
    # Every replacement kept was mixed; replacements run under the configuration they replace.
    first = runs.calls[0][1]
    for _, pairs in runs.calls[1:]:
        assert {code for _, code, _ in pairs} <= {code for _, code, _ in first}
        assert not {task for task, _, _ in pairs} & {task for task, _, _ in first}  # new tasks, not the same again
    assert len(kept) == 3  # four mixed tasks exist: five rounds find the missing ones


def test_dynamic_sampling_stops_at_its_round_limit_and_fills_with_dead_groups():
    sched = schedule()
    rates = dict.fromkeys(sched.task_ids, 0.0)  # nothing ever passes: every round is dead
    runs = ScriptedRuns(rates)
    out = StepSampler(sched, seed=0, max_rounds=2).run(0, runs)
    assert [round_ for round_, _ in runs.calls] == [0, 1, 2]  # the first pass and exactly 2 rounds
    assert out.metrics["sampling/rounds"] == 2 and out.metrics["sampling/groups_kept"] == 0
    assert out.metrics["sampling/extra_rollouts"] == 2 * 3 * G
    # The step is filled with the first pass's dead groups (rescue's input), in their order.
    assert [p.task for p in out.pairs] == [task for task, _, _ in runs.calls[0][1]]
    assert out.first_pass == out.groups


def test_dynamic_sampling_off_is_the_schedule_and_one_pass():
    sched = schedule()
    runs = ScriptedRuns(dict.fromkeys(sched.task_ids, 0.0))
    out = StepSampler(sched, seed=0).run(3, runs)
    assert len(runs.calls) == 1 and out.metrics["sampling/extra_rollouts"] == 0
    assert [(p.task, p.config.code) for p in out.pairs] == [(p.task, p.config.code) for p in sched.step(3)]


def test_frontier_estimates_match_a_slow_reference_over_a_scripted_run():
    settings = FrontierSettings(decay=0.6, prior=1.5, low=0.2, high=0.8, explore=0.0)
    tasks = [f"t{i}" for i in range(5)]
    frontier = TaskFrontier(tasks, settings)
    rng = np.random.default_rng(7)
    history: dict[str, list[list[bool]]] = {t: [] for t in tasks}
    for _ in range(40):
        task = tasks[int(rng.integers(5))]
        group = [bool(x) for x in rng.random(int(rng.integers(1, 6))) < 0.3 + 0.1 * int(task[1:])]
        frontier.observe(task, group)
        history[task].append(group)
    for task in tasks:  # the estimate written out: sum_i decay^(n-1-i) * count_i, with the prior
        groups = history[task]
        n = len(groups)
        passes = sum(settings.decay ** (n - 1 - i) * sum(g) for i, g in enumerate(groups))
        trials = sum(settings.decay ** (n - 1 - i) * len(g) for i, g in enumerate(groups))
        assert frontier.estimate(task) == pytest.approx((passes + 1.5) / (trials + 3.0))
        assert frontier.on_frontier(task) == (0.2 <= frontier.estimate(task) <= 0.8)
    state = frontier.state_dict()
    copy = TaskFrontier(tasks, settings)
    copy.load_state_dict(state)
    assert [copy.estimate(t) for t in tasks] == [frontier.estimate(t) for t in tasks]


def test_frontier_draws_prefer_uncertain_tasks_and_explore_unseen_ones():
    tasks = [f"t{i}" for i in range(30)]
    frontier = TaskFrontier(tasks, FrontierSettings(decay=1.0, explore=0.25))
    for i, task in enumerate(tasks[:20]):  # seen: t0-t9 never pass, t10-t19 half the time
        for _ in range(3):
            frontier.observe(task, [i >= 10 and j % 2 == 0 for j in range(4)])
    assert set(frontier.members()) == set(tasks[10:])  # unseen tasks (1/2) and the mixed ones
    counts = {t: 0 for t in tasks}
    for seed in range(200):
        drawn = frontier.draw(8, np.random.default_rng(seed))
        assert len(set(drawn)) == 8
        assert sum(t in tasks[20:] for t in drawn) >= 2  # round(0.25 * 8) explored among the unseen
        for t in drawn:
            counts[t] += 1
    assert sum(counts[t] for t in tasks[:10]) == 0  # never-solved tasks are off the frontier
    # A frontier smaller than the draw falls back to the least certain remaining tasks.
    small = frontier.draw(8, np.random.default_rng(0), exclude=tasks[10:])
    assert len(small) == 8 and set(small) <= set(tasks[:10])


def test_frontier_rounds_keep_the_k_step_pairing():
    sched = schedule(n_tasks=20, tasks_per_step=3, k=2)
    sampler = StepSampler(sched, seed=5, frontier=FrontierSettings(), max_rounds=0)
    rates = {t: 0.5 for t in sched.task_ids}
    for round_index in range(4):
        first = sampler.pairs(2 * round_index)
        sampler.run(2 * round_index, ScriptedRuns(rates, step=2 * round_index))
        second = sampler.pairs(2 * round_index + 1)
        assert [p.task for p in first] == [p.task for p in second]  # each task on K successive steps
        for item, (a, b) in enumerate(zip(first, second, strict=True)):
            configs = sched.round_configs(round_index, item)
            assert (a.config, b.config) == (configs[0], configs[1]) and a.anchor == b.anchor == configs[0]
            assert (a.slot, b.slot) == (0, 1)


def test_a_kept_replacement_takes_its_items_place_for_the_rest_of_the_round():
    sched = schedule(n_tasks=20, tasks_per_step=3, k=2)
    sampler = StepSampler(sched, seed=2, frontier=FrontierSettings(explore=0.0), max_rounds=4)
    first = sampler.pairs(0)
    rates = {t: 0.5 for t in sched.task_ids}
    rates[first[1].task] = 0.0  # item 1's task is dead under the policy
    out = sampler.run(0, ScriptedRuns(rates))
    replaced = [p for p in out.pairs if p.task != first[1].task and p.task not in {first[0].task, first[2].task}]
    assert replaced and replaced[0].config == first[1].config  # under the configuration it replaced
    second = sampler.pairs(1)
    assert second[1].task == replaced[0].task  # it continues under item 1's second configuration
    assert second[1].config == sched.round_configs(0, 1)[1]
    assert [second[0].task, second[2].task] == [first[0].task, first[2].task]
    # The sampler's state carries the round's tasks and the frontier across a resume.
    resumed = StepSampler(sched, seed=2, frontier=FrontierSettings(explore=0.0), max_rounds=4)
    resumed.load_state_dict(sampler.state_dict())
    assert [p.task for p in resumed.pairs(1)] == [p.task for p in second]
    assert resumed.frontier.estimate(first[1].task) == sampler.frontier.estimate(first[1].task) < 0.5
