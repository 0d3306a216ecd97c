"""The trainer's forward passes: log-probabilities and entropies of the trained positions only
(the LM head never sees a prompt token), a shared prefix run once for a micro-batch's rows, the
old policy's log-probabilities and the critic's values before an update, mixed precision, and
activation checkpointing that keeps the shared prefix.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from harnessrl.rl.batching import UpdateSample, collate, micro_batches


@torch.no_grad()
def old_token_logprobs(
    model: torch.nn.Module, samples: list[UpdateSample], pad_id: int, temperature: float,
    micro_batch_tokens: int = 4096, autocast_dtype: torch.dtype | None = None, share_prefix: bool = True,
    head_chunk_tokens: int = 0, causal_mask_only: bool = False,
) -> dict[int, torch.Tensor]:
    """Returns, per sample (keyed by ``id``), the log-probabilities [len - 1] that the current
    weights give its tokens 1.. (0 where nothing is trained): the old policy of a multi-step
    update, under the same temperature and mixed precision as ``update_step``."""
    device = next(model.parameters()).device
    out: dict[int, torch.Tensor] = {}
    for batch in micro_batches(samples, micro_batch_tokens, share_prefix):
        data = collate(batch, pad_id, device, share_prefix, causal_only=causal_mask_only)
        if float(data["mask"].sum()) == 0:
            logprobs = torch.zeros(data["mask"].shape)
        else:
            with autocast_context(device, autocast_dtype):
                _, logprobs, _ = as_forward(model, masked_token_logprobs, model, data, temperature, False,
                                            head_chunk_tokens)
        for row, sample in enumerate(batch):
            out[id(sample)] = logprobs[row, : len(sample.input_ids) - 1].float().cpu()
    return out


def as_forward(model: torch.nn.Module, function: Any, *args: Any) -> Any:
    """Returns ``function(*args)`` run as a forward of ``model``: for a model sharded by
    ``rl.distributed.DataParallel.shard_model`` between its root group's FSDP2 hooks (they
    gather the embeddings, the final norm and the LM head that the decoder and the head
    calls below read), for any other model a plain call."""
    run = getattr(model, "run_as_forward", None)
    return run(function, *args) if run is not None else function(*args)


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> Any:
    """Returns the mixed-precision context of ``update_step`` (see its ``autocast_dtype``)."""
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def masked_token_logprobs(
    model: torch.nn.Module, data: dict[str, torch.Tensor], temperature: float, entropy_grad: bool = False,
    head_chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (last hidden states [B, L, H], log-probs [B, L-1], entropy [B, L-1]) where only
    trained positions (``data["mask"]``) are projected through the LM head.

    Most of a sequence is prompt; projecting every position to the vocabulary (49k for the
    embedded model) and taking its log-softmax would dominate the step. Untrained positions
    get 0. Entropy keeps its graph only when an entropy bonus needs it.

    ``head_chunk_tokens > 0`` projects the trained positions that many at a time, each chunk
    under activation checkpointing (its logits recomputed in the backward pass): the head's
    float32 logits and log-softmax, ~14 bytes per position and vocabulary entry, then exist for
    one chunk at a time instead of for the whole micro-batch (Liger's fused linear
    cross-entropy, done with ``torch.utils.checkpoint``). It differs from the one-shot
    projection in float rounding only (a product over fewer rows; the head's weight gradient
    summed chunk by chunk). 0 (the default) is the one-shot projection.
    """
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    hidden = decoder_hidden(decoder, data)
    rows, cols = torch.nonzero(data["mask"] > 0, as_tuple=True)
    trained, targets = hidden[:, :-1][rows, cols], data["targets"][rows, cols]
    project = functools.partial(_head_logprobs, head, temperature=temperature, entropy_grad=entropy_grad)
    if 0 < head_chunk_tokens < len(rows):
        parts = [
            checkpoint(project, trained[start:start + head_chunk_tokens],
                       targets[start:start + head_chunk_tokens], use_reentrant=False)
            if torch.is_grad_enabled() else project(trained[start:start + head_chunk_tokens],
                                                    targets[start:start + head_chunk_tokens])
            for start in range(0, len(rows), head_chunk_tokens)
        ]
        picked = torch.cat([part[0] for part in parts])
        picked_entropy = torch.cat([part[1] for part in parts])
    else:
        picked, picked_entropy = project(trained, targets)
    logprobs = torch.zeros(data["mask"].shape, dtype=picked.dtype, device=picked.device)
    entropy = torch.zeros_like(logprobs)
    logprobs = logprobs.index_put((rows, cols), picked)
    entropy = entropy.index_put((rows, cols), picked_entropy)
    return hidden, logprobs, entropy


