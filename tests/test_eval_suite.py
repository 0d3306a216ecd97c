"""Evaluation: pass@k against brute force, bootstrap coverage, evaluation sets, behaviour
metrics on hand-built and real episodes, per-factor analysis, and `harnessrl eval`."""

import dataclasses
import itertools
import json
import re
import sys
import types
from math import comb

import numpy as np
import pytest

from harnessrl.cli import main
from harnessrl.design import make_design, orthogonal
from harnessrl.eval import sets
from harnessrl.eval.analysis import distance_curve, factor_marginals, pairwise_interactions
from harnessrl.eval.behaviour import behaviour_metrics, episode_counts
from harnessrl.eval.metrics import bootstrap_ci, pass_at_k, score_runs
from harnessrl.eval.sets import resolve_eval_set, resolve_harness_set
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.harness.registry import default_space
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rollout.episode import run_episode
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.suite import load_suite
from harnessrl.trajectory import Trajectory, Turn

SPACE = default_space()
DESIGN = orthogonal(SPACE)
ORACLE_LIMITS = HarnessLimits(max_turns=12, max_new_tokens=16_384, context_tokens=262_144)


# --- pass@k and intervals -------------------------------------------------------------------


def test_pass_at_k_matches_brute_force_for_every_small_case():
    for n in range(1, 8):
        for c in range(n + 1):
            runs = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                direct = sum(any(runs[i] for i in s) for s in subsets) / len(subsets)
                assert len(subsets) == comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(direct), (n, c, k)


def test_score_runs_reports_pass_at_1_as_mean_over_runs_and_pass_at_k_per_unit():
    units = [[True, False, False], [False, False, False], [True, True, False]]
    scores = score_runs(units, k=3)
    assert scores["pass_at_1"] == pytest.approx((1 / 3 + 0 + 2 / 3) / 3)
    assert scores["pass_at_k"] == pytest.approx(2 / 3)  # two of three units solved at least once
    assert scores["avg_at_k"] == pytest.approx(scores["pass_at_1"])
    assert scores["pass_at_1_ci"][0] <= scores["pass_at_1"] <= scores["pass_at_1_ci"][1]
    assert score_runs([[True], [False, True]], k=2)["pass_at_k"] is None  # a unit with one run


@pytest.mark.parametrize("rate", [0.3, 0.6])
def test_bootstrap_interval_covers_the_true_rate_at_about_its_nominal_level(rate):
    rng = np.random.default_rng(1234)
    trials, covered = 300, 0
    for trial in range(trials):
        sample = (rng.random(60) < rate).astype(float)
        low, high = bootstrap_ci(sample, n_boot=400, seed=trial)
        covered += low <= rate <= high
    coverage = covered / trials
    # nominal 95%; the percentile bootstrap at n=60 runs a little under it
    assert 0.88 <= coverage <= 0.99, coverage


# --- evaluation sets --------------------------------------------------------------------------


def test_resolve_eval_set_groups_training_held_out_and_out_of_space_targets():
    targets = resolve_eval_set("train,held-out,out-of-space", DESIGN, held_out=5, seed=2)
    groups = {t.name: t.group for t in targets}
    assert [t.name for t in targets if t.group == "train"] == DESIGN.codes
    held_out = [t.name for t in targets if t.group == "in_space"]
    assert len(held_out) == 5 and not set(held_out) & set(DESIGN.codes)
    assert groups["codex-like"] == groups["aider-like"] == "out_of_space"
    # a code given explicitly is grouped by whether the design trains on it; repeats collapse
    single = make_design(SPACE, "single")
    explicit = resolve_eval_set(f"{single.codes[0]},S2-T2-O2-C2-W2,{single.codes[0]}", single)
    assert [(t.name, t.group) for t in explicit] == [(single.codes[0], "train"), ("S2-T2-O2-C2-W2", "in_space")]
    assert resolve_harness_set("design") == DESIGN.codes  # the rollout command's sets use the same function


def test_resolve_eval_set_names_the_fix_for_bad_parts():
    with pytest.raises(ValueError, match=r"neither a set .* nor a configuration code"):
        resolve_eval_set("held-out,S9-T0-O0-C0-W0", DESIGN)
    with pytest.raises(ValueError, match="no harnesses"):
        resolve_eval_set(" , ", DESIGN)


