"""The Policy protocol: a batch of token-id prompts in, sampled ids with log-probs out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harnessrl.harness.chat import ChatTokenizer


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class GenerationRequest:
    """One prompt to complete. ``context`` is the episode asking (scripted policies read it;
    model policies ignore it)."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    context: Any = None


@dataclass
class Generation:
    """A sampled completion: ids, one log-probability per id, and why sampling stopped
    (``stop``: a stop token was sampled; ``length``: max_new_tokens; ``error``)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    error: str | None = None


class Policy(ABC):
    """Anything that completes token-id prompts: scripted, transformers, an inference server."""

    name: str = "policy"
    tokenizer: ChatTokenizer

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns one generation per request, in order."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Releases resources (model memory, connections)."""
