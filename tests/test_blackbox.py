"""Black-box training: recorded conversations are exact training data, and a GRPO step and an
SFT step run through a real agent program (mini-swe-agent) against the current policy."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.policy.base import Policy  # noqa: E402
from harnessrl.rl.blackbox import trajectory_summary  # noqa: E402
from harnessrl.rl.config import load_config  # noqa: E402
from harnessrl.trajectory import SPAN_POLICY, load_jsonl  # noqa: E402
from serve_helpers import running  # noqa: E402


class Keeping(Policy):
    """A policy that keeps every generation it returned, in order."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.name, self.generations = policy, "keeping", []

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    def generate(self, requests):
        out = self.policy.generate(requests)
        self.generations += out
        return out


def _chat(server, session: str, messages: list[dict]) -> dict:
    response = httpx.post(f"{server.base_url}/s/{session}/v1/chat/completions", timeout=120,
                          json={"model": "test-model", "messages": messages, "max_tokens": 6})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls") and v is not None}


def test_recorded_conversation_trains_exactly_the_sampled_ids_even_when_the_agent_rewrites_context(tiny_model):
    from harnessrl.policy.hf import HFPolicy

    policy = Keeping(HFPolicy(str(tiny_model), device="cpu", dtype="float32"))
    task = {"role": "user", "content": "Fix the failing test in the repository."}
    with running(policy) as (server, _policy, recorder):
        first = _chat(server, "run@0", [{"role": "system", "content": "You are an agent."}, task])
        history = [task, first, {"role": "user", "content": "exit code 1: AssertionError"}]
        second = _chat(server, "run@0", [{"role": "system", "content": "You are an agent."}, *history])
        _chat(server, "run@0", [{"role": "user", "content": "Write a five-word title for this chat."}])  # side request
        # The agent rewrites its context (a new per-request system message, as OpenClaw does).
        history += [second, {"role": "user", "content": "exit code 0"}]
        _chat(server, "run@0", [{"role": "system", "content": "You are an agent. Time: 12:00."}, *history])
        trajectory = recorder.to_trajectory("run@0", task_id="t", passed=True)
    main = [g for index, g in enumerate(policy.generations) if index != 2]  # the side request was third
    assert trajectory.metrics["requests"] == 3 and trajectory.metrics["session_requests"] == 4
    assert [turn.completion_ids for turn in trajectory.turns] == [g.token_ids for g in main]
    assert [turn.completion_logprobs for turn in trajectory.turns] == [g.logprobs for g in main]
    samples = trajectory.training_samples()
    # the append-only second request continues the first sequence; the rewrite starts a new one
    assert [[index for index, _ in s.turn_starts] for s in samples] == [[0, 1], [2]]
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    trained_ids, trained_logprobs = [], []
    for sample in samples:
        kept = [i for i, m in enumerate(sample.loss_mask) if m]
        assert all(sample.spans[i] == SPAN_POLICY for i in kept)
        trained_ids += [sample.input_ids[i] for i in kept]
        trained_logprobs += [sample.old_logprobs[i] for i in kept]
        with torch.no_grad():
            logits = model(torch.tensor([sample.input_ids])).logits[0].float()
        scored = torch.log_softmax(logits, -1)
        recomputed = [float(scored[i - 1, sample.input_ids[i]]) for i in kept]
        assert recomputed == pytest.approx([sample.old_logprobs[i] for i in kept], abs=1e-3)
    # every sampled token is trained once; the earlier replies inside the rewritten prompt are not retrained
    assert trained_ids == [t for g in main for t in g.token_ids]
    assert trained_logprobs == [lp for g in main for lp in g.logprobs]
    rewritten = samples[1]
    assert rewritten.spans.count(SPAN_POLICY) > sum(rewritten.loss_mask) == len(main[2].token_ids)


def test_forced_sampling_serves_the_same_policy_object_with_training_sampling():
    from harnessrl.policy.base import GenerationRequest, SamplingParams
    from harnessrl.policy.forced import ForcedSampling
    from harnessrl.policy.scripted import CallbackPolicy

    seen = []

    class Spy(CallbackPolicy):
        def generate(self, requests):
            seen.extend(r.params for r in requests)
            return super().generate(requests)

    inner = Spy(lambda context: "ok")
    served = ForcedSampling(inner, temperature=0.7, top_p=0.9, max_new_tokens=64)
    served.generate([GenerationRequest([1], SamplingParams(temperature=0.0, max_new_tokens=32_000, seed=5))])
    assert served.policy is inner and served.tokenizer is inner.tokenizer
    assert (seen[0].temperature, seen[0].top_p, seen[0].max_new_tokens, seen[0].seed) == (0.7, 0.9, 64, 5)
    # the server's batcher samples through generate_stream: the same training sampling there
    streamed = []
    [generation] = served.generate_stream([GenerationRequest([1], SamplingParams(temperature=0.0, seed=6))],
                                          lambda index, ids: streamed.extend(ids))
    assert (seen[1].temperature, seen[1].top_p, seen[1].seed) == (0.7, 0.9, 6)
    assert streamed == generation.token_ids and generation.token_ids