def test_ext_targets_resolve_through_the_external_agents_module():
    from harnessrl.external import external_agent_names

    targets = resolve_eval_set("ext:openclaw,held-out", DESIGN, held_out=1)
    assert targets[0] == sets.EvalTarget("ext:openclaw", "external") and targets[1].group == "in_space"
    known = ", ".join(f"ext:{name}" for name in external_agent_names())
    with pytest.raises(ValueError, match=rf"unknown external agent 'ext:codexx'; known: {re.escape(known)}"):
        resolve_eval_set("ext:codexx", DESIGN)


# --- behaviour metrics ---------------------------------------------------------------------------


def turn(index, text="", calls=(), outcomes=(), observation="", error=None, kind="action"):
    return Turn(index=index, prompt_ids=[1], prompt_spans=[("system", 1)], completion_ids=[2],
                completion_logprobs=[0.0], finish_reason="stop", text=text, calls=list(calls),
                outcomes=list(outcomes), observation=observation, error=error, kind=kind)


def call(command):
    return {"name": "bash", "arguments": {"command": command}}


def ok(failed=False, submitted=False):
    return {"tool": "bash", "failed": failed, "exit_code": 1 if failed else 0, "submitted": submitted}


def episode(turns, config="S0-T0-O0-C0-W0", submits=0):
    return Trajectory(task_id="t", config=config, harness=config, turns=turns, metrics={"submits": submits})


def test_error_recovery_counts_a_changed_successful_next_action_only():
    recovered = episode([
        turn(0, "cat a.txt", [call("cat a.txt")], [ok(failed=True)], "No such file"),
        turn(1, "ls", [call("ls")], [ok()], "b.txt"),
    ])
    repeated = episode([
        turn(0, "cat a.txt", [call("cat a.txt")], [ok(failed=True)], "No such file"),
        turn(1, "cat a.txt", [call("cat a.txt")], [ok()], "x"),
    ])
    failed_again = episode([
        turn(0, "cat a.txt", [call("cat a.txt")], [ok(failed=True)], "No such file"),
        turn(1, "cat b.txt", [call("cat b.txt")], [ok(failed=True)], "No such file"),
    ])
    assert episode_counts(recovered)["error_recovery"] == (1, 1)
    assert episode_counts(repeated)["error_recovery"] == (0, 1)
    assert episode_counts(failed_again)["error_recovery"] == (0, 1)
    assert behaviour_metrics([recovered, repeated, failed_again])["error_recovery"]["rate"] == pytest.approx(1 / 3)


def test_state_tracking_penalises_repeating_a_call_that_already_succeeded():
    trajectory = episode([
        turn(0, "ls", [call("ls")], [ok()], "a.txt"),
        turn(1, "ls", [call("ls")], [ok()], "a.txt"),
        turn(2, "cat a.txt", [call("cat a.txt")], [ok(failed=True)], "denied"),
        turn(3, "cat a.txt", [call("cat a.txt")], [ok()], "hello"),  # a retry after a failure is fresh
        turn(4, "submit", [{"name": "submit", "arguments": {}}], [ok(submitted=True)]),
    ])
    assert episode_counts(trajectory)["state_tracking"] == (3, 4)


def test_workflow_compliance_checks_the_plan_under_w1_and_the_second_submit_under_w2():
    plan = episode([turn(0, "Plan: 1. look", kind="plan", observation="Plan noted. Now carry it out, one action per response.")],
                   config="S0-T0-O0-C0-W1")
    plan_with_action = episode([turn(0, "```bash\nls\n```", kind="plan", observation=(
        "Plan noted. Actions in the planning response are not executed; carry out the plan now."))], config="S0-T0-O0-C0-W1")
    garbage = episode([turn(0, "}}{{ qq", kind="plan", observation="Plan noted. Now carry it out, one action per response.")],
                      config="S0-T0-O0-C0-W1")
    review_done = episode([turn(0)], config="S0-T0-O0-C0-W2", submits=2)
    review_skipped = episode([turn(0)], config="S0-T0-O0-C0-W2", submits=1)
    never_submitted = episode([turn(0)], config="S0-T0-O0-C0-W2", submits=0)
    react = episode([turn(0)], config="S0-T0-O0-C0-W0", submits=1)
    assert episode_counts(plan)["workflow_compliance"] == (1, 1)
    assert episode_counts(plan_with_action)["workflow_compliance"] == (0, 1)
    assert episode_counts(garbage)["workflow_compliance"] == (0, 1)  # no action, but no plan either
    assert episode_counts(review_done)["workflow_compliance"] == (1, 1)
    assert episode_counts(review_skipped)["workflow_compliance"] == (0, 1)
    assert episode_counts(never_submitted)["workflow_compliance"] == (0, 0)
    assert episode_counts(react)["workflow_compliance"] == (0, 0)
    assert behaviour_metrics([react])["workflow_compliance"]["rate"] is None  # no opportunity is not 0