def _head_logprobs(
    head: torch.nn.Module, trained: torch.Tensor, targets: torch.Tensor, temperature: float, entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns the log-probabilities of ``targets`` and the entropies at hidden states
    ``trained`` [N, H] under LM head ``head`` (float32, at ``temperature``)."""
    logits = head(trained).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        picked_entropy = -(logp_all.exp() * logp_all).sum(-1)
    return picked, picked_entropy


def decoder_hidden(decoder: torch.nn.Module, data: dict[str, torch.Tensor]) -> torch.Tensor:
    """Returns the decoder's last hidden states [B, L, H] for ``data``.

    With ``data["prefix_len"] = P > 0`` (every row starts with the same P tokens, see
    ``shared_prefix``), the prefix runs once as a batch of one and its keys and values are
    broadcast to every row for the rest; gradients from all rows flow back into the single
    prefix pass, so the result and its gradients are those of the plain batched pass (up to
    float rounding) at ``P x (B - 1)`` fewer tokens of compute.

    With ``data["split"]`` (and no shared prefix) the decoder runs in the same two calls, the
    first over every row's first token, the rest against its keys and values: the result of
    one pass, called the way a shared-prefix micro-batch calls it (the ranks of a sharded
    model must call each layer equally often: ``rl.distributed.DataParallel.local``).

    With ``data["causal_only"]`` a one-call pass runs under the causal mask alone: ``collate``
    pads rows on the right, so no real token attends to a pad, and without a padding mask
    scaled-dot-product attention skips the blocks above the diagonal. The real tokens' hidden
    states are those of the masked pass bit for bit; the backward sums in another order.
    """
    ids, attention = data["input_ids"], data["attention_mask"]
    prefix = int(data.get("prefix_len", 0))
    split = bool(data.get("split", False))
    if prefix <= 0 and not split:
        mask = None if bool(data.get("causal_only", False)) else attention
        return decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    rows, length = ids.shape
    cache_argument = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    plain = DynamicCache(config=decoder.config).layers
    if not plain or not all(type(layer) is DynamicLayer for layer in plain):
        # Sliding-window or other special layers keep less than every token: no broadcast.
        return decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    layer_class = prefix_layer_class()
    written = Cache(layers=[layer_class() for _ in plain])
    if prefix <= 0:
        prefix = 1
        head = decoder(input_ids=ids[:, :1], attention_mask=attention[:, :1], use_cache=False,
                       **{cache_argument: written})
    else:
        head = decoder(input_ids=ids[:1, :prefix], use_cache=False, **{cache_argument: written})
    read = Cache(layers=[layer_class(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1))
                         for layer in written.layers])
    positions = torch.arange(prefix, length, device=ids.device).unsqueeze(0).expand(rows, -1)
    tail = decoder(
        input_ids=ids[:, prefix:], attention_mask=attention, position_ids=positions, use_cache=False,
        **{cache_argument: read},
    )
    return torch.cat([head.last_hidden_state.expand(rows, -1, -1), tail.last_hidden_state], dim=1)


@functools.cache
def prefix_layer_class() -> type:
    """Returns the cache layer of ``decoder_hidden``'s two calls (transformers imported lazily).

    Built empty, it is the prefix call's: ``update`` keeps the prefix's keys and values (set, not
    appended, so that a replay under activation checkpointing leaves them as they were). Built
    with the prefix's (broadcast) keys and values, it is the rows' call's: ``update`` returns
    them followed by the rows' own and keeps nothing, so a replay reads what the first pass read.
    Neither grows on a replay: ``enable_activation_checkpointing`` relies on it."""
    from transformers.cache_utils import DynamicLayer

    class PrefixLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
            super().__init__()
            self.reads = keys is not None
            if keys is not None:
                self.keys, self.values, self.device, self.is_initialized = keys, values, keys.device, True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            if self.reads:
                return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)
            self.keys, self.values, self.device, self.is_initialized = key_states, value_states, key_states.device, True
            return key_states, value_states

    return PrefixLayer


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Makes ``model`` recompute each decoder layer in the backward pass instead of keeping its
    activations (transformers' gradient checkpointing, non-reentrant; verl's
    ``enable_gradient_checkpointing``, TRL's ``gradient_checkpointing``): an update keeps about
    one hidden state per layer and token, at the cost of one more forward. The layers keep
    ``decoder_hidden``'s shared-prefix cache under it (transformers drops a cache that a replay
    would append to twice; ``prefix_layer_class``'s never grows on a replay)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    enable = getattr(model, "activation_checkpointing_enable", None)  # the newer name; the old one warns
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module._can_checkpoint_with_cache = True


@torch.no_grad()
def compute_values(
    model: torch.nn.Module, value_head: torch.nn.Module, samples: list[UpdateSample], pad_id: int,
    micro_batch_tokens: int = 4096,
    autocast_dtype: torch.dtype | None = None,
    share_prefix: bool = True,
) -> list[list[float]]:
    """Returns, per sample, the critic's values at its ``value_positions`` (no gradient),
    under the same mixed precision as ``update_step``."""
    device = next(model.parameters()).device
    model.eval()
    out: dict[int, list[float]] = {}
    for batch in micro_batches(samples, micro_batch_tokens, share_prefix):
        data = collate(batch, pad_id, device, share_prefix)
        with autocast_context(device, autocast_dtype):
            hidden = as_forward(model, decoder_hidden, model.get_decoder(), data)
        values = value_head(hidden.float()).squeeze(-1)
        for row, sample in enumerate(batch):
            out[id(sample)] = [float(values[row, p]) for p in sample.value_positions]
    return [out[id(s)] for s in samples]
