"""Rescue groups and routers (Harness-S): dead groups only, advantages, accounting, votes, state."""

from __future__ import annotations

import itertools
import random

import pytest

from harnessrl.rescue.groups import (
    GroupInfo,
    RescueStats,
    apply_rescue,
    dead_groups,
    mixture_harnesses,
    plan_rescue,
    signal_metrics,
)
from harnessrl.rescue.router import (
    VOTE_WEIGHTS,
    PairedValidation,
    ProfileRouter,
    RandomRouter,
    TaskInfo,
    ValidationRouter,
    aggregate_votes,
)
from harnessrl.rl.advantages import grpo_advantages
from harnessrl.trajectory import Trajectory, Turn

SIBLINGS = [f"H{i}" for i in range(1, 11)]


def traj(task: str, harness: str, passed: bool, tokens: int = 3) -> Trajectory:
    turn = Turn(index=0, prompt_ids=[1, 2], prompt_spans=[("task", 2)], completion_ids=list(range(tokens)),
                completion_logprobs=[-0.1] * tokens, finish_reason="stop", text="x")
    return Trajectory(task_id=task, config=harness, harness=harness, turns=[turn], passed=passed,
                      reward=1.0 if passed else 0.0, status="submitted")


def step_rollouts(outcomes: dict[int, list[bool]]) -> tuple[list[Trajectory], list[int], list[GroupInfo]]:
    trajectories, groups, infos = [], [], []
    for group, passes in outcomes.items():
        infos.append(GroupInfo(group, TaskInfo(f"t{group}", family="files"), "H0"))
        for passed in passes:
            trajectories.append(traj(f"t{group}", "H0", passed))
            groups.append(group)
    return trajectories, groups, infos


def test_only_groups_where_every_rollout_failed_are_dead():
    trajectories, groups, _ = step_rollouts({0: [False] * 4, 1: [True, False, False, False], 2: [True] * 4,
                                             3: [False] * 4})
    assert dead_groups(trajectories, groups) == [0, 3]


def test_rescue_replaces_dead_groups_and_keeps_the_rest_in_order():
    trajectories, groups, infos = step_rollouts({0: [False] * 4, 1: [True, False, False, False], 2: [False] * 4})
    dead = [i for i in infos if i.group in dead_groups(trajectories, groups)]
    runs = plan_rescue("siblings", dead, 4, RandomRouter(), lambda h0: SIBLINGS, seed=0)
    assert [r.group for r in runs] == [0] * 4 + [2] * 4
    assert len({r.harness for r in runs if r.group == 0}) == 4  # K distinct siblings, never H0
    assert all(r.harness != "H0" for r in runs)
    # Group 0's rescue has one success; group 2's rescue fails entirely.
    rescue = [traj(f"t{r.group}", r.harness, passed=(r.group == 0 and r.member == 1)) for r in runs]
    stats = RescueStats(groups=3, dead=2, base_rollouts=12)
    new_t, new_g = apply_rescue(trajectories, groups, runs, rescue, stats)
    assert new_g == [1] * 4 + [0] * 4 + [2] * 4
    assert new_t[:4] == trajectories[4:8]  # the live group untouched
    assert [t.harness for t in new_t[4:8]] == [r.harness for r in runs[:4]]
    assert (stats.rescued, stats.rescue_dead, stats.rescue_rollouts) == (1, 1, 8)
    metrics = stats.metrics()
    assert metrics["rescue_success_rate"] == 0.5 and metrics["executor_rollouts_vs_grpo"] == pytest.approx(20 / 12)
    assert sum(metrics["sibling_selections"].values()) == 8


def test_rescue_group_advantages_match_a_slow_reference_and_a_dead_rescue_gives_zero():
    trajectories, groups, infos = step_rollouts({0: [False] * 4, 1: [True, False, True, False]})
    runs = plan_rescue("siblings", [infos[0]], 4, RandomRouter(), lambda h0: SIBLINGS, seed=3)
    rescue = [traj("t0", r.harness, passed=r.member in (0, 3)) for r in runs]
    new_t, new_g = apply_rescue(trajectories, groups, runs, rescue, RescueStats())
    advantages = grpo_advantages([t.reward for t in new_t], new_g)
    for group in set(new_g):  # slow reference: (r - mean) / population std, per group
        rewards = [t.reward for t, g in zip(new_t, new_g, strict=True) if g == group]
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        expected = [(r - mean) / max(std, 1e-6) for r in rewards]
        got = [a for a, g in zip(advantages, new_g, strict=True) if g == group]
        assert got == pytest.approx(expected)
    assert signal_metrics(new_t, new_g, advantages)["valid_group_ratio"] == 1.0
    before = grpo_advantages([t.reward for t in trajectories], groups)
    assert signal_metrics(trajectories, groups, before) == {"valid_group_ratio": 0.5, "effective_token_ratio": 0.5}


