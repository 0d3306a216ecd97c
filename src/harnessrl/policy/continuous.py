"""Continuous batching for ``HFPolicy``: one decode batch that requests join and leave between steps.

``HFPolicy.generate`` runs a batch from its first prefill until its last row finishes; a row that
finishes early leaves the batch, and the request that comes after it (the next turn of the same
episode, once its command has run) waits for the next ``generate`` call, while the batch's last
rows decode alone. A ``StepDecoder`` (``with policy.continuous() as decoder``) keeps one batch
going instead: ``add(key, request)`` queues a request, and each ``step()`` admits what is queued
(up to ``max_batch_size`` rows; each admitted prompt is prefilled on its own, its cached prefix
reused, as in ``generate``), samples one token for every row, returns the rows that finished
and runs one decode forward for the rest. ``rollout.engine.RolloutEngine`` drives it
(``continuous_batching``), handing each finished generation to its episode at once.

What a request gets does not depend on what else is in the batch: it samples from its own
seeded generator (``HFPolicy``'s convention), so a row's tokens are those ``generate`` gives it
alone, up to the float rounding of batched against single-row forwards (in float32 the
log-probs agree within ~1e-4 and greedy tokens are equal; the tests pin both).

The batch's keys and values live in one tensor (``KVSlab``), right-aligned: every row ends at
the same column ``fill``, a row of ``length`` tokens fills ``[fill - length, fill)``, the columns
before are zero padding its mask hides. A joining prompt no longer than ``fill`` goes into a
free row as is; a longer one, or a decode step with no column left, lays the batch out again
in a new slab (the rows' filled columns copied, ``fill`` as tight as the longest row allows).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from harnessrl.policy.base import Generation, GenerationRequest, SamplingParams, triage_requests
from harnessrl.policy.cascade import row_groups
from harnessrl.policy.decode_kernel import decode_arguments
from harnessrl.policy.kv_slab import KVSlab

SLACK = 256
"""Columns a new layout leaves free before the rows and after their room (with SDPA's length
tiers, which read no padding)."""


@dataclass
class _Row:
    """One request in the batch: what it sampled so far and the slab columns it fills."""

    key: Hashable
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    budget: int  # most tokens it may sample (max_new_tokens, cut to the context)
    length: int  # columns it fills: its prompt and every token fed back so far
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    aborted: bool = False
    sink: Callable[[Sequence[int]], bool | None] | None = None  # hears each token; False ends the row

    def room(self) -> int:
        """Columns it may still need: every token it may sample but the last is fed back."""
        return self.budget - len(self.tokens) - 1


@dataclass
class DecoderStats:
    """What a decoder did: decode steps run, rows summed over them, prompts admitted, requests
    dropped unrun (their sink said no before their prefill), layouts."""

    steps: int = 0
    rows: int = 0
    admitted: int = 0
    dropped: int = 0
    relayouts: int = 0

    @property
    def mean_rows(self) -> float:
        return self.rows / self.steps if self.steps else 0.0


class StepDecoder:
    """A decode batch of ``policy`` that requests join and leave between steps (module docstring).

    Built by ``HFPolicy.continuous()``, which holds the policy's lock (and its packed linear
    layers) while the decoder is open: nothing else generates meanwhile. Keys name requests:
    any hashable, unique among the requests queued or running."""

    def __init__(self, policy: Any) -> None:  # an HFPolicy (hf.py imports this module, not the reverse)
        if not policy._full_attention:
            raise ValueError("continuous batching needs a model whose layers all use full attention")
        self.policy = policy
        self.max_rows = policy.max_batch_size
        self.stats = DecoderStats()
        self._queue: list[tuple[Hashable, GenerationRequest, Callable[[Sequence[int]], bool | None] | None]] = []
        self._rows: list[_Row] = []
        self._logits: torch.Tensor | None = None  # [rows, vocab]: what each row samples next
        self._storage: torch.Tensor | None = None  # [layers, 2, max_rows, kv_heads, capacity, head_dim]
        self._slab: KVSlab | None = None
        self._cache: Any = None
        self._fill = 0
        self._admitting: list[Hashable] = []  # the request being prefilled, if any

    # ---------------------------------------------------------------- public API

    def add(self, key: Hashable, request: GenerationRequest,
            on_tokens: Callable[[Sequence[int]], bool | None] | None = None) -> None:
        """Queues ``request``; the next ``step`` admits it when a row is free. ``on_tokens``
        hears each token the request samples (``[token]``) right after the step that sampled
        it; when it returns False the request ends there (finish reason ``abort``, as with
        ``HFPolicy.generate_stream``'s sink). It is also asked once with no tokens when a row
        frees for the request: False then ends it unrun, before its prefill (a server's client
        that left while the request waited for a row)."""
        if key in self._keys():
            raise ValueError(f"request key {key!r} is already queued or running")
        self._queue.append((key, request, on_tokens))

    def abort(self, key: Hashable) -> bool:
        """Ends request ``key``: queued, it is dropped; running, the next ``step`` returns it with
        finish reason ``abort`` and the tokens sampled so far, and its row is free. Returns
        False when no such request is queued or running."""
        for index, (queued, _, _) in enumerate(self._queue):
            if queued == key:
                del self._queue[index]
                return True
        for row in self._rows:
            if row.key == key:
                row.aborted = True
                return True
        return False

    @property
    def running(self) -> int:
        """Requests in the batch."""
        return len(self._rows)

    @property
    def queued(self) -> int:
        """Requests waiting for a row."""
        return len(self._queue)

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, Generation]]:
        """Admits queued requests into free rows, samples one token for every row, and returns
        ``(key, generation)`` of each request that finished (stop token, budget, abort, or a
        request that cannot run); the others are fed their token in one decode forward. When the
        model raises, every request in the batch comes back as an ``error`` generation naming
        the exception (as from ``generate``) and the batch starts empty."""
        finished: list[tuple[Hashable, Generation]] = []
        try:
            self._step(finished)
        except Exception as exc:  # one failing step must not lose the requests or the run
            message = f"generation failed: {type(exc).__name__}: {exc}"
            answered = {key for key, _ in finished}  # rows that finished before the failure
            keys = [row.key for row in self._rows if row.key not in answered] + self._admitting
            finished += [(key, Generation([], [], "error", error=message)) for key in keys]
            self._rows, self._logits, self._storage, self._slab, self._fill = [], None, None, None, 0
            self._admitting = []
        return finished

    def _step(self, finished: list[tuple[Hashable, Generation]]) -> None:
        """``step`` without its error handling: appends what finished to ``finished``."""
        self._admit(finished)
        if not self._rows:
            return
        assert self._logits is not None
        rows = self._rows
        sampled, logprobs = self.policy._sample(
            self._logits, [row.params for row in rows], [row.generator for row in rows]
        )
        keep: list[int] = []
        for index, row in enumerate(rows):
            token = sampled[index]
            row.tokens.append(token)
            row.logprobs.append(logprobs[index])
            if row.sink is not None and row.sink([token]) is False:
                row.aborted = True
            if token in row.params.stop_token_ids:
                reason = "stop"
            elif row.aborted:
                reason = "abort"
            elif len(row.tokens) < row.budget:
                keep.append(index)
                continue
            else:
                reason = "length"
            self._leave(index, row)
            finished.append((row.key, Generation(row.tokens, row.logprobs, reason)))
        if len(keep) < len(rows):
            self._select(keep)
        if self._rows:
            self._decode([sampled[index] for index in keep])

    # ---------------------------------------------------------------- internals

    def _keys(self) -> set[Hashable]:
        return {key for key, _, _ in self._queue} | {row.key for row in self._rows}

    def _admit(self, finished: list[tuple[Hashable, Generation]]) -> None:
        """Moves queued requests into free rows (prefilled, their next logits ready); appends
        the ones answered without the model to ``finished``."""
        policy = self.policy
        while self._queue and len(self._rows) < self.max_rows:
            key, request, sink = self._queue.pop(0)
            results, runnable = triage_requests(
                [request], context_length=policy.context_length, vocab_size=policy.vocab_size
            )
            if not runnable:
                finished.append((key, results[0]))  # type: ignore[arg-type]  # filled by triage
                continue
            if sink is not None and not self._still_wanted(key, sink, finished):
                continue
            self._admitting = [key]  # answered with an error if the prefill raises
            prompt = list(request.prompt_ids)
            params = request.params
            budget = params.max_new_tokens
            if policy.context_length is not None:
                budget = min(budget, policy.context_length - len(prompt))
            row = _Row(key, prompt, params, policy._generator(params.seed), budget, len(prompt), sink=sink)
            self._make_room(len(prompt), row.room())
            assert self._storage is not None
            index = len(self._rows)
            columns = self._storage[:, :, index : index + 1, :, : self._fill]
            logits, _ = policy._prefill_row(prompt, columns)
            self._rows.append(row)
            self._admitting = []
            self._logits = logits if self._logits is None else torch.cat([self._logits, logits])
            self.stats.admitted += 1
        self._view_rows()

    def _still_wanted(self, key: Hashable, sink: Callable[[Sequence[int]], bool | None],
                      finished: list[tuple[Hashable, Generation]]) -> bool:
        """Asks a request's sink, with no tokens, whether to admit it; a request given up while it
        waited for a row (or whose sink raises) is answered now, unrun, and costs no prefill."""
        try:
            wanted = sink(()) is not False
        except Exception as exc:  # one client's broken sink must not fail the others' batch
            finished.append((key, Generation([], [], "error", error=f"generation failed: {type(exc).__name__}: {exc}")))
            return False
        if not wanted:
            finished.append((key, Generation([], [], "abort")))
            self.stats.dropped += 1
        return wanted

    def _make_room(self, length: int, room: int) -> None:
        """Makes the slab hold one more row of ``length`` prompt tokens that may need ``room``
        columns after them, laying the batch out anew when it cannot."""
        fits = (
            self._storage is not None
            and length <= self._fill
            and self._fill + max([room, *(row.room() for row in self._rows)]) <= self._storage.shape[-2]
        )
        if not fits:
            self._relayout(max([length, *(row.length for row in self._rows)]), room)

    def _relayout(self, fill: int, room: int = 0) -> None:
        """Copies the rows into a new slab that ends them at column ``fill`` (plus ``SLACK``) and
        has room for every row's remaining tokens (and ``room`` more for a row about to join),
        plus ``SLACK``: the next turn of the longest row (its prompt, completion and an
        observation) and later joiners then fit without another layout."""
        slack = SLACK if self.policy._grouped_attention else 0  # padding costs attention only without tiers
        fill += slack
        layers, kv_heads, head_dim = self.policy._kv_shape
        capacity = fill + max([room, *(row.room() for row in self._rows), 1]) + slack
        # Uninitialized: a row's padding is zeroed here or by its prefill, later columns are written
        # before they are read.
        storage = torch.empty(
            (layers, 2, self.max_rows, kv_heads, capacity, head_dim),
            dtype=self.policy.dtype, device=self.policy.device,
        )
        if self._storage is not None:
            for index, row in enumerate(self._rows):
                storage[:, :, index, :, : fill - row.length].zero_()
                storage[:, :, index, :, fill - row.length : fill] = self._storage[
                    :, :, index, :, self._fill - row.length : self._fill
                ]
            self.stats.relayouts += 1
        self._storage, self._fill = storage, fill
        self._slab = None

    def _view_rows(self) -> None:
        """Points the slab (and its cache) at the running rows' part of the storage."""
        if self._storage is None or not self._rows:
            return
        buffer = self._storage[:, :, : len(self._rows)]
        if self._slab is None:
            self._slab = KVSlab(buffer, self._fill)
            self._cache = self._slab.cache()
        else:
            self._slab.buffer = buffer
            self._slab.lengths = [self._fill] * len(self._slab.lengths)
            for layer in self._slab.layers:
                layer.refresh()

    def _leave(self, index: int, row: _Row) -> None:
        """Puts a finished row's prompt and fed tokens into the prefix cache."""
        cache = self.policy.prefix_cache
        if cache is not None and self._storage is not None:
            cache.insert(
                row.prompt + row.tokens[:-1],
                self._storage[:, :, index, :, self._fill - row.length : self._fill],
            )

    def _select(self, keep: list[int]) -> None:
        """Keeps rows ``keep`` (ascending): they move down to the front of the storage."""
        assert self._storage is not None
        for target, source in enumerate(keep):
            if source != target:
                self._storage[:, :, target, :, : self._fill] = self._storage[:, :, source, :, : self._fill]
        self._rows = [self._rows[index] for index in keep]
        if not self._rows:
            self._fill, self._logits, self._slab = 0, None, None
            return
        self._view_rows()

    def _decode(self, tokens: list[int]) -> None:
        """Feeds each running row its sampled token in one forward; keeps the next logits."""
        policy = self.policy
        if self._storage is None or self._fill + 1 > self._storage.shape[-2]:
            self._relayout(max(row.length for row in self._rows))
            self._view_rows()
        assert self._slab is not None
        device = policy.device
        lengths = torch.tensor([row.length for row in self._rows], device=device)
        # Each row's real columns, this step's token included, end at fill + 1.
        columns = torch.arange(self._fill + 1, device=device)
        attention_mask = (columns[None, :] >= (self._fill - lengths)[:, None]).long()
        extra: dict[str, Any] = {policy._cache_argument: self._cache}
        filled = [row.length + 1 for row in self._rows]
        if policy._decode_kernel is not None:
            extra.update(decode_arguments(policy._decode_kernel, filled))
        elif policy._grouped_attention and len(groups := row_groups(filled)) > 1:
            extra["harnessrl_row_groups"] = groups
        outputs = policy.model(
            input_ids=torch.tensor(tokens, device=device)[:, None],
            attention_mask=attention_mask,
            position_ids=lengths[:, None],
            use_cache=True,
            **extra,
        )
        self._logits = outputs.logits[:, -1, :].float()
        self._fill += 1
        for row in self._rows:
            row.length += 1
        self.stats.steps += 1
        self.stats.rows += len(self._rows)


@contextmanager
def open_decoder(policy: Any) -> Iterator[StepDecoder]:
    """Yields a ``StepDecoder`` over ``policy`` holding its lock and packed layers (used by
    ``HFPolicy.continuous``); requests still running when the context ends are dropped."""
    with policy._lock, policy._linears_installed():
        policy._drop_stale_prefix_cache()
        yield StepDecoder(policy)
