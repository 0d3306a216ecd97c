"""Transformers policy: batched sampling with a hand-written KV-cache decode loop, log-probs included.

``HFPolicy`` runs a local transformers causal LM (by default the embedded SmolLM2-135M-Instruct)
and samples many requests at once. It does not call ``model.generate``: the decode loop is
written out here so that the log-probability of every sampled token comes from the very
forward pass that sampled it (no second scoring pass), and so that each request samples
from its own random generator.

Conventions (what the trainer relies on):

* **Log-probabilities** are ``log_softmax(logits / temperature)`` at the sampled token, in
  float32, with the temperature of the request. Temperature 0 (or below
  ``sampling.GREEDY_TEMPERATURE``, 1e-5) means greedy decoding (argmax) and its
  log-probabilities are ``log_softmax(logits)`` of the raw logits.
  ``top_p`` filters the distribution tokens are *drawn* from (nucleus sampling); the
  reported log-probability is still that of the unfiltered tempered distribution.
  ``score`` uses the same convention, so ``score(prompt, sampled)`` reproduces the
  sampled log-probabilities up to float rounding.
* **Seeds.** A request with ``seed`` samples from its own ``torch.Generator`` seeded with
  that seed alone, and draws one token per step from it, so its tokens do not depend on
  which other requests share the batch or in which order they come. Two requests with
  the same prompt and seed therefore return the same completion: give each rollout its
  own seed. ``seed=None`` draws a fresh random seed. In float32 (the CPU default) batched
  and single runs compute a row's logits alike up to float rounding (log-probs within ~3e-5),
  so they sample the same tokens except where a draw lands that close to a boundary of its
  cumulative distribution (once in the tests' 72 seeded draws: 6e-7 away); in bfloat16 a
  row's logits move more with the batch's shape, so sampled tokens differ more often.
* **Linear layers** on CPU run through oneDNN on weights packed once per weight version
  (``policy/packed_linear.py``, option ``packed_linear``): 2x the decode tokens per CPU second
  of aten's float32 kernels on this project's CPU, the same greedy tokens.
* **Stopping.** A request stops when it samples one of *its* ``stop_token_ids`` (the stop
  token is the last returned id; finish reason ``stop``), or after ``max_new_tokens``
  tokens, or when prompt plus completion fill the model's context (``length``). An empty
  ``stop_token_ids`` means no stop token: pass ``tokenizer.stop_token_ids`` to stop at the
  end of the assistant message.
* **Prefix KV cache.** The KV of finished requests (prompt and completion) stays in a radix
  tree over token ids (``policy/prefix_cache.py``: what it reuses, its LRU bound
  ``max_prefix_cache_tokens``; ``0`` turns it off); a new prompt prefills only what follows its
  longest cached prefix, and at least its last token, for its logits. Cached keys carry their
  rotary position, so a row's prefix is copied into the batch as is (rows left-padded to one
  width, pads masked, each row its true ``position_ids``): cached and uncached runs compute the
  same function, in float32 up to the prefill's chunking (tests: equal tokens, log-probs within
  1e-4). Cached KV belongs to the weights it was computed with: call ``clear_prefix_cache()``
  after changing them (the trainer does after every optimizer step and after wrapping a LoRA
  adapter). As a safety net the cache drops itself when it sees another model object or a
  parameter whose in-place version counter moved (``optimizer.step()``, ``load_state_dict``;
  writes through ``param.data`` do not move it). Models with a sliding-window layer run without
  it (one left-padded batched prefill into a plain ``DynamicCache``). ``cache_stats`` counts
  requests, hits, reused and prefilled tokens, evictions.
* **Prefill and decode.** Prefill runs one request at a time (its uncached suffix, its attention
  over the cached prefix through ``prefill_attention.cpp`` where that kernel is on), so a later
  request of the batch reuses the system prompt an earlier one just prefilled; on this project's
  2-core CPU a padded batched prefill was no cheaper per token. Then all requests decode together,
  their KV in one preallocated tensor written in place (``policy/kv_slab.py``; a finished row
  leaves at once), each row's attention reading only the columns it fills: through
  ``decode_attention.cpp`` where it fits, else SDPA per length tier (``grouped_sdpa_attention``,
  registered with transformers as ``harnessrl_grouped_sdpa``), or cascade attention over shared
  prefixes where that is on (``cascade_attention``). Each is the same function up to rounding.
* **Errors.** A request that cannot run (``policy.base.request_problem``: empty prompt, prompt
  that fills the context, ids outside the vocabulary, invalid sampling parameters) and every
  request of a batch whose generation raised come back as
  ``Generation([], [], "error", error=...)``; ``generate`` itself does not raise for them.
  ``max_new_tokens=0`` returns the empty ``length`` completion without running the model.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from harnessrl.harness.chat import HFChatTokenizer
from harnessrl.policy.base import (
    Generation,
    GenerationRequest,
    SamplingParams,
    TokenSink,
    WeightSyncedPolicy,
    triage_requests,
)
from harnessrl.policy.cascade import (
    MIN_SHARED_PREFIX,
    cascade_order,
    decode_blocks,
    prefix_groups,
    row_groups,
)
from harnessrl.policy.continuous import StepDecoder, open_decoder
from harnessrl.policy.decode_kernel import (
    decode_arguments,
    kernel_fits,
    prefill_arguments,
    select_kernel,
)
from harnessrl.policy.device import resolve_device, resolve_dtype
from harnessrl.policy.embedded import resolve_model_path
from harnessrl.policy.kv_slab import GROUPED_SDPA, KVSlab
from harnessrl.policy.merged import sampling_weights
from harnessrl.policy.packed_linear import PackedLinears, onednn_linear_available
from harnessrl.policy.prefix_cache import PrefixCache, PrefixCacheStats
from harnessrl.policy.sampling import effective_temperature, sample_rows, seeded_generator

# Models are local folders only; make sure no library reaches for a hub. Set before
# transformers (imported below) loads huggingface_hub, which reads it at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer


class HFPolicy(WeightSyncedPolicy):
    """A local transformers causal LM that samples batches of token-id prompts.

    ``model`` is a local transformers folder, or ``None`` / ``"embedded"`` for the embedded
    default (see ``policy/embedded.py``). ``device="auto"`` picks CUDA when available;
    ``dtype="auto"`` is bfloat16 on CUDA and float32 on CPU. At most ``max_batch_size``
    requests run in one batch; more are processed in chunks of similar prompt lengths.
    ``max_prefix_cache_tokens`` bounds the prefix KV cache (see the module docstring; float32
    SmolLM2-135M takes about 46 KB per token, so the default 65,536 tokens is about 3 GB);
    ``0`` turns it off. ``packed_linear`` runs the model's linear layers through oneDNN on
    weights packed once (``policy/packed_linear.py``; 2-3x faster decode steps on this project's
    CPU, same function up to float rounding, the packed copies take the linear weights' memory
    again); ``None`` turns it on wherever it can run (CPU, float32 or bfloat16).
    ``cascade_attention``: rows of a batch that share a prompt prefix (a GRPO group's rollouts)
    sit next to each other and a decode step reads their prefix once for all of them
    (``policy/cascade.py``; the same attention up to rounding); it needs the prefix cache and
    SDPA, and is off otherwise. ``decode_kernel`` runs decode steps' attention through the C++
    kernel of ``policy/decode_kernel.py`` (built at first use; the same attention up to float
    rounding, each row's keys read once for the query heads that share them); ``None`` turns it
    on wherever it fits (CPU, float32 or bfloat16, SDPA, a head size it is built for) and builds; cascade
    attention, where on, takes the decode steps instead. ``prefill_kernel``, alike, runs a request's
    prefill attention over its cached prefix through ``prefill_attention.cpp``.
    ``generate`` calls are serialized by a lock.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        device: str = "auto",
        dtype: str | torch.dtype = "auto",
        max_batch_size: int = 16,
        attn_implementation: str | None = None,
        max_prefix_cache_tokens: int = 65536,
        packed_linear: bool | None = None,
        cascade_attention: bool = False,
        decode_kernel: bool | None = None,
        prefill_kernel: bool | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_prefix_cache_tokens < 0:
            raise ValueError(f"max_prefix_cache_tokens must be >= 0, got {max_prefix_cache_tokens}")
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
        text_config = config.get_text_config(decoder=True)
        heads = int(text_config.num_attention_heads)
        self._kv_shape = (
            int(text_config.num_hidden_layers),
            int(getattr(text_config, "num_key_value_heads", None) or heads),
            int(getattr(text_config, "head_dim", None) or text_config.hidden_size // heads),
        )
        # The slab and the prefix cache hold every token of every layer; a sliding-window or
        # other special layer keeps less, so such models take the plain DynamicCache path.
        self._full_attention = all(
            type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers
        )
        # Decode steps attend per length tier instead of over the whole padded width (same
        # result; see grouped_sdpa_attention). Only where SDPA was in use; other callers of the
        # model (the trainer) pass no groups and get plain SDPA.
        self._grouped_attention = self._full_attention and config._attn_implementation == "sdpa"
        if self._grouped_attention:
            self.model.set_attn_implementation(GROUPED_SDPA)
        self.cache_stats = PrefixCacheStats()
        self.prefix_cache: PrefixCache | None = (
            PrefixCache(max_prefix_cache_tokens, self.cache_stats)
            if max_prefix_cache_tokens > 0 and self._full_attention
            else None
        )
        self.cascade_attention = cascade_attention and self._grouped_attention and self.prefix_cache is not None
        fits = self._grouped_attention and kernel_fits(self.device, self.dtype, heads, *self._kv_shape[1:])
        self._decode_kernel = select_kernel(decode_kernel, fits)
        self._prefill_kernel = select_kernel(prefill_kernel, fits, "prefill_kernel")
        self._weights_seen: tuple[int, int] | None = None
        self._lock = threading.Lock()
        can_pack = onednn_linear_available(self.device, self.dtype)
        if packed_linear and not can_pack:
            raise ValueError(
                f"packed_linear needs a CPU with oneDNN and float32 or bfloat16 weights, "
                f"not {self.device} / {self.dtype}; pass packed_linear=None to choose automatically"
            )
        self.packed_linears: PackedLinears | None = (
            PackedLinears() if (can_pack if packed_linear is None else packed_linear) else None
        )

    # ---------------------------------------------------------------- public API

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns one generation per request, in order (see the module docstring for the
        log-probability, seed, stop, prefix-cache and error conventions)."""
        with self._lock, self._linears_installed():
            self._drop_stale_prefix_cache()
            return self._generate_locked(requests)

    def generate_stream(self, requests: Sequence[GenerationRequest], on_tokens: TokenSink) -> list[Generation]:
        """Returns what ``generate`` returns, handing every sampled token to ``on_tokens``
        (with its request's index) right after the decode step that sampled it; the tokens,
        log-probs and batching are those of ``generate``."""
        with self._lock, self._linears_installed():
            self._drop_stale_prefix_cache()
            return self._generate_locked(requests, on_tokens)

    def continuous(self) -> contextlib.AbstractContextManager[StepDecoder]:
        """Returns a context holding a ``StepDecoder`` (``policy/continuous.py``): one decode batch
        that requests join and leave between steps (continuous batching), the conventions of
        ``generate`` otherwise. The policy's lock is held while it is open. Only for models
        whose layers all use full attention (``supports_continuous``)."""
        return open_decoder(self)

    @property
    def supports_continuous(self) -> bool:
        """Whether ``continuous`` can run on this model (every layer full attention)."""
        return self._full_attention

    def clear_prefix_cache(self) -> None:
        """Drops every cached prefix; call it whenever the model's weights change."""
        with self._lock:
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
                self.cache_stats.invalidations += 1
            if self.packed_linears is not None and self.model is not None:
                self.packed_linears.clear(self.model)
            self._weights_seen = None

    def _linears_installed(self) -> Any:
        """Returns a context in which the model's linear layers run on packed weights (when
        ``packed_linear`` is on; otherwise a context that changes nothing)."""
        if self.packed_linears is None:
            return contextlib.nullcontext()
        return self.packed_linears.installed(self.model)

    def local_model(self) -> Any:
        """Returns the transformers model this policy samples from (it lives in this process,
        so the trainer may train it in place)."""
        return self.model

    def sync_weights(self, trained: torch.nn.Module) -> None:
        """Makes later generations use the current weights of ``trained`` and drops the prefix
        cache. ``trained`` is this policy's own model (nothing to copy), a model that wraps it
        (a PEFT LoRA model around it: the policy samples through the wrapper from now on), or
        a separate model: a copy with the same parameter names (a float32 master copy: its
        parameters are copied in, cast to this policy's dtype) or a PEFT LoRA model around a
        copy (its adapters merged into this policy's weights: ``policy.merged``)."""
        if trained is not self.model:
            if any(module is self.model for module in trained.modules()):
                self.model = trained
            else:
                with self._lock, torch.no_grad():
                    targets = dict(self.model.named_parameters())
                    for name, value in sampling_weights(trained):
                        targets[name].copy_(value)
        self.clear_prefix_cache()
        self.weight_version += 1

    def _drop_stale_prefix_cache(self) -> None:
        """Clears the prefix cache when the model object or a parameter's version counter
        changed since the last call (a safety net under ``clear_prefix_cache``)."""
        if self.prefix_cache is None:
            return
        seen = (id(self.model), sum(parameter._version for parameter in self.model.parameters()))
        if self._weights_seen is not None and seen != self._weights_seen:
            self.prefix_cache.clear()
            self.cache_stats.invalidations += 1
        self._weights_seen = seen

    def _generate_locked(
        self, requests: Sequence[GenerationRequest], on_tokens: TokenSink | None = None
    ) -> list[Generation]:
        """``generate`` under the lock (``on_tokens``: see ``generate_stream``)."""
        results, runnable = triage_requests(
            requests, context_length=self.context_length, vocab_size=self.vocab_size
        )
        # Similar lengths share a batch, so little compute goes to padding, and rows come
        # longest first, so decode attention splits them into tight length tiers. Per-request
        # generators make the tokens independent of this grouping.
        if self.cascade_attention:  # and rows that share a prefix next to each other
            runnable = [runnable[i] for i in cascade_order([requests[index].prompt_ids for index in runnable])]
        else:
            runnable.sort(key=lambda index: len(requests[index].prompt_ids), reverse=True)
        for start in range(0, len(runnable), self.max_batch_size):
            chunk = runnable[start : start + self.max_batch_size]
            sink: TokenSink | None = None
            if on_tokens is not None:

                def sink(row: int, ids: Sequence[int], chunk: list[int] = chunk) -> bool | None:
                    return on_tokens(chunk[row], ids)

            try:
                generations = self._generate_batch([requests[index] for index in chunk], sink)
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
        temperature = effective_temperature(temperature)
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
        self.packed_linears = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---------------------------------------------------------------- internals

    def _generator(self, seed: int | None) -> torch.Generator:
        """Returns a fresh generator on the model's device seeded with ``seed`` (random if None)."""
        return seeded_generator(self.device, seed)

    def _sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator],
    ) -> tuple[list[int], list[float]]:
        """``sampling.sample_rows``: one token per row of ``logits``, each row from its own generator."""
        return sample_rows(logits, params, generators)

    @torch.inference_mode()
    def _generate_batch(
        self, requests: Sequence[GenerationRequest], on_tokens: TokenSink | None = None
    ) -> list[Generation]:
        """Samples one batch: prefill (cached prefixes reused), then one token per step for
        every row still running; rows that finish leave the batch and, with the prefix cache
        on, leave their prompt and completion KV in it. ``on_tokens(row, [token])`` hears of
        every token once it is sampled; when it returns False the row ends there (``abort``)."""
        rows = len(requests)
        prompts = [list(request.prompt_ids) for request in requests]
        prompt_lengths = [len(prompt) for prompt in prompts]
        width = max(prompt_lengths)
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

        # Left padding: row r's real tokens fill the last prompt_lengths[r] of `width` columns.
        attention_mask = torch.zeros((rows, width), dtype=torch.long, device=self.device)
        for row, length in enumerate(prompt_lengths):
            attention_mask[row, width - length :] = 1
        next_positions = torch.tensor(prompt_lengths, device=self.device)
        slab: KVSlab | None = None
        cascade: tuple[list[int], list[int]] | None = None  # each row's group, each group's shared prefix
        if self._full_attention:
            # Room for the prompts and every token but the last (which is never fed back).
            slab = self._new_slab(rows, width + max(budgets) - 1, width)
            prefilled = [
                self._prefill_row(prompt, slab.buffer[:, :, row : row + 1, :, :width])
                for row, prompt in enumerate(prompts)
            ]
            logits = torch.cat([row_logits for row_logits, _ in prefilled])
            cache = slab.cache()
            if self.cascade_attention:
                cascade = self._cascade_groups(prompts, [reused for _, reused in prefilled])
        else:
            logits, cache = self._prefill_padded(prompts, attention_mask)

        while True:
            sampled, sampled_logprobs = self._sample(
                logits, [params[row] for row in active], [generators[row] for row in active]
            )
            keep: list[int] = []
            for batch_row, row in enumerate(active):
                token = sampled[batch_row]
                token_ids[row].append(token)
                token_logprobs[row].append(sampled_logprobs[batch_row])
                aborted = on_tokens is not None and on_tokens(row, [token]) is False
                if token in stop_ids[row]:
                    finish_reasons[row] = "stop"
                elif aborted:  # the sink's client is gone: the row leaves the batch
                    finish_reasons[row] = "abort"
                elif len(token_ids[row]) < budgets[row]:
                    keep.append(batch_row)
                    continue
                if slab is not None and self.prefix_cache is not None:
                    # Fed so far: the prompt and every sampled token but this last one.
                    start = width - prompt_lengths[row]
                    self.prefix_cache.insert(
                        prompts[row] + token_ids[row][:-1],
                        slab.buffer[:, :, batch_row, :, start : slab.lengths[0]],
                    )
            if not keep:
                break
            next_input = torch.tensor(sampled, device=self.device)[:, None]
            if len(keep) < len(active):
                # Compact: finished rows leave the batch and the KV cache.
                kept = torch.tensor(keep, device=self.device)
                if slab is not None:
                    slab.select(kept)
                else:
                    cache.batch_select_indices(kept)
                attention_mask = attention_mask[kept]
                next_positions = next_positions[kept]
                next_input = next_input[kept]
                active = [active[batch_row] for batch_row in keep]
            attention_mask = torch.cat(
                [attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1
            )
            extra: dict[str, Any] = {self._cache_argument: cache}
            if slab is not None and self._grouped_attention:
                # Columns each row fills once this step's token is in: rows are right-aligned.
                fed = attention_mask.shape[1] - width
                extra.update(self._decode_attention(active, prompt_lengths, width, fed, cascade))
            outputs = self.model(
                input_ids=next_input,
                attention_mask=attention_mask,
                position_ids=next_positions[:, None],
                use_cache=True,
                **extra,
            )
            logits = outputs.logits[:, -1, :].float()
            next_positions = next_positions + 1
        return [
            Generation(token_ids[row], token_logprobs[row], finish_reasons[row])
            for row in range(rows)
        ]

    def _decode_attention(
        self, active: list[int], prompt_lengths: list[int], width: int, fed: int,
        cascade: tuple[list[int], list[int]] | None,
    ) -> dict[str, Any]:
        """Returns the forward's attention arguments of a decode step over the slab after ``fed``
        tokens: the request rows ``active`` are right-aligned in ``width`` prompt columns, so each
        fills its prompt's length plus ``fed`` columns. Cascade blocks where ``cascade`` (each
        row's group, each group's shared prefix), else the decode kernel's, else SDPA's tiers."""
        lengths = [prompt_lengths[row] + fed for row in active]
        if cascade is not None:
            group_of, shared = cascade
            starts = [width - prompt_lengths[row] for row in active]
            return {"harnessrl_cascade": decode_blocks(lengths, [group_of[row] for row in active], shared, starts)}
        if self._decode_kernel is not None:
            return decode_arguments(self._decode_kernel, lengths)
        groups = row_groups(lengths)
        return {"harnessrl_row_groups": groups} if len(groups) > 1 else {}

    def _new_slab(self, rows: int, capacity: int, length: int) -> KVSlab:
        """Returns an uninitialized KV slab for ``rows`` x ``capacity`` tokens that counts
        ``length`` columns as filled (the prefill writes them)."""
        layers, kv_heads, head_dim = self._kv_shape
        buffer = torch.empty(
            (layers, 2, rows, kv_heads, capacity, head_dim), dtype=self.dtype, device=self.device
        )
        return KVSlab(buffer, length)

    def _cascade_groups(self, prompts: list[list[int]], reused: list[int]) -> tuple[list[int], list[int]] | None:
        """Returns each row's group and each group's shared prefix for cascade attention, or
        ``None`` when no rows share one. A group's prefix is read from its first row's columns,
        so it is cut to what every other row copied from the prefix cache (the keys and values
        its first row computed or copied, bit for bit) and not recomputed itself."""
        group_of: list[int] = []
        shared: list[int] = []
        for group, (first, end, prefix) in enumerate(prefix_groups(prompts)):
            if end - first > 1:
                prefix = min(prefix, *reused[first + 1 : end])
            shared.append(prefix if prefix >= MIN_SHARED_PREFIX else 0)
            group_of.extend([group] * (end - first))
        return (group_of, shared) if any(shared) else None

    def _prefill_row(self, prompt: list[int], columns: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Prefills one prompt into ``columns`` (a view ``[layers, 2, 1, kv_heads, width, head_dim]``
        of the batch slab whose last ``len(prompt)`` columns are the prompt's; the ones before are
        left padding) and returns the float32 logits after its last token, shape [1, vocab], and
        the prompt tokens whose keys and values it copied from the prefix cache.

        The longest cached prefix is copied in and only the rest runs through the model; then
        the prompt's KV goes into the prefix cache, so later rows of this batch reuse it too.
        """
        length = len(prompt)
        pad = columns.shape[-2] - length
        columns[..., :pad, :].zero_()  # masked out; zeros keep NaNs out of the products
        found = (
            self.prefix_cache.match(prompt, limit=length - 1)  # the last token is fed for its logits
            if self.prefix_cache is not None
            else None
        )
        reused = found.length if found is not None else 0
        at = pad
        for piece in found.pieces if found is not None else ():
            columns[:, :, 0, :, at : at + piece.shape[-2]] = piece
            at += piece.shape[-2]
        prompt_columns = columns[..., pad:, :]
        row_slab = KVSlab(prompt_columns, reused)
        outputs = self.model(
            input_ids=torch.tensor([prompt[reused:]], device=self.device),
            position_ids=torch.arange(reused, length, device=self.device)[None],
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_argument: row_slab.cache()},
            **(prefill_arguments(self._prefill_kernel) if self._prefill_kernel is not None else {}),
        )
        stats = self.cache_stats
        stats.requests += 1
        stats.hits += reused > 0
        stats.prompt_tokens += length
        stats.cached_tokens += reused
        stats.prefilled_tokens += length - reused
        if self.prefix_cache is not None:
            self.prefix_cache.insert(prompt, prompt_columns[:, :, 0])
        return cast(torch.Tensor, outputs.logits[:, -1, :].float()), reused

    def _prefill_padded(
        self, prompts: list[list[int]], attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, Any]:
        """Prefills left-padded ``prompts`` in one batched pass into a ``DynamicCache`` (models
        with layers the slab does not model); returns the last logits and the cache."""
        rows, width = attention_mask.shape
        input_ids = torch.full((rows, width), self.tokenizer.pad_token_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        # Every prompt's first real token sits at position 0.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        outputs = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_argument: cache},
        )
        return outputs.logits[:, -1, :].float(), cache