@pytest.mark.parametrize("mode", ["siblings", "h0"])
def test_h0_rescue_and_sibling_rescue_cost_the_same_executor_rollouts(mode):
    trajectories, groups, infos = step_rollouts({g: [False] * 8 for g in range(3)} | {3: [True] * 8})
    dead = [i for i in infos if i.group in dead_groups(trajectories, groups)]
    runs = plan_rescue(mode, dead, 8, RandomRouter(), lambda h0: SIBLINGS, seed=0)
    assert len(runs) == 3 * 8
    if mode == "h0":
        assert {r.harness for r in runs} == {"H0"}


def test_fixed_mixture_has_the_group_size_and_the_fraction_of_siblings():
    harnesses = mixture_harnesses("H0", SIBLINGS, 8, 0.5, seed=1)
    assert len(harnesses) == 8 and harnesses.count("H0") == 4 and len(set(harnesses[4:])) == 4
    assert mixture_harnesses("H0", [], 8, 0.5, seed=1) == ["H0"] * 8
    with pytest.raises(ValueError, match=r"sibling_fraction must be in \[0, 1\]"):
        mixture_harnesses("H0", SIBLINGS, 8, 1.5, seed=1)


def test_plain_grpo_plans_no_rescue_and_an_unknown_mode_is_refused():
    _, _, infos = step_rollouts({0: [False] * 2})
    assert plan_rescue("none", infos, 8, None, lambda h0: SIBLINGS, seed=0) == []
    with pytest.raises(ValueError, match="unknown rescue mode 'dapo'"):
        plan_rescue("dapo", infos, 8, None, lambda h0: SIBLINGS, seed=0)
    with pytest.raises(ValueError, match="needs a router"):
        plan_rescue("siblings", infos, 8, None, lambda h0: SIBLINGS, seed=0)


def brute_force_votes(rankings, siblings):
    scores = dict.fromkeys(siblings, 0.0)
    for ranking in rankings:
        cleaned = []
        for name in ranking:
            if name in siblings and name not in cleaned:
                cleaned.append(name)
        for place, name in enumerate(cleaned):
            scores[name] += [1.0, 0.75, 0.5, 0.25][place] if place < 4 else 0.0
    return scores


def test_vote_aggregation_matches_brute_force_with_weights_1_three_quarters_half_quarter():
    assert VOTE_WEIGHTS == (1.0, 0.75, 0.5, 0.25)
    rng = random.Random(0)
    siblings = SIBLINGS[:6]
    for _ in range(200):
        rankings = [rng.sample([*siblings, "bogus"], rng.randint(0, 7)) + rng.sample(siblings, 1) for _ in range(3)]
        assert aggregate_votes(rankings, siblings) == pytest.approx(brute_force_votes(rankings, siblings))


def test_profile_router_takes_the_top_k_of_the_votes_breaks_ties_by_seed_and_counts_garbage():
    def voter(order):
        return lambda task, profiles: list(order)

    def garbage(task, profiles):
        raise ValueError("not a ranking")

    router = ProfileRouter([voter(["H3", "H1", "H2"]), voter(["H1", "H3"]), garbage])
    task = TaskInfo("t1")
    # H3: 1 + .75 = 1.75; H1: .75 + 1 = 1.75 (a tie); H2: .5
    top = router.route(task, "H0", ["H1", "H2", "H3", "H4"], 3, seed=0)
    assert set(top[:2]) == {"H1", "H3"} and top[2] == "H2"
    assert router.malformed_votes == 1 and router.votes == 3
    orders = {tuple(router.route(task, "H0", ["H1", "H2", "H3", "H4"], 2, seed=s)) for s in range(20)}
    assert orders == {("H1", "H3"), ("H3", "H1")}  # the tie goes either way, decided by the seed
    with pytest.raises(ValueError, match="needs at least one voter"):
        ProfileRouter([])


def test_validation_router_ranks_by_margin_over_h0_and_re_anchoring_changes_the_routing():
    tasks = [f"t{i}" for i in range(6)]
    first = PairedValidation(outcomes={
        "H0": dict.fromkeys(tasks, False),
        "H1": {t: i < 4 for i, t in enumerate(tasks)}, "H2": {t: i < 1 for i, t in enumerate(tasks)},
        "H3": dict.fromkeys(tasks, False),
    }, step=0)
    router = ValidationRouter(first, track=["H0"])
    assert router.route(TaskInfo("x"), "H0", ["H1", "H2", "H3"], 2, seed=0) == ["H1", "H2"]
    later = PairedValidation(outcomes={
        "H0": {t: i < 3 for i, t in enumerate(tasks)},
        "H1": {t: i < 2 for i, t in enumerate(tasks)}, "H2": dict.fromkeys(tasks, True),
        "H3": {t: i < 3 for i, t in enumerate(tasks)},
    }, step=10)
    router.set_record(later)
    assert router.route(TaskInfo("x"), "H0", ["H1", "H2", "H3"], 1, seed=0) == ["H2"]
    assert [h["step"] for h in router.history] == [0, 10]
    assert router.history[0]["margins"]["H0"]["H1"] == pytest.approx(4 / 6)
    assert router.history[1]["margins"]["H0"]["H1"] == pytest.approx(-1 / 6)  # nonstationarity is recorded


