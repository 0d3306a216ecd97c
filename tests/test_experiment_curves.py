"""An experiment's learning curves: every RL arm of a seed evaluates the same held-out
configurations at every point, whatever design it trains on, so that the curves compare."""

from pathlib import Path
from typing import get_args

from harnessrl.design import DESIGN_KINDS, make_design
from harnessrl.experiment import load_experiment
from harnessrl.experiment.spec import arm_config
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


def test_an_eval_design_with_an_h0_is_not_passed_to_arms_trained_otherwise(tmp_path):
    # harness_s_cpu.yaml evaluates under a single design (H0); its orthogonal arm cannot draw from
    # that design's complement without knowing H0, which the eval section does not name
    spec = load_experiment(CONFIGS / "harness_s_cpu.yaml")
    arms = {a.name: a for a in spec.arms}
    assert spec.eval.design == "single" and spec.eval.curve_every
    assert arm_config(spec, arms["scaling-rescue"], 0, tmp_path).eval_design is None
    assert arm_config(spec, arms["grpo"], 0, tmp_path).eval_design is None  # trained on eval.design itself
