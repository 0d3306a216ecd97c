"""Prefix KV cache: a radix tree over token ids whose edges hold the keys and values of their tokens.

``HFPolicy`` keeps the KV of recently finished requests (prompt and completion) here, so a new
request whose prompt starts with a cached sequence prefills only the rest (automatic prefix
caching, as in vLLM and SGLang's RadixAttention). Two kinds of reuse come from one structure:
turn t+1 of an episode extends turn t's prompt and completion, and the episodes of one harness
configuration share its system prompt and tool manual.

Each edge of the tree is a run of token ids plus one tensor of their KV, shaped
``[layers, 2, kv_heads, tokens, head_dim]`` (token axis -2). ``match`` walks at most one edge
per step and compares edges with list equality, so a lookup costs O(prompt length), never
O(tokens cached). The bound is ``max_tokens`` tokens of KV in total; when an insert goes over it,
least recently used leaves go first (a leaf's parent becomes evictable once its last child is
gone, so a shared system prompt outlives the episodes that extend it).

Not thread-safe on its own: ``HFPolicy`` calls it under its generation lock.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch


@dataclass
class PrefixCacheStats:
    """Counters of one policy's prefix cache since it was created (``HFPolicy.cache_stats``)."""

    requests: int = 0  # requests that ran through prefill
    hits: int = 0  # requests that reused at least one cached token
    prompt_tokens: int = 0  # prompt tokens of those requests
    cached_tokens: int = 0  # prompt tokens whose KV came from the cache
    prefilled_tokens: int = 0  # prompt tokens that went through the model
    inserted_tokens: int = 0  # tokens whose KV was newly stored
    evicted_tokens: int = 0  # tokens dropped to stay under the bound
    invalidations: int = 0  # times the whole cache was dropped (weights changed)

    @property
    def token_hit_rate(self) -> float:
        """Returns the fraction of prompt tokens served from the cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        """Returns the fraction of requests that reused a cached prefix."""
        return self.hits / self.requests if self.requests else 0.0


class _Node:
    """An edge of the radix tree: its token ids, their KV, and the children keyed by first token."""

    __slots__ = ("children", "kv", "last_used", "parent", "tokens")

    def __init__(self, tokens: list[int], kv: torch.Tensor | None, parent: _Node | None) -> None:
        self.tokens = tokens
        self.kv = kv
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.last_used = 0


@dataclass
class PrefixMatch:
    """The longest cached prefix of a sequence: its length and the KV pieces that make it up, in order."""

    length: int = 0
    pieces: list[torch.Tensor] = field(default_factory=list)  # views, token axis -2, lengths sum to length


class PrefixCache:
    """An LRU-bounded radix tree from token-id prefixes to their KV tensors."""

    def __init__(self, max_tokens: int, stats: PrefixCacheStats | None = None) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_prefix_cache_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.stats = stats if stats is not None else PrefixCacheStats()
        self._root = _Node([], None, None)
        self._tokens = 0
        self._clock = itertools.count(1)

    @property
    def tokens(self) -> int:
        """Returns how many tokens of KV the cache holds."""
        return self._tokens

    def clear(self) -> None:
        """Drops every cached entry (for example after the weights changed)."""
        self._root = _Node([], None, None)
        self._tokens = 0

    def match(self, ids: list[int], limit: int | None = None) -> PrefixMatch:
        """Returns the longest cached prefix of ``ids[:limit]`` and marks it recently used."""
        end = len(ids) if limit is None else min(limit, len(ids))
        found = PrefixMatch()
        node, position, now = self._root, 0, next(self._clock)
        while position < end:
            child = node.children.get(ids[position])
            if child is None:
                break
            edge = child.tokens
            take = min(len(edge), end - position)
            if ids[position : position + take] != edge[:take]:
                take = _common_length(edge, ids, position, take)
            assert child.kv is not None  # only the root has no KV
            child.last_used = now
            found.pieces.append(child.kv if take == len(edge) else child.kv[..., :take, :])
            found.length += take
            position += take
            if take < len(edge):
                break
            node = child
        return found

    def insert(self, ids: list[int], kv: torch.Tensor) -> None:
        """Stores the KV of ``ids`` (``kv``'s token axis -2 has ``len(ids)`` entries; only the part
        not cached yet is copied), then evicts least recently used leaves to respect the bound."""
        if kv.shape[-2] != len(ids):
            raise ValueError(f"KV holds {kv.shape[-2]} tokens for {len(ids)} ids")
        ids = ids[: self.max_tokens]
        if not ids:
            return
        node, position, now = self._root, 0, next(self._clock)
        while position < len(ids):
            child = node.children.get(ids[position])
            if child is None:
                leaf = _Node(ids[position:], kv[..., position : len(ids), :].clone(), node)
                leaf.last_used = now
                node.children[ids[position]] = leaf
                added = len(ids) - position
                self._tokens += added
                self.stats.inserted_tokens += added
                break
            edge = child.tokens
            take = min(len(edge), len(ids) - position)
            if ids[position : position + take] != edge[:take]:
                take = _common_length(edge, ids, position, take)
            child.last_used = now
            if position + take == len(ids):
                break  # ids end inside (or at the end of) this edge: nothing new to store
            if take < len(edge):
                child = self._split(child, take)
            position += take
            node = child
        self._evict()

    def _split(self, child: _Node, at: int) -> _Node:
        """Splits ``child``'s edge after ``at`` tokens; returns the new upper node."""
        assert child.kv is not None and child.parent is not None
        upper = _Node(child.tokens[:at], child.kv[..., :at, :].clone(), child.parent)
        upper.last_used = child.last_used
        child.parent.children[upper.tokens[0]] = upper
        child.tokens = child.tokens[at:]
        child.kv = child.kv[..., at:, :].clone()
        child.parent = upper
        upper.children[child.tokens[0]] = child
        return upper

    def _evict(self) -> None:
        """Removes least recently used leaves until the cache holds at most ``max_tokens``."""
        if self._tokens <= self.max_tokens:
            return
        leaves = [(node.last_used, id(node), node) for node in self._nodes() if not node.children]
        heapq.heapify(leaves)
        while self._tokens > self.max_tokens and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            self._tokens -= len(leaf.tokens)
            self.stats.evicted_tokens += len(leaf.tokens)
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))

    def _nodes(self) -> list[_Node]:
        """Returns every node below the root."""
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def _common_length(edge: list[int], ids: list[int], start: int, limit: int) -> int:
    """Returns how many leading tokens of ``edge`` equal ``ids[start:]``, at most ``limit``."""
    for offset in range(limit):
        if edge[offset] != ids[start + offset]:
            return offset
    return limit
