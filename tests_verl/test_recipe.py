"""The recipe of examples/verl against verl 0.9.1's own config: its overrides compose (every
key exists), carry the papers' hyper-parameters, and its agent-loop file builds our loop."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import make_agent_loop
from harnessrl.integrations.verl.agent_loop import HarnessAgentLoop

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "verl"


def recipe_overrides() -> list[str]:
    body = (RECIPE / "run_qwen3_4b.sh").read_text().split("python -m verl.trainer.main_ppo", 1)[1]
    words = shlex.split(body.replace("\\\n", " "))
    values = {"$DATA": "data/harnessrl-verl", "$MODEL": "Qwen/Qwen3-4B-Instruct-2507"}
    out = []
    for word in words:
        if "=" not in word:
            continue
        for name, value in values.items():
            word = word.replace(name, value)
        out.append(word)
    return out


def test_the_recipe_composes_with_verls_config_and_has_the_papers_hyper_parameters():
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=recipe_overrides())
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.algorithm.adv_estimator == "grpo" and not cfg.algorithm.use_kl_in_reward and not actor.use_kl_loss
    assert cfg.data.train_batch_size == 16 and rollout.n == 8 and not cfg.data.shuffle
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.20, 0.28)
    assert cfg.trainer.total_training_steps == 300 and cfg.trainer.n_gpus_per_node == 8 and cfg.trainer.nnodes == 1
    assert rollout.calculate_log_probs and rollout.mode == "async"
    assert rollout.agent.agent_loop_config_path == "examples/verl/agent_loops.yaml"


def test_the_agent_loop_file_builds_our_loop_with_its_options(hf_tokenizer):
    (entry,) = OmegaConf.load(RECIPE / "agent_loops.yaml")
    assert entry.name == "harnessrl"
    options = {k: v for k, v in OmegaConf.to_container(entry).items() if k != "_target_"}
    loop = make_agent_loop(None, hf_tokenizer, **options, _target_=entry._target_)
    assert isinstance(loop, HarnessAgentLoop)
    assert loop.limits.max_turns == entry.max_turns and loop.sandbox_backend == entry.sandbox_backend
