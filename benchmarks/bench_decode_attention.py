"""A decode step's attention: SDPA's flash kernel against harnessrl's C++ kernel, in one run.

In ``HFPolicy``'s decode step each row's one query token attends over its keys and values in the
KV slab: 9 query heads over 3 key heads (GQA), so transformers packs the 3 queries of each key
head (``pack_gqa``) and SDPA's CPU flash kernel computes 3 x 64 dot products per key through small
GEMM calls. On this project's CPUs that reads the keys at about a third of what one thread can
read from memory (docs/benchmarks.md, "The quiet run with cold caches"). The kernel
(``policy/decode_attention.cpp``, what ``HFPolicy`` decodes with on CPU in float32) streams each
row's keys and values once. Shapes: ``--rows`` rows of ``--columns`` columns (row 0 masks its first 100 as
padding), 30 layers' worth of slabs so that keys come from memory, not cache; the two variants
run interleaved ``--repeats`` times and the fastest pass of each counts. The outputs must agree
within 5e-5 (the script fails otherwise). The last line is ``ratio: X`` (the flash kernel's time
over the kernel's).

The kernel is built at first use (a C++ compiler and ninja; about 30 s, then cached).

    OMP_NUM_THREADS=1 python benchmarks/bench_decode_attention.py [--rows 8] [--columns 1500]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from harnessrl.policy.decode_kernel import decode_kernel

LAYERS = 30
KV_HEADS, QUERIES_PER_KV, HEAD_DIM = 3, 3, 64  # SmolLM2-135M


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--columns", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    start = time.monotonic()
    kernel = decode_kernel()
    if kernel is None:
        sys.exit("the kernel did not build (the warning above says why)")
    print(f"kernel loaded in {time.monotonic() - start:.1f} s; {torch.get_num_threads()} torch threads")
    rows, columns, capacity = args.rows, args.columns, args.columns + 256
    torch.manual_seed(0)
    slabs = [(torch.randn(rows, KV_HEADS, capacity, HEAD_DIM), torch.randn(rows, KV_HEADS, capacity, HEAD_DIM))
             for _ in range(LAYERS)]
    query = torch.randn(rows, KV_HEADS, QUERIES_PER_KV, HEAD_DIM)
    first = torch.zeros(rows, dtype=torch.long)
    first[0] = 100
    mask = torch.arange(columns)[None, :] >= first[:, None]
    mask = mask[:, None, None, :]
    scale = HEAD_DIM ** -0.5

    def flash(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)

    def harnessrl(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return kernel.decode_attention(query, key, value, first, scale)

    variants = {"SDPA flash (baseline)": flash, "harnessrl kernel": harnessrl}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, attend in variants.items():
            began = time.perf_counter()
            for keys, values in slabs:
                attend(keys[:, :, -columns:], values[:, :, -columns:])
            times[name].append(time.perf_counter() - began)
    gap = max((flash(k[:, :, -columns:], v[:, :, -columns:]) - harnessrl(k[:, :, -columns:], v[:, :, -columns:]))
              .abs().max().item() for k, v in slabs[:3])
    gigabytes = LAYERS * 2 * rows * KV_HEADS * columns * HEAD_DIM * 4 / 1e9
    for name, passes in times.items():
        best = min(passes)
        print(f"{name:24s} {1e3 * best:7.1f} ms per step ({gigabytes / best:5.1f} GB/s of keys and values)")
    print(f"largest difference: {gap:.1e}")
    if gap > 5e-5:
        print("the kernel's outputs differ from SDPA's", file=sys.stderr)
        sys.exit(1)
    print(f"ratio: {min(times['SDPA flash (baseline)']) / min(times['harnessrl kernel']):.2f}")


if __name__ == "__main__":
    main()
