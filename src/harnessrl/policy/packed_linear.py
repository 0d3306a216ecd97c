"""Linear layers of a sampling model run through oneDNN with their weights pre-packed, on CPU, under no-grad only.

On this project's CPU (AMD EPYC, AVX-512) ``aten::linear`` in float32 goes to MKL's sgemm, which
is slow for the few rows of a decode step: a 576x1536 product with 8 rows takes ~255 us there
and ~107 us through oneDNN with the weight reordered once into oneDNN's blocked layout (the
576x49,152 output layer: 17.3 ms against 5.0 ms; ``docs/benchmarks.md``, "Closing the in-process
gap to vLLM"). This is the same kernel that inductor's weight freezing (and hence vLLM's
compiled CPU graph) calls; here it is had without compiling anything.

``PackedLinears.installed(model)`` routes every plain ``torch.nn.Linear`` of ``model`` through
its packed weight while the context is open, and only for calls without autograd (a training
forward in that window still runs the module's own ``forward``). A packed weight is a copy:
it is made again whenever its parameter is replaced (``data_ptr``) or written in place
(``_version``: ``optimizer.step()``, ``copy_``, ``load_state_dict``); writes through
``param.data`` move neither, so whoever writes weights that way calls ``clear(model)``. Packed
weights belong to the layer, not to one ``PackedLinears``: two policies sampling from one model
share them, and ``clear`` through either drops them for both. The packed
copies take as much memory again as the linear weights (about 0.55 GB for float32
SmolLM2-135M). Results equal ``aten::linear`` up to float rounding of the reduction order.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

# The rows oneDNN picks its packed layout for; any row count runs on it. Decode steps run
# max_batch_size rows (16 by default), prefills more: 16 was as fast as the exact count for
# 1, 8, 16 and 300 rows.
PACKING_ROWS = 16

# layer -> ((data_ptr, version) of the weight it was packed from, packed weight); an entry goes
# when its layer is garbage-collected.
_PACKED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[int, int], torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)


def onednn_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when ``PackedLinears`` can run a model on ``device`` in ``dtype`` (CPU, oneDNN
    built in, float32 or bfloat16)."""
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and dtype in (torch.float32, torch.bfloat16)
    )


class PackedLinears:
    """oneDNN-packed copies of the weights of a model's ``torch.nn.Linear`` layers, made on
    first use and again when a weight changes; ``installed`` runs the layers on them."""

    def __init__(self) -> None:
        self.packings = 0  # how many weights this instance packed so far (repacks included)

    def clear(self, model: torch.nn.Module) -> None:
        """Drops the packed weights of ``model``'s layers (they are packed again on next use)."""
        for module in model.modules():
            _PACKED.pop(module, None)

    def packed_weight(self, module: torch.nn.Linear) -> torch.Tensor:
        """Returns ``module``'s weight packed for oneDNN, packing it when it is new or changed."""
        weight = module.weight
        seen = (weight.data_ptr(), weight._version)
        entry = _PACKED.get(module)
        if entry is None or entry[0] != seen:
            with torch.no_grad():
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKING_ROWS)
            entry = (seen, packed)
            _PACKED[module] = entry
            self.packings += 1
        return entry[1]

    @contextmanager
    def installed(self, model: torch.nn.Module) -> Iterator[None]:
        """Runs ``model``'s plain ``torch.nn.Linear`` layers on packed weights inside the
        context, for calls without autograd whose input has the weight's dtype and device;
        other calls, and every call after the context, run the layers' own ``forward``."""
        linears = [module for module in model.modules() if type(module) is torch.nn.Linear]
        for module in linears:
            module.forward = self._packed_forward(module)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for module in linears:
                del module.forward

    def _packed_forward(self, module: torch.nn.Linear) -> Any:
        """Returns ``module``'s forward on its packed weight (its own forward where that
        cannot run: autograd on, or another dtype or device)."""
        own_forward = type(module).forward.__get__(module)

        def forward(input: torch.Tensor) -> torch.Tensor:
            weight = module.weight
            if torch.is_grad_enabled() or input.dtype != weight.dtype or input.device != weight.device:
                return own_forward(input)  # type: ignore[no-any-return]
            packed = self.packed_weight(module)
            if input.numel() == input.shape[-1]:
                # oneDNN runs a single row through another kernel than two or more, whose sums
                # round differently; with a zero row beside it, a row's output does not depend on
                # how many rows share the call (decode steps of one request, cached prefills).
                pair = torch.cat([input.reshape(1, -1), input.new_zeros(1, input.shape[-1])])
                output = torch.ops.mkldnn._linear_pointwise(pair, packed, module.bias, "none", [], "")
                return output[:1].reshape(*input.shape[:-1], -1)
            return torch.ops.mkldnn._linear_pointwise(input, packed, module.bias, "none", [], "")  # type: ignore[no-any-return]

        return forward
