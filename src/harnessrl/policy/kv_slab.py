"""The decode batch's KV cache in one preallocated tensor, and attention that reads only the columns each length tier fills.

``HFPolicy`` (``policy/hf.py``) decodes a left-padded batch whose keys and values live in a
``KVSlab``, written in place each step; in a decode step every length tier of the batch
(``policy/cascade.py:row_groups``) attends over only the columns its rows fill, or, with cascade
attention, a prefix its rows share is read once (``policy/cascade.py``). ``grouped_sdpa_attention``
is registered with transformers as ``harnessrl_grouped_sdpa`` when this module is imported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch

# Models are local folders only; set before transformers loads huggingface_hub, which reads it at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from harnessrl.policy.cascade import CascadeBlock, cascade_attention
from harnessrl.policy.decode_kernel import decode_attention, prefill_attention

GROUPED_SDPA = "harnessrl_grouped_sdpa"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    harnessrl_row_groups: Sequence[tuple[int, int, int]] | None = None,
    harnessrl_cascade: Sequence[CascadeBlock] | None = None,
    harnessrl_decode: tuple[Any, torch.Tensor] | None = None,
    harnessrl_prefill: Any | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except that in a decode step of a left-padded batch each
    group ``(first_row, end_row, columns)`` attends over only the last ``columns`` key columns,
    the ones its longest row fills; the rest of its columns are padding its mask zeroes anyway,
    so the result is the same while the keys and values read drop by the padding. With
    ``harnessrl_cascade`` blocks a decode step reads each shared prefix once
    (``policy/cascade.py``); with ``harnessrl_decode`` (the kernel of ``policy/decode_kernel.py``
    and each row's filled columns) it runs that kernel, which reads only those columns; with
    ``harnessrl_prefill`` (one request's prefill after its cached prefix, ``HFPolicy._prefill_row``)
    it runs ``prefill_attention.cpp``. Without any of them (training, other callers) it is plain SDPA."""
    if harnessrl_cascade is not None and query.shape[2] == 1:
        return cascade_attention(query, key, value, harnessrl_cascade, kwargs["scaling"]), None
    if harnessrl_decode is not None and query.shape[2] == 1:
        kernel, lengths = harnessrl_decode
        return decode_attention(kernel, query, key, value, lengths, kwargs["scaling"]), None
    if harnessrl_prefill is not None and query.shape[0] == 1:
        return prefill_attention(harnessrl_prefill, query, key, value, kwargs["scaling"]), None
    if (
        harnessrl_row_groups is None
        or query.shape[2] != 1
        or (attention_mask is not None and attention_mask.shape[-1] != key.shape[-2])
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # type: ignore[no-any-return]
    outputs = []
    for first, end, columns in harnessrl_row_groups:
        mask = attention_mask
        if mask is not None:
            mask = (mask if mask.shape[0] == 1 else mask[first:end])[..., -columns:]
        output, _ = sdpa_attention_forward(
            module, query[first:end], key[first:end, :, -columns:], value[first:end, :, -columns:], mask, **kwargs
        )
        outputs.append(output)
    return torch.cat(outputs), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


class KVSlab:
    """The keys and values of a batch in one preallocated tensor, written in place.

    ``buffer`` is ``[layers, 2, rows, kv_heads, capacity, head_dim]`` (it may be a view into a
    larger slab); layer ``l`` holds columns ``[0, lengths[l])``. Growing a ``DynamicCache`` by
    ``torch.cat`` copies the whole cache at every decode step, half the time of a 16-row step
    at 1,500 tokens of context on this CPU; writing into room set aside up front does not.
    """

    def __init__(self, buffer: torch.Tensor, length: int) -> None:
        self.buffer = buffer
        self.lengths = [length] * buffer.shape[0]
        self.layers: list[SlabLayer] = []

    def cache(self) -> DynamicCache:
        """Returns a transformers ``DynamicCache`` whose layers read and write this slab."""
        cache = DynamicCache()
        self.layers = [SlabLayer(self, index) for index in range(self.buffer.shape[0])]
        cache.layers = list(self.layers)
        return cache

    def select(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keeps only ``rows`` (ascending batch rows) of the batch: finished requests leave it.

        The kept rows move down to the front of the slab in place, filled columns only, and the
        slab becomes a view of its first ``len(rows)`` rows: no new slab is allocated (indexing
        the rows out would copy the whole slab, capacity included, at every finish event, and
        hold two slabs at once). The per-layer views keep their strides, so attention reads
        the same numbers the same way."""
        kept = [int(r) for r in rows]
        if any(b <= a for a, b in pairwise(kept)):
            raise ValueError(f"KV slab rows to keep must ascend: {kept}")
        filled = max(self.lengths)
        for target, source in enumerate(kept):
            if source != target:  # target < source: its old row has left or already moved down
                self.buffer[:, :, target, :, :filled] = self.buffer[:, :, source, :, :filled]
        self.buffer = self.buffer[:, :, : len(kept)]
        for layer in self.layers:
            layer.refresh()


class SlabLayer(DynamicLayer):
    """One layer's view of a ``KVSlab``: ``update`` writes the new tokens into its columns."""

    def __init__(self, slab: KVSlab, index: int) -> None:
        super().__init__()
        self.slab, self.index = slab, index
        self.device = slab.buffer.device
        self.is_initialized = True
        self.refresh()

    def refresh(self) -> None:
        """Points ``keys`` / ``values`` at the filled columns of the slab."""
        length = self.slab.lengths[self.index]
        self.keys = self.slab.buffer[self.index, 0, :, :, :length]
        self.values = self.slab.buffer[self.index, 1, :, :, :length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the new tokens' keys and values after the filled columns; returns all of them."""
        start = self.slab.lengths[self.index]
        end = start + key_states.shape[-2]
        if end > self.slab.buffer.shape[-2]:
            raise RuntimeError(f"KV slab of {self.slab.buffer.shape[-2]} columns cannot hold {end}")
        self.slab.buffer[self.index, 0, :, :, start:end] = key_states
        self.slab.buffer[self.index, 1, :, :, start:end] = value_states
        self.slab.lengths[self.index] = end
        self.refresh()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.slab.lengths[self.index]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a KV slab is not cropped")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("select rows with KVSlab.select, once for all layers")
