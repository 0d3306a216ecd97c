"""Harness-S rescue in the trainer, on a tiny model of the embedded architecture (it fails every
task, so every group is dead): rescue groups replace them, each rescue trajectory is rendered by
its own sibling, the accounting adds up, and a resumed run routes exactly as an uninterrupted one."""

import json

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from checkpoint_helpers import kill_train_when, write_run_config  # noqa: E402
from harnessrl.experiment import executor_rollouts  # noqa: E402
from harnessrl.harness.base import SPAN_SYSTEM, SPAN_TASK, Message, PromptContext  # noqa: E402
from harnessrl.harness.harness import Harness, HarnessLimits  # noqa: E402
from harnessrl.harness.registry import default_space  # noqa: E402
from harnessrl.rl.config import load_config  # noqa: E402
from harnessrl.rl.loop import train  # noqa: E402
from harnessrl.tasks.suite import load_suite  # noqa: E402
from harnessrl.trajectory import load_jsonl  # noqa: E402

H0 = "S0-T0-O0-C0-W0"


def rescue_overrides(model, run_dir, steps, **more):
    return {
        "model": str(model), "run_dir": str(run_dir), "steps": steps, "tasks_per_step": 2, "group_size": 2,
        "max_turns": 1, "max_new_tokens": 6, "max_train_tasks": 6, "sft_warm_start_steps": 0, "eval_base": False,
        "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": False, "learning_rate": 1e-3, "seed": 5,
        "design": "single", "base_harness": H0, "k": 1, "rescue": "siblings", "rescue_k": 3,
        "rescue_validation_tasks": 2, "reanchor_every": 2, "save_every": 1, **more,
    }


def opening_ids(harness_code, task, tokenizer, cfg):
    limits = HarnessLimits(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens, context_tokens=cfg.context_tokens)
    harness = Harness.named(harness_code, limits)
    ctx = PromptContext(task, harness.tools, harness.workflow, limits.max_turns)
    messages = [Message("system", harness.system.system_message(ctx), SPAN_SYSTEM),
                Message("user", harness.system.first_user_message(ctx), SPAN_TASK)]
    return tokenizer.render(messages).ids


def test_dead_groups_are_replaced_by_rescue_groups_rendered_by_their_siblings(tiny_model, tmp_path):
    from harnessrl.policy.hf import HFPolicy

    run_dir = tmp_path / "run"
    cfg = load_config(preset="quick", overrides=rescue_overrides(tiny_model, run_dir, 2))
    train(cfg, log=lambda m: None)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    neighbours = {c.code for c in default_space().neighbours(default_space().parse(H0))}
    for record in records:
        assert record["rescue/rescue_trigger_rate"] == 1.0  # a random tiny model fails every task
        assert record["rescue/rescue_rollouts"] == 2 * 3  # K per dead group
        assert record["rescue/executor_rollouts_vs_grpo"] == pytest.approx((4 + 6) / 4)
        assert record["episodes"] == 6 and record["valid_group_ratio"] == 0.0
        assert sum(record["rescue/sibling_selections"].values()) == 6
        assert set(record["rescue/sibling_selections"]) <= neighbours
    assert records[0]["rescue_anchor"]["episodes"] == (1 + len(neighbours)) * 2  # H0 + 10 siblings x 2 tasks
    assert "rescue_anchor" not in records[1]  # re-anchored every 2 updates
    rollouts = load_jsonl(run_dir / "rollouts" / "step-000000.jsonl")
    assert {t.harness for t in rollouts} <= neighbours and len({t.harness for t in rollouts}) >= 3
    tokenizer = HFPolicy(str(tiny_model)).tokenizer
    suite = load_suite("workspace")
    for trajectory in rollouts:  # each trained in the context its own sibling rendered
        expected = opening_ids(trajectory.harness, suite.get(trajectory.task_id), tokenizer, cfg)
        assert trajectory.turns[0].prompt_ids[: len(expected)] == expected
    state = json.loads(sorted((run_dir / "checkpoints").glob("step-*/trainer_state.json"))[-1].read_text())
    assert state["rescue"]["last_anchor"] == 2 and state["final_anchor_step"] == 2
    # what an experiment counts as spent: the first pass in full, though rescue replaced it
    spent = executor_rollouts(run_dir)
    assert (spent["first_pass"], spent["rescue"], spent["vs_grpo"]) == (2 * 4, 2 * 6, pytest.approx(20 / 8))
    for record in records:  # the same from records of before base_rollouts was logged
        del record["rescue/base_rollouts"]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert executor_rollouts(run_dir)["first_pass"] == 2 * 4


