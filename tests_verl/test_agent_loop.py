"""The verl agent loop ``harnessrl`` against verl 0.9.1 itself: registered, built by hydra as
verl's worker builds it, episodes driven through a server-manager stand-in, outputs converted
by verl's own ``AgentLoopOutput.as_dict``."""

from __future__ import annotations

import asyncio

import hydra.utils
import pytest
import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.workers.rollout.replica import TokenOutput

from conftest import PolicyServer, make_agent_loop, trainer_config
from harnessrl.harness.chat import HFChatTokenizer
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.integrations.verl import AGENT_NAME
from harnessrl.integrations.verl.agent_loop import HarnessAgentLoop, PromptTooLong
from harnessrl.integrations.verl.dataset import build_dataset
from harnessrl.integrations.verl.sequence import NotAppendOnly
from harnessrl.policy.scripted import CallbackPolicy, OraclePolicy
from harnessrl.rollout.episode import Episode, run_episode
from harnessrl.sandbox import open_sandbox
from harnessrl.tasks.suite import load_suite

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def rows(n: int = 4):
    return build_dataset("workspace", n_tasks=n, n_steps=2, tasks_per_step=n, append_only="keep-c0")


def run(loop, row) -> AgentLoopOutput:
    return asyncio.run(loop.run(dict(SAMPLING), **row, index=0, raw_prompt=row["prompt"]))


def test_the_agent_loop_is_in_verls_registry_under_its_agent_name():
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == f"{HarnessAgentLoop.__module__}.HarnessAgentLoop"


def test_oracle_episodes_earn_the_verifiers_reward_with_policy_tokens_masked_in(hf_tokenizer):
    chat = HFChatTokenizer(hf_tokenizer)
    oracle = OraclePolicy(tokenizer=chat)
    server = PolicyServer(oracle, tuple(chat.stop_token_ids))
    loop = make_agent_loop(server, hf_tokenizer)
    seen = set()
    for row in rows():
        out = run(loop, row)
        seen.add(row["harness"])
        # The same episode through our own loop: same reward, same sampled tokens.
        task = load_suite("workspace").get(row["task_id"])
        reference = run_episode(Harness.named(row["harness"], loop.limits), task, OraclePolicy(tokenizer=chat))
        assert out.reward_score == reference.reward == 1.0
        ours = out.extra_fields[AGENT_NAME]
        assert ours["passed"] and ours["status"] == "submitted" and ours["harness"] == row["harness"]
        assert ours["episode_metrics"]["turns"] == len(reference.turns)
        assert out.extra_fields["reward_extra_info"]["passed"] == 1.0
        assert out.extra_fields["reward_extra_info"]["turns"] == len(reference.turns)
        assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
        masked_in = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m]
        assert masked_in == [t for turn in reference.turns for t in turn.completion_ids]
        assert out.prompt_ids == reference.turns[0].prompt_ids
        # every later prompt the server saw is prompt + response so far (append-only)
        for call in server.calls[-len(reference.turns):]:
            assert call["prompt_ids"] == (out.prompt_ids + out.response_ids)[: len(call["prompt_ids"])]
            assert call["sampling_params"]["max_tokens"] <= loop.limits.max_new_tokens
    assert len(seen) >= 2


def test_outputs_convert_to_the_tensors_verls_trainer_reads(hf_tokenizer):
    chat = HFChatTokenizer(hf_tokenizer)
    loop = make_agent_loop(PolicyServer(OraclePolicy(tokenizer=chat), tuple(chat.stop_token_ids)), hf_tokenizer)
    out = run(loop, rows(1)[0])
    tensors = out.as_dict()  # verl's own conversion, as its worker calls it
    n = len(out.response_ids)
    assert tensors["prompts"].dtype == torch.int64 and tensors["prompts"].shape == (len(out.prompt_ids),)
    assert tensors["responses"].shape == tensors["response_mask"].shape == tensors["rollout_log_probs"].shape == (n,)
    assert set(tensors["response_mask"].tolist()) == {0, 1}
    assert tensors["rm_scores"][-1].item() == out.reward_score and tensors["rm_scores"][:-1].abs().sum() == 0
    assert len(out.prompt_ids) <= loop.prompt_length and n <= loop.response_length


def test_a_policy_that_never_acts_gets_the_verifiers_zero_and_its_format_errors_counted(hf_tokenizer):
    chat = HFChatTokenizer(hf_tokenizer)
    talker = CallbackPolicy(lambda episode: "I will look around the workspace first.", tokenizer=chat)
    loop = make_agent_loop(PolicyServer(talker, tuple(chat.stop_token_ids)), hf_tokenizer, max_turns=5)
    out = run(loop, rows(1)[0])
    assert out.reward_score == 0.0 and not out.extra_fields[AGENT_NAME]["passed"]
    assert out.extra_fields["reward_extra_info"]["passed"] == 0.0
    assert out.extra_fields[AGENT_NAME]["episode_metrics"]["turns"] >= 1
    assert out.extra_fields[AGENT_NAME]["status"] == "format_errors"
    assert out.extra_fields["reward_extra_info"]["format_errors"] == 3  # HarnessLimits' limit in a row
    assert set(out.response_mask) == {0, 1}  # the error observations between the replies are masked out


