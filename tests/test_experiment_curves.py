"""An experiment's learning curves: every RL arm of a seed evaluates the same held-out
configurations at every point, whatever design it trains on, so that the curves compare."""

from pathlib import Path
from typing import get_args

import pytest

from harnessrl.design import DESIGN_KINDS, make_design
from harnessrl.experiment import load_experiment
from harnessrl.experiment.spec import EvalSpec, arm_config, eval_changed
from harnessrl.harness.registry import default_space
from harnessrl.rl.config import DesignName
from harnessrl.rl.loop import held_out_configs

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def curve_configs(cfg):
    design = make_design(default_space(), cfg.design, n=cfg.design_n, seed=cfg.seed, base=cfg.base_harness)
    return [c.code for c in held_out_configs(cfg, design).configs]


def test_every_arm_of_the_ablation_draws_its_curve_from_the_evaluated_design(tmp_path):
    spec = load_experiment(CONFIGS / "cpu_ablation.yaml")
    rl_arms = [a for a in spec.arms if a.control is None]
    assert {arm_config(spec, a, 0, tmp_path).design for a in rl_arms} >= {"single", "random", "orthogonal"}
    for seed in spec.seeds:
        configs = {a.name: curve_configs(arm_config(spec, a, seed, tmp_path)) for a in rl_arms}
        reference = configs["orthogonal-18"]
        assert len(reference) == spec.eval.curve_held_out
        assert all(codes == reference for codes in configs.values()), configs
        # drawn against the evaluated (orthogonal) design: none of them is one of its rows
        rows = {c.code for c in make_design(default_space(), spec.eval.design).configs}
        assert not rows & set(reference)


def test_an_arm_on_the_evaluated_design_keeps_its_recorded_config(tmp_path):
    spec = load_experiment(CONFIGS / "cpu_ablation.yaml")
    arms = {a.name: a for a in spec.arms}
    # the orthogonal arms' configs are what they were before eval_design existed (their runs are reused)
    assert arm_config(spec, arms["orthogonal-18"], 0, tmp_path).eval_design is None
    assert arm_config(spec, arms["single-H0"], 0, tmp_path).eval_design == spec.eval.design
    assert arm_config(spec, arms["sft-only"], 0, tmp_path).eval_design is None  # no curve, nothing to draw


def test_the_config_names_the_designs_the_design_module_builds():
    assert get_args(DesignName) == DESIGN_KINDS


def test_an_eval_design_around_h0_puts_every_arms_curve_around_it(tmp_path):
    # harness_s_cpu.yaml evaluates under a single design around H0 (eval.base_harness): its
    # orthogonal arm draws its curve there too, not from the complement of OA(18)
    spec = load_experiment(CONFIGS / "harness_s_cpu.yaml")
    arms = {a.name: a for a in spec.arms}
    assert spec.eval.design == "single" and spec.eval.curve_every and spec.eval.base_harness
    for seed in spec.seeds:
        configs = {name: curve_configs(arm_config(spec, arm, seed, tmp_path))
                   for name, arm in arms.items() if arm.control is None}
        assert len(configs["grpo"]) == spec.eval.curve_held_out
        assert all(codes == configs["grpo"] for codes in configs.values()), configs
        assert spec.eval.base_harness not in configs["grpo"]  # the complement of {H0}
    rescue = arm_config(spec, arms["scaling-rescue"], 0, tmp_path)
    assert (rescue.eval_design, rescue.eval_base_harness) == ("single", spec.eval.base_harness)
    assert rescue.design == "orthogonal" and rescue.base_harness is None  # its training is untouched
    grpo = arm_config(spec, arms["grpo"], 0, tmp_path)  # trained on eval.design around its H0 itself
    assert (grpo.eval_design, grpo.eval_base_harness) == (None, None)


def test_without_its_h0_an_eval_design_that_needs_one_is_not_passed_on(tmp_path):
    # the same file with no eval.base_harness: each arm draws its curve from its own design's
    # complement, as before the field existed (and so a run finished then is still the same run)
    text = (CONFIGS / "harness_s_cpu.yaml").read_text()
    line = next(line for line in text.splitlines() if line.strip().startswith("base_harness: S0-T2-O2-C1-W1  #"))
    path = tmp_path / "h0-less.yaml"
    path.write_text(text.replace(line + "\n", ""))
    spec = load_experiment(path)
    assert spec.eval.base_harness is None
    arms = {a.name: a for a in spec.arms}
    rescue = arm_config(spec, arms["scaling-rescue"], 0, tmp_path)
    assert (rescue.eval_design, rescue.eval_base_harness) == (None, None)
    assert curve_configs(rescue) != curve_configs(arm_config(spec, arms["grpo"], 0, tmp_path))


def test_a_base_harness_for_an_eval_design_without_h0_is_refused(tmp_path):
    text = (CONFIGS / "cpu_ablation.yaml").read_text()
    assert "\neval:\n" in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("\neval:\n", "\neval:\n  base_harness: S0-T2-O2-C1-W1\n", 1))
    with pytest.raises(ValueError, match=r"field eval.base_harness: an orthogonal design has no H0"):
        load_experiment(path)
    text = (CONFIGS / "harness_s_cpu.yaml").read_text().replace("base_harness: S0-T2-O2-C1-W1  #", "base_harness: S9-T2  #")
    path.write_text(text)
    with pytest.raises(ValueError, match=r"field eval.base_harness: "):
        load_experiment(path)


def test_a_run_recorded_before_an_eval_field_existed_has_the_same_eval():
    spec = load_experiment(CONFIGS / "harness_s_cpu.yaml")
    recorded = spec.eval.model_dump()
    assert not eval_changed(recorded, spec.eval)
    older = {name: value for name, value in EvalSpec().model_dump().items() if name != "base_harness"}
    assert not eval_changed(older, EvalSpec())  # recorded before the field: its default
    assert eval_changed(older, spec.eval)  # but this file names an H0 that the record did not have
    assert eval_changed({**recorded, "k": 1}, spec.eval)


def test_an_evaluation_that_only_adds_targets_says_which():
    from harnessrl.experiment.spec import eval_additions

    recorded = EvalSpec(configs="held-out").model_dump()
    done = ["S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1"]
    wider = EvalSpec(configs="held-out,codex-like,ext:mini-swe-agent", external_tasks=4)
    assert eval_additions(recorded, wider, done, [*done, "codex-like", "ext:mini-swe-agent"]) == \
        ["codex-like", "ext:mini-swe-agent"]
    assert eval_additions(recorded, wider, done, done[:1]) is None  # a target dropped
    assert eval_additions(recorded, EvalSpec(configs="held-out", tasks=8), done, done) is None  # other tasks
    # the agent programs' task count is part of what an evaluated agent program was run on
    with_agent = wider.model_dump()
    agents = [*done, "ext:mini-swe-agent"]
    assert eval_additions(with_agent, wider.model_copy(update={"external_tasks": 8}), agents, agents) is None
    assert eval_additions(with_agent, wider, agents, [*agents, "aider-like"]) == ["aider-like"]
