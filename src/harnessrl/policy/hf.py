"""Transformers policy: batched sampling with a hand-written KV-cache decode loop, log-probs included.

``HFPolicy`` runs a local transformers causal LM (by default the embedded SmolLM2-135M-Instruct)
and samples many requests at once. It does not call ``model.generate``: the decode loop is
written out here so that the log-probability of every sampled token comes from the very
forward pass that sampled it (no second scoring pass), and so that each request samples
from its own random generator.

Conventions (what the trainer relies on):

* **Log-probabilities** are ``log_softmax(logits / temperature)`` at the sampled token, in
  float32, with the temperature of the request. Temperature 0 means greedy decoding
  (argmax) and its log-probabilities are ``log_softmax(logits)`` of the raw logits.
  ``top_p`` filters the distribution tokens are *drawn* from (nucleus sampling); the
  reported log-probability is still that of the unfiltered tempered distribution.
  ``score`` uses the same convention, so ``score(prompt, sampled)`` reproduces the
  sampled log-probabilities up to float rounding.
* **Seeds.** A request with ``seed`` samples from its own ``torch.Generator`` seeded with
  that seed alone, and draws one token per step from it, so its tokens do not depend on
  which other requests share the batch or in which order they come. Two requests with
  the same prompt and seed therefore return the same completion: give each rollout its
  own seed. ``seed=None`` draws a fresh random seed. In float32 (the CPU default) batched
  and single runs agree token for token; in bfloat16 a row's logits can move slightly with
  the batch's shape, so on rare steps a sampled token may differ.
* **Stopping.** A request stops when it samples one of *its* ``stop_token_ids`` (the stop
  token is the last returned id; finish reason ``stop``), or after ``max_new_tokens``
  tokens, or when prompt plus completion fill the model's context (``length``). An empty
  ``stop_token_ids`` means no stop token: pass ``tokenizer.stop_token_ids`` to stop at the
  end of the assistant message.
* **Errors.** A request that cannot run (empty prompt, prompt that fills the context, ids
  outside the vocabulary, invalid sampling parameters) and every request of a batch whose
  generation raised come back as ``Generation([], [], "error", error=...)``; ``generate``
  itself does not raise for them.
"""

from __future__ import annotations

import gc
import inspect
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from harnessrl.harness.chat import HFChatTokenizer
from harnessrl.policy.base import Generation, GenerationRequest, Policy, SamplingParams
from harnessrl.policy.embedded import resolve_model_path