def test_observation_use_and_error_rates():
    used = episode([
        turn(0, "ls", [call("ls")], [ok()], "report_2024.csv notes.md"),
        turn(1, "cat report_2024.csv", [call("cat report_2024.csv")], [ok()], "revenue,region"),
        turn(2, "garbage", error="format", observation="Could not parse"),
        turn(3, "bad tool", error="tool", observation="Unknown tool"),
    ])
    counts = episode_counts(used)
    # turn 1 names a file the listing showed; turn 2 ignores the columns the file showed
    assert counts["observation_use"] == (1, 2)
    assert counts["format_error_rate"] == (1, 4)
    assert counts["tool_error_rate"] == (1, 4)


def test_oracle_episodes_follow_every_workflow_and_recover_from_failures():
    task = next(load_suite("workspace").tasks("test", limit=1, seed=0))
    trajectories = [
        run_episode(Harness.named(code, ORACLE_LIMITS), task, OraclePolicy())
        for code in ("S0-T0-O0-C0-W1", "S1-T1-O1-C1-W2", "S2-T2-O2-C2-W0")
    ]
    assert all(t.passed for t in trajectories)
    metrics = behaviour_metrics(trajectories)
    assert metrics["workflow_compliance"]["rate"] == 1.0 and metrics["workflow_compliance"]["opportunities"] == 2
    assert metrics["format_error_rate"]["rate"] == 0.0 and metrics["tool_error_rate"]["rate"] == 0.0
    # this is an error-recovery task: the gold run fails twice and each time changes course and succeeds
    assert trajectories[0].task_id.startswith("ws-test-recovery")
    assert metrics["error_recovery"]["opportunities"] >= 2 and metrics["error_recovery"]["rate"] == 1.0
    assert any(o["submitted"] for tu in trajectories[0].turns for o in tu.outcomes)


# --- per-factor analysis -------------------------------------------------------------------------


def test_marginals_interactions_and_distance_reflect_which_levels_fail():
    # Every configuration with S=2 fails, the rest pass.
    trajectories = [
        Trajectory(task_id="t", config=c.code, harness=c.code, passed=c["S"] != 2)
        for c in SPACE.all_configs
    ] + [Trajectory(task_id="t", config="codex-like", harness="codex-like", passed=True, out_of_space=True)]
    marginals = factor_marginals(trajectories, SPACE)
    assert marginals["S"]["2"] == {"pass_at_1": 0.0, "episodes": 81}
    assert marginals["S"]["0"]["pass_at_1"] == 1.0
    assert marginals["T"]["1"]["pass_at_1"] == pytest.approx(2 / 3)
    pairs = pairwise_interactions(trajectories, SPACE)
    assert set(pairs) == {f"{a}-{b}" for a, b in itertools.combinations("STOCW", 2)}
    assert pairs["S-T"]["2,0"]["pass_at_1"] == 0.0 and pairs["S-T"]["0,2"]["pass_at_1"] == 1.0
    assert pairs["S-T"]["2,0"]["interaction"] == pytest.approx(0.0)  # S alone explains it: no interaction
    curve = distance_curve(trajectories, SPACE, DESIGN.configs)
    assert curve["0"]["configs"] == 18
    assert sum(cell["configs"] for cell in curve.values()) == 243


# --- the command ----------------------------------------------------------------------------------