def test_margins_are_relative_to_each_groups_own_h0():
    record = PairedValidation(outcomes={"A": {"t": True, "u": False}, "B": {"t": False, "u": False},
                                        "S": {"t": True, "u": True}})
    assert record.margin("S", "A") == pytest.approx(0.5) and record.margin("S", "B") == pytest.approx(1.0)
    assert record.margin("S", "missing") is None


def test_per_family_validation_uses_the_task_family_when_it_has_evidence():
    record = PairedValidation(
        outcomes={"H0": {"a": False, "b": False, "c": False, "d": False},
                  "H1": {"a": True, "b": True, "c": False, "d": False},
                  "H2": {"a": False, "b": False, "c": True, "d": False}},
        families={"a": "files", "b": "files", "c": "sqlite", "d": "sqlite"},
    )
    router = ValidationRouter(record, per_family=True)
    assert router.route(TaskInfo("z", family="sqlite"), "H0", ["H1", "H2"], 1, seed=0) == ["H2"]
    assert router.route(TaskInfo("z", family="files"), "H0", ["H1", "H2"], 1, seed=0) == ["H1"]
    assert router.route(TaskInfo("z", family="code"), "H0", ["H1", "H2"], 1, seed=0) == ["H1"]  # overall


def test_router_state_round_trips_and_routes_the_same_after_restore():
    record = PairedValidation(outcomes={"H0": {"a": False, "b": True}} | {
        name: {"a": i % 3 == 0, "b": i % 2 == 0} for i, name in enumerate(SIBLINGS)})
    router, restored = ValidationRouter(record, per_family=True), ValidationRouter()
    assert restored.route(TaskInfo("t1"), "H0", SIBLINGS, 3, 0) != router.route(TaskInfo("t1"), "H0", SIBLINGS, 3, 0)
    restored.load_state_dict(router.state_dict())
    assert restored.per_family and restored.history == router.history
    for seed, task in itertools.product(range(5), ["t1", "t2"]):
        assert router.route(TaskInfo(task), "H0", SIBLINGS, 3, seed) == restored.route(TaskInfo(task), "H0", SIBLINGS, 3, seed)
    voters = [lambda task, profiles: sorted(profiles)]
    profile = ProfileRouter(voters, profiles={"H1": {"prefer": [{"when": "sqlite", "behavior": "reads schema"}]}})
    again = ProfileRouter(voters)
    again.load_state_dict(profile.state_dict())
    assert again.profiles == profile.profiles


def test_a_sibling_spec_is_parsed_once_the_same_way_everywhere():
    from harnessrl.cli.eval import route_members
    from harnessrl.rescue.sibling_source import SiblingSource
    from harnessrl.rl.config import load_config

    assert SiblingSource.parse("space") == SiblingSource(1, ())
    assert SiblingSource.parse("space:2+pool:pools/a+pool:pools/b") == SiblingSource(2, ("pools/a", "pools/b"))
    h0 = "S0-T0-O0-C0-W0"
    neighbours = SiblingSource.parse("space").siblings_of(h0)
    assert len(neighbours) == 10 and h0 not in neighbours  # 5 factors x 2 other levels
    assert route_members(h0) == (h0, neighbours)  # eval --route lists the same siblings
    assert set(neighbours) < set(SiblingSource.parse("space:2").siblings_of(h0))
    # design: the run's other training configurations (the OA(18) rows), after the space's neighbours
    assert SiblingSource.parse("space+design") == SiblingSource(1, (), True)
    rows = ["S0-T0-O0-C0-W0", "S0-T1-O1-C1-W1", "S2-T2-O2-C2-W2", neighbours[0]]
    assert SiblingSource.parse("design").siblings_of(h0, design=rows) == rows[1:]
    assert SiblingSource.parse("space+design").siblings_of(h0, design=rows) == neighbours + rows[1:3]
    assert SiblingSource.parse("space").siblings_of(h0, design=rows) == neighbours
    from harnessrl.design import make_design
    from harnessrl.harness.registry import default_space
    from harnessrl.rl.rescue import Rescue

    cfg = load_config(preset="quick", overrides={"rescue": "siblings", "siblings": "design", "router": "random"})
    codes = make_design(default_space(), "orthogonal").codes
    rescue = Rescue(cfg, codes, [], lambda name: None, lambda step, index: 0, log=lambda m: None, check_endpoints=False)
    assert len(codes) == 18 and rescue.siblings_of(codes[3]) == codes[:3] + codes[4:]
    for bad in ("spaces", "space:0", "pool:", "space+pool", "designs"):
        with pytest.raises(ValueError, match="is not 'space', 'space:R'"):
            SiblingSource.parse(bad)
        with pytest.raises(ValueError, match="is not 'space', 'space:R'"):  # config validation: the same parse
            load_config(preset="quick", overrides={"siblings": bad})