# Models are local folders only; make sure no library reaches for a hub. Set before
# transformers (imported lazily below) loads huggingface_hub, which reads it at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str) -> torch.device:
    """Returns the torch device for ``device``: ``"auto"`` is CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """Returns the weight dtype: ``"auto"`` is bfloat16 on CUDA and float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def sample_index(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Returns one index drawn from ``probs`` (one row, unnormalized is fine), shape [1].

    Inverse-CDF sampling with exactly one uniform draw from ``generator`` per call, so a
    request's stream of draws does not depend on anything else in the batch. (It is also
    ~20x faster than ``torch.multinomial`` over a 49k vocabulary on CPU.) Zero-probability
    entries are never drawn.
    """
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[-1:]
    uniform = torch.rand(1, generator=generator, device=probs.device, dtype=cdf.dtype) * total
    # Rounding could make uniform == total, which would index past the last nonzero entry.
    uniform = torch.minimum(uniform, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, uniform, right=True)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Returns ``probs`` (one row, unnormalized is fine) with everything outside the nucleus
    zeroed: the smallest set of most likely tokens whose mass reaches ``top_p`` is kept
    (Holtzman et al. 2020, section 3.1). The most likely token is always kept."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p * sorted_probs.sum(), 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


class HFPolicy(Policy):
    """A local transformers causal LM that samples batches of token-id prompts.

    ``model`` is a local transformers folder, or ``None`` / ``"embedded"`` for the embedded
    default (see ``policy/embedded.py``). ``device="auto"`` picks CUDA when available;
    ``dtype="auto"`` is bfloat16 on CUDA and float32 on CPU. At most ``max_batch_size``
    requests run in one batch; more are processed in chunks of similar prompt lengths.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        device: str = "auto",
        dtype: str | torch.dtype = "auto",
        max_batch_size: int = 16,
        attn_implementation: str | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.model_path: Path = resolve_model_path(model)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.max_batch_size = max_batch_size
        self.hf_tokenizer: Any = AutoTokenizer.from_pretrained(
            self.model_path, local_files_only=True
        )
        self.tokenizer: HFChatTokenizer = HFChatTokenizer(self.hf_tokenizer)
        extra: dict[str, Any] = {}
        if attn_implementation is not None:
            extra["attn_implementation"] = attn_implementation
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=self.dtype, local_files_only=True, **extra
        )
        self.model.to(self.device)
        self.model.eval()
        self.name = f"hf:{self.model_path.name}"
        config = self.model.config
        self.vocab_size: int = int(self.model.get_output_embeddings().weight.shape[0])
        context = getattr(config, "max_position_embeddings", None)
        self.context_length: int | None = int(context) if context else None
        # transformers renamed the forward's ``past_key_values`` to ``cache`` (5.2x); use the
        # name this version's model takes so both old and new releases run without warnings.
        forward_parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in forward_parameters else "past_key_values"
        self._new_cache = DynamicCache

    # ---------------------------------------------------------------- public API

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns one generation per request, in order (see the module docstring for the
        log-probability, seed, stop and error conventions)."""
        results: list[Generation | None] = [None] * len(requests)
        runnable: list[int] = []
        for index, request in enumerate(requests):
            problem = self._request_problem(request)
            if problem is not None:
                results[index] = Generation([], [], "error", error=problem)
            elif request.params.max_new_tokens == 0:
                results[index] = Generation([], [], "length")
            else:
                runnable.append(index)
        # Similar lengths share a batch, so little compute goes to padding. Per-request
        # generators make the tokens independent of this grouping.
        runnable.sort(key=lambda index: len(requests[index].prompt_ids), reverse=True)
        for start in range(0, len(runnable), self.max_batch_size):
            chunk = runnable[start : start + self.max_batch_size]
            try:
                generations = self._generate_batch([requests[index] for index in chunk])
            except Exception as exc:  # one failing batch must not take the others down
                message = f"generation failed: {type(exc).__name__}: {exc}"
                generations = [Generation([], [], "error", error=message) for _ in chunk]
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
            for index, generation in zip(chunk, generations, strict=True):
                results[index] = generation
        return cast(list[Generation], results)  # every slot was filled above

    def score(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float = 1.0
    ) -> list[float]:
        """Returns the log-probability of each completion token given the prompt and the
        completion tokens before it, from one teacher-forced forward pass:
        ``log_softmax(logits / temperature)`` (raw logits for temperature 0), the same
        convention as ``generate``."""
        if not prompt_ids:
            raise ValueError("score needs a non-empty prompt")
        if not completion_ids:
            return []
        if temperature < 0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        total = len(prompt_ids) + len(completion_ids)
        if self.context_length is not None and total > self.context_length:
            raise ValueError(
                f"prompt + completion of {total} tokens exceed the model's context of "
                f"{self.context_length} tokens"
            )
        input_ids = torch.tensor([[*prompt_ids, *completion_ids]], device=self.device)
        with torch.inference_mode():
            # The logits at positions len(prompt)-1 .. total-2 predict the completion tokens.
            logits = (
                self.model(
                    input_ids=input_ids, use_cache=False, logits_to_keep=len(completion_ids) + 1
                )
                .logits[0, :-1]
                .float()
            )
            if temperature > 0:
                logits = logits / temperature
            logprobs = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(list(completion_ids), device=self.device)
            chosen = logprobs.gather(-1, targets[:, None])[:, 0]
        return [float(value) for value in chosen.tolist()]

    def close(self) -> None:
        """Releases the model's memory."""
        self.model = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---------------------------------------------------------------- internals

    def _request_problem(self, request: GenerationRequest) -> str | None:
        """Returns why ``request`` cannot run, or None when it can."""
        params = request.params
        prompt = request.prompt_ids
        if len(prompt) == 0:
            return "empty prompt: a request needs at least one prompt token"
        if self.context_length is not None and len(prompt) >= self.context_length:
            return (
                f"prompt of {len(prompt)} tokens leaves no room in the model's context of "
                f"{self.context_length} tokens"
            )
        if not all(isinstance(i, int) and 0 <= i < self.vocab_size for i in prompt):
            return f"prompt holds ids that are not ints in the vocabulary [0, {self.vocab_size})"
        if not (math.isfinite(params.temperature) and params.temperature >= 0):
            return f"temperature must be finite and >= 0, got {params.temperature}"
        if not (0 < params.top_p <= 1):
            return f"top_p must be in (0, 1], got {params.top_p}"
        if params.max_new_tokens < 0:
            return f"max_new_tokens must be >= 0, got {params.max_new_tokens}"
        return None

    def _generator(self, seed: int | None) -> torch.Generator:
        """Returns a fresh generator on the model's device seeded with ``seed`` (random if None)."""
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
        return generator

    def _sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator],
    ) -> tuple[list[int], list[float]]:
        """Returns one sampled token per row of ``logits`` (float32, [rows, vocab]) and its
        log-probability; each row draws from its own generator."""
        temperatures = torch.tensor(
            [p.temperature if p.temperature > 0 else 1.0 for p in params],
            device=logits.device,
            dtype=logits.dtype,
        )
        logprobs = torch.log_softmax(logits / temperatures[:, None], dim=-1)
        chosen: list[torch.Tensor] = []
        for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
            if row_params.temperature == 0:
                chosen.append(torch.argmax(logprobs[row]).reshape(1))
                continue
            probs = top_p_filter(logprobs[row].exp(), row_params.top_p)
            chosen.append(sample_index(probs, generator))
        tokens = torch.cat(chosen)
        token_logprobs = logprobs.gather(-1, tokens[:, None])[:, 0]
        return tokens.tolist(), token_logprobs.tolist()

    @torch.inference_mode()
    def _generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Samples one batch: left-padded prefill, then one token per step for every row still
        running, reusing the KV cache; rows that finish are dropped from the batch."""
        rows = len(requests)
        prompt_lengths = [len(request.prompt_ids) for request in requests]
        width = max(prompt_lengths)
        input_ids = torch.full((rows, width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((rows, width), dtype=torch.long)
        for row, request in enumerate(requests):
            input_ids[row, width - prompt_lengths[row] :] = torch.tensor(request.prompt_ids)
            attention_mask[row, width - prompt_lengths[row] :] = 1
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        # Left padding: every prompt's first real token sits at position 0.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

        params = [request.params for request in requests]
        generators = [self._generator(p.seed) for p in params]
        stop_ids = [frozenset(p.stop_token_ids) for p in params]
        budgets = [
            p.max_new_tokens
            if self.context_length is None
            else min(p.max_new_tokens, self.context_length - length)
            for p, length in zip(params, prompt_lengths, strict=True)
        ]
        token_ids: list[list[int]] = [[] for _ in range(rows)]
        token_logprobs: list[list[float]] = [[] for _ in range(rows)]
        finish_reasons = ["length"] * rows
        active = list(range(rows))  # request row of each batch row still running

        # The model fills this cache in place; holding it here keeps the loop independent of
        # what the output object calls it.
        cache = self._new_cache(config=self.model.config)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_argument: cache},
        )
        logits = outputs.logits[:, -1, :].float()
        next_positions = position_ids[:, -1] + 1
        while True:
            sampled, sampled_logprobs = self._sample(
                logits, [params[row] for row in active], [generators[row] for row in active]
            )
            keep: list[int] = []
            for batch_row, row in enumerate(active):
                token = sampled[batch_row]
                token_ids[row].append(token)
                token_logprobs[row].append(sampled_logprobs[batch_row])
                if token in stop_ids[row]:
                    finish_reasons[row] = "stop"
                elif len(token_ids[row]) < budgets[row]:
                    keep.append(batch_row)
            if not keep:
                break
            next_input = torch.tensor(sampled, device=self.device)[:, None]
            if len(keep) < len(active):
                # Compact: finished rows leave the batch and the KV cache.
                kept = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(kept)
                attention_mask = attention_mask[kept]
                next_positions = next_positions[kept]
                next_input = next_input[kept]
                active = [active[batch_row] for batch_row in keep]
            attention_mask = torch.cat(
                [attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1
            )
            outputs = self.model(
                input_ids=next_input,
                attention_mask=attention_mask,
                position_ids=next_positions[:, None],
                use_cache=True,
                **{self._cache_argument: cache},
            )
            logits = outputs.logits[:, -1, :].float()
            next_positions = next_positions + 1
        return [
            Generation(token_ids[row], token_logprobs[row], finish_reasons[row])
            for row in range(rows)
        ]