def test_black_box_configs_are_validated():
    with pytest.raises(ValueError, match="ext:<agent>"):
        load_config(overrides={"rollout_through": "openclaw"})
    with pytest.raises(ValueError, match="rescue: none"):
        load_config(overrides={"rollout_through": "ext:openclaw", "rescue": "h0"})
    with pytest.raises(ValueError, match="real sandbox"):
        load_config(overrides={"rollout_through": "ext:openclaw", "sandbox_backend": "none"})
    with pytest.raises(ValueError, match="sft_source gold"):
        load_config(overrides={"objective": "sft", "sft_source": "gold"})
    assert load_config(overrides={"rollout_through": "ext:openclaw", "objective": "sft"}).objective == "sft"


def _blackbox_overrides(model, run_dir, **extra):
    return {
        "model": str(model), "run_dir": str(run_dir), "steps": 1, "tasks_per_step": 1, "group_size": 2,
        "max_train_tasks": 1, "max_new_tokens": 16, "sft_warm_start_steps": 0, "eval_base": False,
        "eval_held_out": 0, "eval_out_of_space": False, "learning_rate": 1e-3, "temperature": 1.0, "seed": 1,
        "rollout_through": "ext:mini-swe-agent", "agent_max_steps": 2, "agent_time_limit_s": 180,
        "agent_concurrency": 2, "skip_no_signal_groups": False, **extra,
    }


def test_black_box_grpo_step_through_mini_swe_agent(tiny_model, mini_swe_agent, tmp_path):
    from harnessrl.rl.loop import Trainer

    cfg = load_config(preset="quick", overrides=_blackbox_overrides(tiny_model, tmp_path / "run"))
    trainer = Trainer(cfg, log=lambda message: None)
    try:
        record = trainer.rl_step(0)
        served = trainer.source.agents.served
        assert served.policy is trainer.policy  # the server samples from the trainer's own rollout policy
    finally:
        trainer.close()
    assert record["episodes"] == 2 and record["pairs"][0][1]
    trajectories = load_jsonl(tmp_path / "run" / "rollouts" / "step-000000.jsonl")
    assert [t.config for t in trajectories] == ["ext:mini-swe-agent"] * 2
    assert len({t.task_id for t in trajectories}) == 1  # one GRPO group: G runs of one task
    assert len({t.metrics["session"] for t in trajectories}) == 2
    assert all(t.turns and all(turn.completion_ids for turn in t.turns) for t in trajectories)
    assert record["tokens_generated"] == sum(t.n_policy_tokens for t in trajectories) > 0
    assert record["tokens_prompt"] >= sum(len(turn.prompt_ids) for t in trajectories for turn in t.turns) > 0
    assert record["reward_mean"] == pytest.approx(sum(t.reward for t in trajectories) / 2)
    assert record["trained_samples"] >= 2 and record["update/policy_tokens"] == record["tokens_generated"]
    assert "update/approx_kl" in record and "agent/side_requests" in record
    summary = trajectory_summary(trajectories[0])
    assert summary["turns"][0]["sampled_tokens"] == len(trajectories[0].turns[0].completion_ids)
    json.dumps(summary)


def test_black_box_sft_clones_gold_replayed_through_mini_swe_agent(tiny_model, mini_swe_agent, tmp_path):
    from harnessrl.rl.loop import Trainer

    overrides = _blackbox_overrides(tiny_model, tmp_path / "run", objective="sft", sft_source="gold",
                                    group_size=1, agent_max_steps=12)
    cfg = load_config(preset="quick", overrides=overrides)
    trainer = Trainer(cfg, log=lambda message: None)
    before = {k: v.clone() for k, v in trainer.actor.model.state_dict().items()}
    try:
        record = trainer.rl_step(0)
    finally:
        trainer.close()
    [trajectory] = load_jsonl(tmp_path / "run" / "rollouts" / "step-000000.jsonl")
    assert trajectory.passed and trajectory.status == "submitted", (trajectory.error, trajectory.verdict)
    assert record["pass_rate"] == 1.0 and record["trained_samples"] == len(trajectory.training_samples()) >= 1
    assert record["update/nll"] > 0 and trajectory.n_policy_tokens > 0
    assert any(not torch.equal(before[k], v) for k, v in trainer.actor.model.state_dict().items())


def test_paper_blackbox_experiment_has_the_papers_three_arms():
    from pathlib import Path

    from harnessrl.experiment import arm_config, load_experiment

    spec = load_experiment(Path(__file__).resolve().parents[1] / "configs" / "paper_blackbox.yaml")
    configs = {arm.name: arm_config(spec, arm, 0, Path("/nonexistent")) for arm in spec.arms}
    sft, rl, white = configs["blackbox-sft-openclaw"], configs["blackbox-rl-openclaw"], configs["harness-scaling-oa18"]
    assert (sft.rollout_through, sft.objective, sft.sft_source) == ("ext:openclaw", "sft", "gold")
    assert (rl.rollout_through, rl.objective) == ("ext:openclaw", "rl")
    assert (white.rollout_through, white.design, white.pairing, white.k) == ("harness", "orthogonal", "neighbour", 2)
    assert "ext:claude-code" in spec.eval.configs and "held-out" in spec.eval.configs and spec.eval.held_out == 18
    assert {(c.steps, c.tasks_per_step, c.group_size) for c in configs.values()} == {(300, 16, 8)}