@pytest.mark.parametrize("mode", ["h0", "mixture"])
def test_baselines_use_the_groups_own_harness_or_a_fixed_mixture(tiny_model, tmp_path, mode):
    run_dir = tmp_path / mode
    overrides = rescue_overrides(tiny_model, run_dir, 1, rescue=mode, group_size=4, mixture_fraction=0.5)
    train(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    harnesses = [t.harness for t in load_jsonl(run_dir / "rollouts" / "step-000000.jsonl")]
    assert "rescue_anchor" not in record  # no routing evidence is needed
    if mode == "h0":  # the dead groups resampled K = 3 times under H0
        assert record["rescue/rescue_rollouts"] == 6 and set(harnesses) == {H0} and len(harnesses) == 6
    else:  # every group: 2 of 4 rollouts under H0, 2 under siblings; no extra rollouts
        assert record["rescue/rescue_rollouts"] == 0 and len(harnesses) == 8
        assert harnesses.count(H0) == 4


def test_resume_after_sigkill_routes_exactly_as_an_uninterrupted_run(tiny_model, tmp_path):
    steps = 3
    reference_dir = tmp_path / "reference"
    train(load_config(preset="quick", overrides=rescue_overrides(tiny_model, reference_dir, steps)), log=lambda m: None)
    reference = [json.loads(line) for line in (reference_dir / "metrics.jsonl").read_text().splitlines()]

    killed_dir = tmp_path / "killed"
    config_file = write_run_config(tmp_path / "run.yaml", rescue_overrides(tiny_model, killed_dir, steps))
    kill_train_when(config_file, killed_dir, (killed_dir / "checkpoints" / "step-000002").exists)
    train(load_config(config_file, overrides={"run_dir": str(killed_dir)}), resume=True, log=lambda m: None)
    resumed = [json.loads(line) for line in (killed_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == list(range(steps))
    for key in ("pairs", "rescue/sibling_selections", "tokens_generated"):
        assert [r[key] for r in resumed] == [r[key] for r in reference], key
    assert [("rescue_anchor" in r) for r in resumed] == [True, False, True]


def test_a_sibling_pool_of_the_groups_harness_is_a_rescue_source(tiny_model, tmp_path):
    from harnessrl.cli import main

    pool_dir = tmp_path / "pool"
    assert main(["pool", "from-space", "--base", H0, "--radius", "1", "--out", str(pool_dir)]) == 0
    run_dir = tmp_path / "run"
    overrides = rescue_overrides(tiny_model, run_dir, 1, siblings=f"pool:{pool_dir}", router="random")
    train(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    chosen = record["rescue/sibling_selections"]
    assert sum(chosen.values()) == 6 and all(name.startswith(f"{pool_dir}#") for name in chosen)
    harnesses = {t.harness for t in load_jsonl(run_dir / "rollouts" / "step-000000.jsonl")}
    assert harnesses == set(chosen) and not any(name.endswith("#H0") for name in harnesses)


def test_profile_routed_training_counts_each_steps_votes_and_the_garbage_ones(tiny_model, tmp_path):
    from serve_helpers import Scripted, running

    def answer(context):  # profiles: garbage (dropped); votes: a ranking on even calls, garbage on odd ones
        prompt = context.messages[-1]["content"]
        if "Rank the candidate harnesses" not in prompt:
            return "no profile here"
        answer.votes += 1
        return json.dumps({"ranking": ["S1-T0-O0-C0-W0", "S0-T2-O0-C0-W0"]}) if answer.votes % 2 else "garbage"

    answer.votes = 0
    run_dir = tmp_path / "run"
    with running(Scripted(answer)) as (server, _, _):
        cfg = load_config(preset="quick", overrides=rescue_overrides(
            tiny_model, run_dir, 2, router="profile", profile_voters=[f"voter@{server.base_url}"]))
        train(cfg, log=lambda m: None)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:  # a random tiny model fails every task: both groups dead, one vote each
        assert record["rescue/router_votes"] == 2 and record["rescue/router_malformed_votes"] == 1
        assert record["rescue/sibling_selections"].get("S1-T0-O0-C0-W0", 0) >= 1  # the well-formed vote's first
    assert records[0]["rescue_anchor"]["profiles_dropped"] == 10
    assert answer.votes == 4
