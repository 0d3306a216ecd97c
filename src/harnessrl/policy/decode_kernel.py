"""The C++ attention kernels (``decode_attention.cpp``, ``prefill_attention.cpp``): built once per CPU and source at first use, loaded, or None.

``HFPolicy`` decodes with one query token per row over its KV slab; SDPA's CPU flash kernel reads
the keys there at about a third of the memory bandwidth one thread has (docs/benchmarks.md, "The
quiet run with cold caches"), because the 3 queries that share a key head make GEMM calls too
small to stream the keys. ``decode_attention.cpp`` reads each row's keys and values once. A
request's prefill over its cached prefix goes through SDPA under a boolean mask at about half the
linear layers' rate; ``prefill_attention.cpp`` computes it in register tiles of the query heads
that share a key head.

The build (``torch.utils.cpp_extension.load``: a C++ compiler and ninja, about 60 s) is cached in
``<harnessrl cache>/kernels/<digest>``, the digest naming the source, the flags, torch's version
and this CPU (the code is compiled with ``-march=native``, so a cache folder shared by machines
with other CPUs holds one build per CPU). Where it cannot be built the reason is logged once and
``decode_kernel()`` is None: the policy keeps SDPA.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from harnessrl.policy.embedded import default_cache_root

SOURCES = tuple(Path(__file__).with_name(name) for name in ("decode_attention.cpp", "prefill_attention.cpp"))
HEADERS = (Path(__file__).with_name("attention_values.h"),)  # included by both: part of the build's name
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only")
HEAD_SIZES = (32, 64, 128)  # the sizes decode_attention.cpp instantiates
MAX_GROUP = 8  # query heads per key head it takes

log = logging.getLogger(__name__)


def _cpu_identity() -> str:
    """Returns what names this CPU's instruction set: /proc/cpuinfo's model name and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(wanted))


def build_digest() -> str:
    """Returns the name of these sources' build for this CPU, flags and torch."""
    digest = hashlib.sha256()
    sources = [source.read_bytes() for source in SOURCES + HEADERS]
    for part in (*sources, " ".join(FLAGS).encode(), torch.__version__.encode(), _cpu_identity().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def decode_kernel() -> Any | None:
    """Returns the loaded kernel module (its ``decode_attention``), building it the first time;
    None, with the reason logged once, where it cannot be built or loaded."""
    from torch.utils.cpp_extension import load

    name = f"harnessrl_decode_attention_{build_digest()}"
    folder = default_cache_root() / "kernels" / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not any(folder.glob("*.so")):
            log.info("building the attention kernels for this CPU into %s (once; about 60 s)", folder)
        return load(name, [str(source) for source in SOURCES], extra_cflags=list(FLAGS), build_directory=str(folder),
                    verbose=False)
    except Exception as exc:  # no compiler, no ninja, a read-only cache: SDPA stays
        log.warning("the attention kernels could not be built (%s: %s); decode and prefill attention use SDPA",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return None


def kernel_fits(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Returns whether the kernel computes this model's decode attention: CPU, float32 or
    bfloat16, a head size it is built for, at most ``MAX_GROUP`` query heads per key head."""
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and head_dim in HEAD_SIZES
            and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP)


def select_kernel(wanted: bool | None, fits: bool, setting: str = "decode_kernel") -> Any | None:
    """Returns the kernel for a policy that asks for it (``wanted``, the policy's ``setting``; None:
    wherever it ``fits`` and builds), or None; raises where it is asked for and does not fit or build."""
    if wanted is False:
        return None
    kernel = decode_kernel() if fits else None
    if wanted and kernel is None:
        raise ValueError(
            f"{setting} needs a CPU, float32 or bfloat16 weights, SDPA attention, a head size of "
            f"{'/'.join(map(str, HEAD_SIZES))} and a C++ compiler with ninja (the warning logged "
            f"says what failed); pass {setting}=None to choose automatically"
        )
    return kernel


def decode_arguments(kernel: Any, lengths: Sequence[int]) -> dict[str, Any]:
    """Returns the model forward's arguments that send a decode step's attention through
    ``kernel`` (``kv_slab.grouped_sdpa_attention`` reads them), row r filling its last
    ``lengths[r]`` slab columns, this step's token included."""
    return {"harnessrl_decode": (kernel, torch.tensor(lengths, dtype=torch.long))}


def decode_attention(kernel: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode step's attention in transformers' layout: ``query`` [rows, heads, 1, head_dim],
    ``key`` / ``value`` [rows, kv_heads, columns, head_dim] (right-aligned: row r fills its last
    ``lengths[r]`` columns). Returns [rows, 1, heads, head_dim], as transformers' SDPA attention."""
    rows, heads, _, head_dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    packed = query.reshape(rows, kv_heads, heads // kv_heads, head_dim)  # head h reads key head h // group
    out = kernel.decode_attention(packed, key, value, columns - lengths, scale)
    return out.reshape(rows, 1, heads, head_dim)


def prefill_arguments(kernel: Any) -> dict[str, Any]:
    """Returns the model forward's arguments that send one request's prefill attention through
    ``kernel`` (``kv_slab.grouped_sdpa_attention`` reads them): its new tokens are the last
    columns of its keys, after its cached prefix, with no padding."""
    return {"harnessrl_prefill": kernel}


def prefill_attention(kernel: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """One request's causal prefill attention in transformers' layout: ``query`` [1, heads, S,
    head_dim], the S new tokens; ``key`` / ``value`` [1, kv_heads, L, head_dim], the cached
    prefix's L - S columns and then the new tokens'. Returns [1, S, heads, head_dim], as
    transformers' SDPA attention."""
    return cast(torch.Tensor, kernel.prefill_attention(query, key, value, scale))
