"""Where local models run and in which dtype: ``auto`` resolved per machine (CUDA, CPUs with
native bfloat16). Host memory (arenas, handing freed memory back) is ``harnessrl.memory``'s."""

from __future__ import annotations

import os
from pathlib import Path

import torch

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


def cpu_has_native_bf16(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> bool:
    """True when the CPU multiplies bfloat16 natively (Intel AMX or AVX512-BF16 flags).

    There bfloat16 matrix products run several times faster than float32 (about 3.6x for a
    2048x576x1536 product on a 2-core Xeon with AMX); elsewhere bfloat16 is emulated and slower.
    """
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[-1].split())
            return bool(flags & {"amx_bf16", "avx512_bf16"})
    return False


def resolve_rollout_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """Returns the dtype of a trainer's rollout copy: ``"auto"`` is bfloat16 on CUDA and on CPUs
    with native bfloat16 (``cpu_has_native_bf16``), float32 elsewhere; other values as
    ``resolve_dtype``."""
    if dtype == "auto":
        native = device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
        return torch.bfloat16 if native else torch.float32
    return resolve_dtype(dtype, device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """Returns the weight dtype: ``"auto"`` is bfloat16 on CUDA and float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]

