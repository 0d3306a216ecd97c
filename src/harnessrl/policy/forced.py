"""`ForcedSampling`: a policy whose every request samples with the caller's fixed settings, whatever the request asked for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from harnessrl.policy.base import Generation, GenerationRequest, Policy, TokenSink


class ForcedSampling(Policy):
    """``policy`` (the very object, not a copy) with every request's temperature and top-p
    set to ``temperature`` / ``top_p`` and its output limit capped at ``max_new_tokens``
    (None: the request's own); each request keeps its seed.

    An agent program names its own sampling (or none). Black-box training serves the policy
    through this so that the recorded log-probabilities are those of the training sampling
    the update assumes; an evaluation through an agent, so that ``--temperature`` holds for
    the agent's requests as for in-space episodes.
    """

    def __init__(self, policy: Policy, temperature: float, top_p: float = 1.0,
                 max_new_tokens: int | None = None) -> None:
        self.policy = policy
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.name = getattr(policy, "name", "policy")

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @property
    def context_length(self) -> int | None:
        return getattr(self.policy, "context_length", None)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return self.policy.generate(self._forced(requests))

    def generate_stream(self, requests: Sequence[GenerationRequest], on_tokens: TokenSink) -> list[Generation]:
        # A server samples through here: its batcher ends a generation early, at its next
        # token, when it closes.
        return self.policy.generate_stream(self._forced(requests), on_tokens)

    def _forced(self, requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
        cap = self.max_new_tokens
        return [
            replace(request, params=replace(
                request.params, temperature=self.temperature, top_p=self.top_p,
                max_new_tokens=request.params.max_new_tokens if cap is None else min(request.params.max_new_tokens, cap)))
            for request in requests
        ]
