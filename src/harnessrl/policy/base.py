"""The Policy protocol: a batch of token-id prompts in, sampled ids with log-probs out; the one
request validation every backend runs; what a request's context offers scripted policies; and
what the trainer needs from the policy that rolls out for it."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harnessrl.harness.chat import ChatTokenizer
from harnessrl.harness.limits import DEFAULT_MAX_NEW_TOKENS

if TYPE_CHECKING:
    import torch

    from harnessrl.harness.base import EpisodeState, Message
    from harnessrl.harness.harness import Harness
    from harnessrl.tasks.model import Task


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@runtime_checkable
class EpisodeView(Protocol):
    """What a scripted policy may read from the episode asking (``rollout.episode.Episode``
    passes itself): the task (its gold solution), the harness (its tool interface renders an
    action in the harness's syntax, its workflow says whether a plan is due) and the episode's
    state (turn, submits, plan), and its history (the messages shown so far, each with its span
    label). Model policies never read it."""

    @property
    def task(self) -> Task: ...

    @property
    def history(self) -> list[Message]: ...

    @property
    def harness(self) -> Harness: ...

    @property
    def state(self) -> EpisodeState: ...


@runtime_checkable
class ConversationView(Protocol):
    """What a scripted policy behind ``harnessrl serve`` may read from the client's request
    (``serve.context.ServeContext`` is one): its session name, and its messages and tools in
    the normalized form ``serve.context`` describes."""

    @property
    def session(self) -> str | None: ...

    @property
    def messages(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def tools(self) -> Sequence[Mapping[str, Any]]: ...


RequestContext = EpisodeView | ConversationView
"""Who asks for a completion: an episode, or a client conversation of the server."""


@dataclass
class GenerationRequest:
    """One prompt to complete. ``context`` is who asks (see ``RequestContext``): scripted
    policies read it, model policies ignore it."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    context: RequestContext | None = None


@dataclass
class Generation:
    """A sampled completion: ids, one log-probability per id, and why sampling stopped
    (``stop``: a stop token was sampled; ``length``: max_new_tokens; ``abort``: the token sink
    of ``generate_stream`` ended it, its client gone; ``error``)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    error: str | None = None


def request_problem(
    request: GenerationRequest, *, context_length: int | None = None, vocab_size: int | None = None
) -> str | None:
    """Returns why ``request`` cannot run, or None when it can: an empty prompt, a prompt that
    leaves no room in a context of ``context_length`` tokens, ids outside a vocabulary of
    ``vocab_size`` (both checked only when the backend knows them), a temperature that is not
    finite and >= 0, a ``top_p`` outside (0, 1], or a negative ``max_new_tokens``.

    ``max_new_tokens=0`` is valid: it bounds the completion, and the empty completion meets
    that bound exactly, so ``triage_requests`` answers it without the model (finish reason
    ``length``). Every backend then gives it the same answer, including servers that would
    reject ``max_tokens=0`` or sample a token anyway.
    """
    params = request.params
    prompt = request.prompt_ids
    if len(prompt) == 0:
        return "empty prompt: a request needs at least one prompt token"
    if context_length is not None and len(prompt) >= context_length:
        return (
            f"prompt of {len(prompt)} tokens leaves no room in the model's context of "
            f"{context_length} tokens"
        )
    if vocab_size is not None and not all(isinstance(i, int) and 0 <= i < vocab_size for i in prompt):
        return f"prompt holds ids that are not ints in the vocabulary [0, {vocab_size})"
    if not (math.isfinite(params.temperature) and params.temperature >= 0):
        return f"temperature must be finite and >= 0, got {params.temperature}"
    if not (0 < params.top_p <= 1):
        return f"top_p must be in (0, 1], got {params.top_p}"
    if params.max_new_tokens < 0:
        return f"max_new_tokens must be >= 0, got {params.max_new_tokens}"
    return None


def triage_requests(
    requests: Sequence[GenerationRequest], *, context_length: int | None = None, vocab_size: int | None = None
) -> tuple[list[Generation | None], list[int]]:
    """Returns one slot per request, filled where the request is answered without the model
    (an ``error`` generation naming the problem, see ``request_problem``, or the empty
    ``length`` completion of ``max_new_tokens=0``), and the indices of the requests the
    model must run, in order."""
    results: list[Generation | None] = [None] * len(requests)
    runnable: list[int] = []
    for index, request in enumerate(requests):
        problem = request_problem(request, context_length=context_length, vocab_size=vocab_size)
        if problem is not None:
            results[index] = Generation([], [], "error", error=problem)
        elif request.params.max_new_tokens == 0:
            results[index] = Generation([], [], "length")
        else:
            runnable.append(index)
    return results, runnable


TokenSink = Callable[[int, Sequence[int]], "bool | None"]
"""Receives ``(index, ids)``: ids that request ``index`` of a ``generate_stream`` batch sampled
since the last call for it, in order (the concatenation of one request's calls is its
generation's ``token_ids``). Returning ``False`` asks the policy to stop sampling that request
(its client is gone): a policy that decodes step by step ends it there, finish reason
``abort``, and the rest of the batch goes on; any other return value is ignored."""


class Policy(ABC):
    """Anything that completes token-id prompts: scripted, transformers, an inference server."""

    name: str = "policy"
    tokenizer: ChatTokenizer

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns one generation per request, in order."""

    def generate_stream(self, requests: Sequence[GenerationRequest], on_tokens: TokenSink) -> list[Generation]:
        """Returns what ``generate`` returns, handing each request's ids to ``on_tokens`` as
        they are sampled (what ``harnessrl serve`` streams). This default hands over each
        whole completion at the end; a policy that decodes step by step (``HFPolicy``)
        overrides it to hand over every token as it is sampled."""
        generations = self.generate(requests)
        for index, generation in enumerate(generations):
            if generation.token_ids:
                on_tokens(index, generation.token_ids)
        return generations

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Releases resources (model memory, connections)."""


class WeightSyncedPolicy(Policy):
    """A policy that can roll out for the trainer: besides ``tokenizer`` and ``generate`` it
    takes the trained weights after every optimizer step (``sync_weights``) and can drop the
    KV it cached with older weights (``clear_prefix_cache``). ``rl/loop.py`` builds it with
    ``harnessrl.policy.make_training_policy``. ``weight_version`` counts the syncs: the
    trainer stamps it on every trajectory and refuses to update on rollouts of an older one."""

    weight_version: int = 0

    @abstractmethod
    def local_model(self) -> torch.nn.Module | None:
        """Returns the model the rollouts sample from when it lives in this process in a form
        the trainer may train in place (it then trains that very object), else None (the
        trainer loads its own copy and syncs it in)."""

    @abstractmethod
    def sync_weights(self, trained: torch.nn.Module) -> None:
        """Makes later rollouts sample with the current weights of ``trained`` (the trainer's
        model) and drops every prefix KV computed with older weights."""

    @abstractmethod
    def clear_prefix_cache(self) -> None:
        """Drops every cached prefix; needed whenever the weights change."""
