"""Fixtures of the verl integration tests (run with verl's own environment, `.venv-verl`):
verl's agent loop built the way verl's worker builds it, and stand-ins for verl's server manager."""

from __future__ import annotations

from typing import Any

import hydra.utils
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import (
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.workers.rollout.replica import TokenOutput

from harnessrl.integrations.verl import AGENT_NAME
from harnessrl.integrations.verl.agent_loop import RUNNING_EPISODES
from harnessrl.policy.base import GenerationRequest, Policy, SamplingParams
from harnessrl.policy.embedded import embedded_model_dir

PROMPT_LENGTH, RESPONSE_LENGTH = 2048, 6144


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """The embedded SmolLM2's tokenizer: a ChatML tokenizer, as Qwen3's is."""
    return AutoTokenizer.from_pretrained(embedded_model_dir())


class PolicyServer:
    """A stand-in for verl's ``LLMServerClient``: ``generate(request_id, *, prompt_ids,
    sampling_params)`` -> ``TokenOutput``, answered by one of our policies. A scripted policy
    reads the episode behind the request id (``RUNNING_EPISODES``)."""

    def __init__(self, policy: Policy, stop_token_ids: tuple[int, ...] = ()) -> None:
        self.policy, self.stop_token_ids = policy, stop_token_ids
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any) -> TokenOutput:
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        params = SamplingParams(
            temperature=float(sampling_params.get("temperature", 1.0)), max_new_tokens=int(sampling_params["max_tokens"]),
            stop_token_ids=self.stop_token_ids, seed=0,
        )
        request = GenerationRequest(list(prompt_ids), params, context=RUNNING_EPISODES.get(request_id))
        generation = self.policy.generate([request])[0]
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=generation.logprobs if sampling_params.get("logprobs") else None,
            stop_reason="completed",
        )


def trainer_config(prompt_length: int = PROMPT_LENGTH, response_length: int = RESPONSE_LENGTH) -> Any:
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": response_length}},
        "data": {},
    })


def make_agent_loop(server: Any, tokenizer: Any, config: Any | None = None, **options: Any) -> Any:
    """Builds the registered agent loop exactly as verl's ``AgentLoopWorker`` does (hydra)."""
    config = config if config is not None else trainer_config()
    return hydra.utils.instantiate(
        config={**_agent_loop_registry[AGENT_NAME], **options},
        trainer_config=DictConfigWrap(config=config), server_manager=server, tokenizer=tokenizer,
        processor=None, hf_model_type=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
