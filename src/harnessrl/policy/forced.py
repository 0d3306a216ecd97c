"""`ForcedSampling`: a policy whose every request samples with the caller's fixed settings, whatever the request asked for."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Sequence
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

    @property
    def supports_continuous(self) -> bool:
        """Whether the wrapped policy batches continuously (``HFPolicy.continuous``)."""
        return bool(getattr(self.policy, "supports_continuous", False))

    @contextlib.contextmanager
    def continuous(self) -> Iterator[Any]:
        """The wrapped policy's continuous decoder, every request added to it forced as here."""
        with self.policy.continuous() as decoder:  # type: ignore[attr-defined]  # supports_continuous
            yield _ForcedDecoder(decoder, self._forced)

    def _forced(self, requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
        cap = self.max_new_tokens
        return [
            replace(request, params=replace(
                request.params, temperature=self.temperature, top_p=self.top_p,
                max_new_tokens=request.params.max_new_tokens if cap is None else min(request.params.max_new_tokens, cap)))
            for request in requests
        ]


class _ForcedDecoder:
    """A ``StepDecoder`` whose added requests sample with ``ForcedSampling``'s settings."""

    def __init__(self, decoder: Any, forced: Callable[[Sequence[GenerationRequest]], list[GenerationRequest]]) -> None:
        self._decoder, self._forced = decoder, forced

    def add(self, key: Hashable, request: GenerationRequest,
            on_tokens: Callable[[Sequence[int]], bool | None] | None = None) -> None:
        self._decoder.add(key, self._forced([request])[0], on_tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)