def test_eval_command_writes_results_with_pass_at_k_per_config_and_a_report(tmp_path, capsys):
    out = tmp_path / "eval"
    code = main(["eval", "--policy", "oracle", "--configs", "held-out,aider-like", "--held-out", "2",
                 "--limit", "2", "--k", "2", "--out", str(out), "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    results = json.loads((out / "results.json").read_text())
    assert printed["pass_at_1"] == results["pass_at_1"] == 1.0
    assert results["pass_at_k"] == 1.0 and results["avg_at_k"] == 1.0 and results["k"] == 2
    assert len(results["per_config"]) == 3
    assert all({"pass_at_1", "pass_at_k", "avg_at_k", "pass_at_1_ci"} <= set(s) for s in results["per_config"].values())
    assert set(results["per_group"]) == {"in_space", "out_of_space"}
    assert results["behaviour"]["overall"]["format_error_rate"]["rate"] == 0.0
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 3 * 2 * 2
    html = (out / "report" / "index.html").read_text()
    assert "Headline numbers" in html and "img/eval-per-config.png" in html
    assert (out / "report" / "img" / "eval-per-config.png").stat().st_size > 1000
    assert main(["report", str(out)]) == 0  # rebuilt from the files alone


def test_eval_tiers_and_families_choose_the_tasks(tmp_path):
    from harnessrl.trajectory import load_jsonl

    out = tmp_path / "eval"
    assert main(["eval", "--policy", "oracle", "--configs", "S0-T0-O0-C0-W0", "--tiers", "2", "--families", "text,search",
                 "--limit", "4", "--out", str(out)]) == 0
    trajectories = load_jsonl(out / "trajectories.jsonl")
    tasks = {t.id: t for t in load_suite("workspace").tasks("test")}
    assert len(trajectories) == 4
    assert {(tasks[t.task_id].tier, tasks[t.task_id].family in ("text", "search")) for t in trajectories} == {(2, True)}


def test_eval_command_rejects_an_unknown_code_with_the_fix(tmp_path, capsys):
    code = main(["eval", "--policy", "oracle", "--configs", "S0-T0-O0-C0-W7", "--out", str(tmp_path / "x")])
    assert code == 2
    assert "S0-T0-O0-C0-W7" in capsys.readouterr().err


def test_mean_of_means_interval_reduces_to_the_plain_one_and_brackets_the_overall():
    from harnessrl.eval.metrics import bootstrap_ci_mean_of_means

    values = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert bootstrap_ci_mean_of_means([values], seed=3) == bootstrap_ci(values, seed=3)
    in_space, out_of_space = [1.0] * 30 + [0.0] * 10, [0.0] * 15 + [1.0] * 5
    low, high = bootstrap_ci_mean_of_means([in_space, out_of_space])
    assert low < (0.75 + 0.25) / 2 < high and high - low < 0.3


def test_evaluate_hands_ext_targets_to_the_external_agents_runner(monkeypatch):
    from harnessrl.eval.evaluate import evaluate

    calls = []
    package = types.ModuleType("harnessrl.external")
    package.external_agent_names = lambda: ["mini"]
    run = types.ModuleType("harnessrl.external.run")

    @dataclasses.dataclass
    class ExternalConfig:  # the fields eval sets
        backend: str = "auto"
        max_steps: int | None = None
        time_limit_s: float | None = None
        max_tokens: int | None = None
        temperature: float | None = None

    def evaluate_external_targets(names, policy, tasks, k=1, config=None, on_trajectory=None):
        calls.append((list(names), len(tasks), k, config.backend, config.temperature))
        return [Trajectory(task_id=t.id, config=name, harness=name, passed=True, out_of_space=True, seed=r)
                for name in names for t in tasks for r in range(k)]

    run.ExternalConfig, run.evaluate_external_targets = ExternalConfig, evaluate_external_targets
    monkeypatch.setitem(sys.modules, "harnessrl.external", package)
    monkeypatch.setitem(sys.modules, "harnessrl.external.run", run)
    monkeypatch.setattr(sets, "external", package)  # the agents evaluation sets know
    targets = resolve_eval_set("ext:mini,S0-T0-O0-C0-W0", DESIGN)
    tasks = list(load_suite("workspace").tasks("test", limit=1, seed=0))
    result = evaluate(OraclePolicy(), targets, tasks, k=2, settings=RolloutSettings(ORACLE_LIMITS), design=DESIGN)
    assert calls == [(["ext:mini"], 1, 2, "auto", 0.0)]  # the evaluation's temperature reaches the agents
    assert result.per_config["ext:mini"]["group"] == "external" and result.per_group["external"]["pass_at_k"] == 1.0
    assert result.per_group["train"]["episodes"] == 2  # the in-space target still ran through our engine