def test_the_response_budget_ends_the_episode_before_verls_response_length(hf_tokenizer):
    chat = HFChatTokenizer(hf_tokenizer)
    server = PolicyServer(OraclePolicy(tokenizer=chat), tuple(chat.stop_token_ids))
    loop = make_agent_loop(server, hf_tokenizer, trainer_config(2048, 120))
    out = run(loop, rows(1)[0])
    assert len(out.response_ids) <= 120
    # the oracle's gold actions do not fit in 120 tokens: cut to the room left, then stopped
    assert out.extra_fields[AGENT_NAME]["status"] == "response_length", out.extra_fields
    assert out.reward_score == 0.0 and all(c["sampling_params"]["max_tokens"] <= 120 for c in server.calls)


def test_harnesses_that_rewrite_earlier_turns_are_refused_before_the_episode(hf_tokenizer):
    chat = HFChatTokenizer(hf_tokenizer)
    server = PolicyServer(OraclePolicy(tokenizer=chat), tuple(chat.stop_token_ids))
    loop = make_agent_loop(server, hf_tokenizer)
    row = dict(rows(1)[0])
    for code in ("S0-T0-O0-C1-W0", "S0-T0-O0-C2-W0", "codex-like"):
        row["harness"] = code
        with pytest.raises(NotAppendOnly, match="rewrites earlier turns"):
            run(loop, row)
    assert server.calls == []


def test_rows_without_the_harness_columns_and_too_long_openings_are_refused(hf_tokenizer):
    chat = HFChatTokenizer(hf_tokenizer)
    server = PolicyServer(OraclePolicy(tokenizer=chat), tuple(chat.stop_token_ids))
    row = rows(1)[0]
    loop = make_agent_loop(server, hf_tokenizer)
    with pytest.raises(ValueError, match="no 'harness' column"):
        asyncio.run(loop.run(dict(SAMPLING), raw_prompt=row["prompt"], suite="workspace", task_id=row["task_id"]))
    short = make_agent_loop(server, hf_tokenizer, trainer_config(64, 2048))
    with pytest.raises(PromptTooLong, match="prompt_length=64"):
        run(short, row)
    assert short.limits == HarnessLimits(
        max_turns=HarnessLimits.max_turns, max_new_tokens=HarnessLimits.max_new_tokens, context_tokens=64 + 2048
    )


def test_the_embedded_model_generates_through_the_server_with_its_log_probs_kept():
    from harnessrl.policy.hf import HFPolicy

    policy = HFPolicy("embedded", device="cpu", max_batch_size=1)
    server = PolicyServer(policy, tuple(policy.tokenizer.stop_token_ids))
    loop = make_agent_loop(server, policy.hf_tokenizer, trainer_config(2048, 256), max_turns=2, max_new_tokens=32)
    out = run(loop, rows(1)[0])
    assert 1 <= len(server.calls) <= 2
    assert out.reward_score in (0.0, 1.0) and out.reward_score == float(out.extra_fields[AGENT_NAME]["passed"])
    sampled = [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m]
    assert sampled and all(lp <= 0.0 for lp in sampled) and any(lp < 0.0 for lp in sampled)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if not m)
    assert len(out.response_ids) <= 256


class ReplayServer:
    """Answers every request with the same sampled ids and log-probabilities."""

    def __init__(self, token_ids: list[int], log_probs: list[float]) -> None:
        self.token_ids, self.log_probs = token_ids, log_probs

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        return TokenOutput(token_ids=self.token_ids, log_probs=self.log_probs, stop_reason="completed")


def test_a_one_turn_episode_has_the_layout_of_verls_own_tool_agent_loop(hf_tokenizer):
    """verl's ToolAgentLoop and ours, on the same opening messages and the same sampled reply
    (no tool call, so both stop after it): the same prompt tokens, response, mask and
    log-probs."""
    import verl.experimental.agent_loop.tool_agent_loop  # noqa: F401  (registers "tool_agent")

    chat = HFChatTokenizer(hf_tokenizer)
    reply = chat.completion_ids("I have nothing to run.")
    log_probs = [-0.25] * len(reply)
    config = trainer_config(2048, 512)
    config.actor_rollout_ref.rollout.full_determinism = False
    config.actor_rollout_ref.rollout.multi_turn = {
        "max_user_turns": 1, "max_assistant_turns": 1, "max_parallel_calls": 1,
        "max_tool_response_length": 256, "tool_response_truncate_side": "middle", "format": "hermes",
    }
    ours = make_agent_loop(ReplayServer(reply, log_probs), hf_tokenizer, config, max_turns=1)
    row = rows(1)[0]
    mine = run(ours, row)
    harness = ours.harness_of(row["harness"])
    sandbox = open_sandbox()
    try:  # the messages our episode opens with, given to verl's loop as its dataset prompt
        episode = Episode(harness, load_suite("workspace").get(row["task_id"]), sandbox, chat)
        episode.start()
        messages = [{"role": m.role, "content": m.content} for m in episode.history]
    finally:
        sandbox.close()
    theirs_loop = hydra.utils.instantiate(
        config=_agent_loop_registry["tool_agent"], trainer_config=DictConfigWrap(config=config),
        server_manager=ReplayServer(reply, log_probs), tokenizer=hf_tokenizer, processor=None,
        hf_model_type=None, dataset_cls=None, data_config=DictConfigWrap(config.data), tools=ToolListWrap([]),
    )
    theirs = theirs_loop.loop.run_until_complete(theirs_loop.run(dict(SAMPLING), raw_prompt=messages))
    assert mine.response_ids == theirs.response_ids == reply
    assert mine.response_mask == theirs.response_mask == [1] * len(reply)
    assert mine.response_logprobs == theirs.response_logprobs == log_probs
    header = chat.header("assistant")
    assert mine.prompt_ids[-len(header):] == theirs.prompt_ids[-len(header):] == header
    assert mine.prompt_ids == theirs.prompt_ids  # our renderer and verl's chat template agree
    assert set(theirs.extra_fields) <= set(mine.extra_fields)
    core = {"prompts", "responses", "response_mask", "rollout_log_probs"}
    assert core <= set(mine.as_dict()) and core <= set(theirs.as_dict())



