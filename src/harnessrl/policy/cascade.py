"""Cascade attention for decoding: a prefix that several rows of the batch share is read once per step.

The rollouts of a GRPO group start from one prompt, and every later turn of theirs extends it, so
a decode batch of the trainer holds each group's prompt once per row. In ``HFPolicy``'s KV slab
(``policy/kv_slab.py``) every row keeps its own copy of those keys and values, and reading them is
about half of a rollout's decode step on this project's CPUs (docs/benchmarks.md, "Closing the
in-process gap to vLLM"). Here the rows of a group attend over one copy of the shared prefix in one call,
their queries stacked as if they were one row's, and each row over its own suffix in another;
the two partial results are merged by their log-sum-exp (cascade inference, as FlashInfer and
vLLM's cascade attention do it on GPUs). The result is the same attention up to rounding.

``prefix_groups`` splits an ordered batch into runs of rows that share a prefix, ``cascade_order``
orders requests so that such rows are adjacent, and ``decode_blocks`` turns one decode step's
rows into the ``CascadeBlock`` list that ``cascade_attention`` reads; rows that share nothing go
into length tiers (``row_groups``, also what a decode step without cascade attention uses).
Measured: docs/benchmarks.md (1.45-1.6x on decode with long shared prompts; about 1.0x on the
trainer's three-turn episodes, whose own suffixes grow as long as the prompt they share).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

MIN_SHARED_PREFIX = 32
"""Shared prefixes shorter than this many tokens are not worth a call of their own."""

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def row_groups(lengths: Sequence[int], keep: float = 0.8) -> list[tuple[int, int, int]]:
    """Returns contiguous groups ``(first_row, end_row, columns)`` of a right-aligned batch: a row
    joins the group before it while it fills at least ``keep`` of that group's ``columns`` (the
    longest length in it). ``HFPolicy`` sorts rows longest first, so groups follow length tiers."""
    groups: list[tuple[int, int, int]] = []
    for row, length in enumerate(lengths):
        if groups and length >= keep * groups[-1][2] and length <= groups[-1][2]:
            first, _, columns = groups[-1]
            groups[-1] = (first, row + 1, columns)
        else:
            groups.append((row, row + 1, length))
    return groups


@dataclass(frozen=True)
class CascadeBlock:
    """Contiguous batch rows ``[first, end)`` of one decode step, attended in one or two calls.

    ``prefix`` > 0: the rows share their first ``prefix`` tokens, read from batch row ``source``
    at columns ``[prefix_start, prefix_start + prefix)``; each row then attends over its own last
    ``suffixes[i]`` columns (its tokens after the prefix). ``prefix`` 0: a length tier of rows
    that share nothing, each over its own last ``suffixes[i]`` columns (its whole sequence).
    """

    first: int
    end: int
    suffixes: tuple[int, ...]
    prefix: int = 0
    source: int = 0
    prefix_start: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Returns the length of the longest common prefix of two token-id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def prefix_groups(prompts: Sequence[Sequence[int]], min_prefix: int = MIN_SHARED_PREFIX) -> list[tuple[int, int, int]]:
    """Splits rows in their given order into contiguous groups ``(first, end, prefix)``, where
    ``prefix`` is the tokens every row of the group shares (0 for a row alone), so that the
    prefix columns not read twice, the sum of ``(rows - 1) * prefix``, is largest (a dynamic
    program over the cut points; a prefix under ``min_prefix`` tokens counts as none)."""
    n = len(prompts)
    lcp = [common_prefix(a, b) for a, b in pairwise(prompts)]
    best = [0] * (n + 1)  # best[i]: the largest saving over rows [0, i)
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # best[i]'s last group: (its first row, its prefix)
    for end in range(1, n + 1):
        best[end], cut[end] = best[end - 1], (end - 1, 0)
        shared = None
        for first in range(end - 2, -1, -1):  # the group [first, end) of at least two rows
            shared = lcp[first] if shared is None else min(shared, lcp[first])
            if shared < min_prefix:
                break
            saving = best[first] + (end - first - 1) * shared
            if saving > best[end]:
                best[end], cut[end] = saving, (first, shared)
    groups: list[tuple[int, int, int]] = []
    end = n
    while end > 0:
        first, shared = cut[end]
        groups.append((first, end, shared))
        end = first
    return groups[::-1]


def cascade_order(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Returns an order of the requests in which rows sharing a prefix are adjacent: groups of
    two or more rows first (longest first), then the rows alone, longest first (so that they
    form tight length tiers, as ``HFPolicy`` orders them without cascade attention)."""
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    groups = prefix_groups([prompts[i] for i in order])
    shared = [order[first:end] for first, end, prefix in groups if prefix > 0]
    alone = [order[first] for first, _, prefix in groups if prefix == 0]
    shared.sort(key=lambda rows: -max(len(prompts[i]) for i in rows))
    alone.sort(key=lambda i: -len(prompts[i]))
    return [i for rows in shared for i in rows] + alone