def test_tiny_blackbox_experiment_reports_external_scores_and_costs(tiny_model, mini_swe_agent, tmp_path):
    from harnessrl.experiment import load_experiment, run_experiment

    path = tmp_path / "exp.yaml"
    path.write_text(f"""
name: tiny-blackbox
base: {{preset: quick, model: {tiny_model}, steps: 1, tasks_per_step: 1, group_size: 2, max_turns: 1,
        max_new_tokens: 8, max_train_tasks: 1, sft_warm_start_steps: 0, agent_max_steps: 2,
        agent_time_limit_s: 180, agent_concurrency: 2, learning_rate: 0.001}}
seeds: [0]
eval: {{configs: "held-out,ext:mini-swe-agent", held_out: 1, tasks: 1}}
arms:
  - {{name: blackbox-rl, rollout_through: "ext:mini-swe-agent", design: single, pairing: repeat, k: 2}}
  - {{name: white-box, design: orthogonal, pairing: neighbour, k: 2}}
""")
    result = run_experiment(load_experiment(path), tmp_path / "out", log=lambda message: None)
    arms = {row["arm"]: row for row in result["arms"]}
    assert arms["blackbox-rl"]["rollout_through"] == "ext:mini-swe-agent" and arms["white-box"]["rollout_through"] == "harness"
    for row in arms.values():
        assert row["external"] is not None and row["out_of_space"] is None
        assert row["overall"] == pytest.approx((row["in_space"] + row["external"]) / 2)
        assert row["rollouts"]["first_pass"] == 2
        assert row["rollouts"]["tokens_prompt"] > 0 and row["rollouts"]["tokens_generated"] > 0
        assert row["rollouts"]["rollout_time_s"] > 0
    # an agent run sends far more prompt than an in-space episode of one turn: equal steps, unequal cost
    assert arms["blackbox-rl"]["rollouts"]["tokens_prompt"] > arms["white-box"]["rollouts"]["tokens_prompt"]
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "external agents Pass@1" in table and "trains through" in table and "ext:mini-swe-agent" in table


def test_recorder_forgets_a_session_and_keeps_the_others():
    from harnessrl.serve.recorder import ConversationRecorder

    with running() as (server, _policy, recorder):
        for session in ("a@0", "b@0"):
            httpx.post(f"{server.base_url}/s/{session}/v1/chat/completions", timeout=30,
                       json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}]})
        held = recorder.memory_bytes
        recorder.forget("a@0")
        recorder.forget("never-seen")
        assert recorder.sessions() == ["b@0"] and 0 < recorder.memory_bytes < held
        assert isinstance(recorder, ConversationRecorder) and len(recorder.records("b@0")) == 1


def test_a_retried_request_is_one_turn_the_answer_the_agent_went_on_with():
    from serve_helpers import Scripted

    answers = iter(["first answer", "second answer", "next step", "a title"])
    with running(Scripted(lambda context: next(answers))) as (server, _policy, recorder):
        task = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Do it."}]
        first = _chat(server, "run@0", task)
        _chat(server, "run@0", task)  # the client timed out and sent it again; it goes on with the first
        _chat(server, "run@0", [*task, first, {"role": "user", "content": "ok"}])
        _chat(server, "run@0", [{"role": "user", "content": "Title?"}])
        trajectory = recorder.to_trajectory("run@0")
    assert [turn.text for turn in trajectory.turns] == ["first ", "next s"]  # _chat asks for 6 tokens (bytes here)
    assert trajectory.metrics["retries_dropped"] == 1 and trajectory.metrics["session_requests"] == 4
    assert trajectory.metrics["threads"] == 2  # the continuation stayed in the main thread; the title did not


def test_a_request_that_drops_the_malformed_reply_stays_in_the_main_thread():
    from serve_helpers import Scripted

    with running(Scripted(lambda context: "no action here")) as (server, _policy, recorder):
        task = [{"role": "system", "content": "Reply with one bash block."}, {"role": "user", "content": "Do it."}]
        _chat(server, "run@0", task)
        error = {"role": "user", "content": "Format error: expected exactly 1 action, found 0."}
        _chat(server, "run@0", [*task, error])  # mini-swe-agent leaves the bad reply out of its history
        _chat(server, "run@0", [*task, error, error])
        trajectory = recorder.to_trajectory("run@0")
    assert trajectory.metrics["threads"] == 1 and len(trajectory.turns) == 3
    # each turn trains what it sampled; the dropped replies are not in the next prompts
    assert [len(s.turn_starts) for s in trajectory.training_samples()] == [1, 1, 1]