class FailingServer:
    """A server that answers the first request and then fails (a lost replica)."""

    def __init__(self, reply: list[int]) -> None:
        self.reply, self.calls = reply, 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.calls += 1
        if self.calls > 1:
            raise ConnectionError("replica 3 is gone")
        return TokenOutput(token_ids=self.reply, log_probs=[-1.0] * len(self.reply), stop_reason="completed")


def test_a_failing_server_ends_the_episode_as_an_error_and_keeps_what_was_sampled(hf_tokenizer):
    chat = HFChatTokenizer(hf_tokenizer)
    reply = chat.completion_ids("Let me think about it first.")
    loop = make_agent_loop(FailingServer(reply), hf_tokenizer)
    out = run(loop, rows(1)[0])
    ours = out.extra_fields[AGENT_NAME]
    assert ours["status"] == "error" and "replica 3 is gone" in ours["error"]
    assert out.reward_score == 0.0
    assert [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m] == reply


def test_a_batch_of_episodes_pads_and_stacks_through_verls_own_worker_code(hf_tokenizer):
    """Our outputs through verl's AgentLoopWorker post-processing (padding, masks, position ids,
    rm_scores, the batch): the tensors its trainer reads. The worker is verl's class with only the
    attributes those two methods read (no Ray, no servers)."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    chat = HFChatTokenizer(hf_tokenizer)
    config = trainer_config(2048, 6144)
    loop = make_agent_loop(PolicyServer(OraclePolicy(tokenizer=chat), tuple(chat.stop_token_ids)), hf_tokenizer, config)
    worker = object.__new__(AgentLoopWorker)
    worker.rollout_config, worker.tokenizer, worker.processor = config.actor_rollout_ref.rollout, hf_tokenizer, None
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.mm_processor_kwargs = None, False, {}
    batch_rows = rows(2)[:2]

    async def rollout():
        padded, raw = [], []
        for index, row in enumerate(batch_rows):
            kwargs = {**row, "index": index, "raw_prompt": row["prompt"]}
            output = await loop.run(dict(SAMPLING), **kwargs)
            raw.append(output)
            padded.append(await worker._agent_loop_postprocess(output, False, **kwargs))
        columns = {key: np.array([r[key] for r in batch_rows], dtype=object) for key in batch_rows[0]}
        return raw, worker._postprocess(padded, input_non_tensor_batch=columns, validate=False)

    raw, batch = asyncio.run(rollout())
    tensors = batch.batch
    assert tuple(tensors["prompts"].shape) == (2, 2048) and tuple(tensors["responses"].shape) == (2, 6144)
    assert tuple(tensors["input_ids"].shape) == tuple(tensors["attention_mask"].shape) == (2, 8192)
    for i, output in enumerate(raw):
        n_prompt, n_response = len(output.prompt_ids), len(output.response_ids)
        assert tensors["prompts"][i, -n_prompt:].tolist() == output.prompt_ids  # left-padded
        assert tensors["responses"][i, :n_response].tolist() == output.response_ids  # right-padded
        assert tensors["response_mask"][i].sum().item() == sum(output.response_mask)
        assert tensors["response_mask"][i, n_response:].sum().item() == 0
        assert tensors["attention_mask"][i].sum().item() == n_prompt + n_response
        assert tensors["rm_scores"][i].sum().item() == output.reward_score == 1.0
        assert tensors["rollout_log_probs"][i, :n_response].tolist() == output.response_logprobs
    # the dataset's columns survive next to ours; verl's metrics and group filter see ours
    assert batch.non_tensor_batch["harness"].tolist() == [r["harness"] for r in batch_rows]
    assert batch.non_tensor_batch["passed"].tolist() == [1.0, 1.0]
    assert "passed" in batch.meta_info["reward_extra_keys"]