def decode_blocks(
    lengths: Sequence[int], group_of: Sequence[int], prefixes: Sequence[int], starts: Sequence[int]
) -> list[CascadeBlock]:
    """Returns the blocks of one decode step. ``lengths``: each batch row's filled columns (rows
    are right-aligned); ``group_of``: each row's group id (rows of a group are adjacent);
    ``prefixes``: each group's shared prefix (0: none); ``starts``: each row's first real column.
    Rows of groups without a prefix go into length tiers (``row_groups``)."""
    blocks: list[CascadeBlock] = []
    row = 0
    rows = len(lengths)
    while row < rows:
        end = row + 1
        while end < rows and group_of[end] == group_of[row]:
            end += 1
        prefix = prefixes[group_of[row]]
        if prefix > 0 and end - row > 1:
            blocks.append(CascadeBlock(row, end, tuple(lengths[r] - prefix for r in range(row, end)),
                                       prefix, row, starts[row]))
            row = end
            continue
        end = row + 1  # a run of rows that share nothing worth reading once: length tiers
        while end < rows and (prefixes[group_of[end]] == 0 or _alone(group_of, end)):
            end += 1
        for first, stop, _ in row_groups(lengths[row:end]):
            blocks.append(CascadeBlock(row + first, row + stop, tuple(lengths[row + first : row + stop])))
        row = end
    return blocks


def _alone(group_of: Sequence[int], row: int) -> bool:
    """Whether ``row`` is the only row of its group left in the batch."""
    return (row == 0 or group_of[row - 1] != group_of[row]) and (
        row + 1 == len(group_of) or group_of[row + 1] != group_of[row]
    )


@functools.lru_cache(maxsize=256)
def _suffix_mask(suffixes: tuple[int, ...], window: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """The additive mask ``[rows, 1, 1, window]`` that keeps each row's last ``suffixes[i]``
    columns of the window (``None`` when every row fills it); every layer of a decode step asks
    for the same masks, so they are built once (read only)."""
    if min(suffixes) == window:
        return None
    need = torch.tensor(suffixes, device=device)
    keep = torch.arange(window, device=device)[None, :] >= (window - need)[:, None]
    return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill_(~keep, float("-inf"))[:, None, None, :]


def cascade_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, blocks: Sequence[CascadeBlock], scaling: float
) -> torch.Tensor:
    """Decode attention over ``blocks``: ``query`` ``[rows, heads, 1, head_dim]``, ``key`` and
    ``value`` ``[rows, kv_heads, columns, head_dim]`` (right-aligned rows); returns
    ``[rows, 1, heads, head_dim]``, the layout transformers' attention functions return."""
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    per_kv = heads // kv_heads
    packed = query.reshape(rows, kv_heads, per_kv, dim)  # the query heads of each KV head together
    outputs = []
    for block in blocks:
        q = packed[block.first : block.end]
        window = max(block.suffixes)
        mask = _suffix_mask(block.suffixes, window, query.dtype, query.device)
        own, own_lse = _FLASH(q, key[block.first : block.end, :, -window:], value[block.first : block.end, :, -window:],
                              attn_mask=mask, scale=scaling)
        if block.prefix == 0:
            outputs.append(own)
            continue
        n = block.end - block.first
        span = slice(block.prefix_start, block.prefix_start + block.prefix)
        stacked = q.transpose(0, 1).reshape(1, kv_heads, n * per_kv, dim)  # every row's queries against one copy
        shared, shared_lse = _FLASH(stacked, key[block.source : block.source + 1, :, span],
                                    value[block.source : block.source + 1, :, span], scale=scaling)
        shared = shared.reshape(kv_heads, n, per_kv, dim).transpose(0, 1)
        shared_lse = shared_lse.reshape(kv_heads, n, per_kv).transpose(0, 1)
        top = torch.maximum(own_lse, shared_lse)
        w_own, w_shared = (own_lse - top).exp_(), (shared_lse - top).exp_()
        merged = (own.float() * w_own[..., None] + shared.float() * w_shared[..., None]) / (w_own + w_shared)[..., None]
        outputs.append(merged.to(query.dtype))
    output = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    return output.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous()
