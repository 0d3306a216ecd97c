"""A prefill's attention over its cached prefix: transformers' SDPA path against harnessrl's C++ kernel, in one run.

``HFPolicy`` prefills one request at a time: the prefix cache supplies the keys and values of the
prompt's first L - S tokens, and the S new tokens attend causally over all L. transformers' SDPA
attention computes that with the 9 query heads' keys repeated (``repeat_kv``) under a boolean mask,
or, where nothing was cached (S = L), with ``is_causal`` and GQA; on this project's CPUs that runs at
about half the linear layers' rate (docs/benchmarks.md, "The quiet run with cold caches"). The
kernel (``policy/prefill_attention.cpp``) computes it in register tiles of the query heads that
share a key head. Baseline: ``transformers.integrations.sdpa_attention.sdpa_attention_forward``
called as the model calls it. Shapes ``SxL`` (default: the sizes of the rollout workload's
prefills); the two variants run interleaved ``--repeats`` times, the fastest pass of each counts.
The outputs must agree within 1e-4 in float32 (the script fails otherwise). The last line is
``ratio: X`` (the baseline's total time over the kernel's).

    OMP_NUM_THREADS=1 python benchmarks/bench_prefill_attention.py [--shapes 113x900,821x821] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace
from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from harnessrl.policy.decode_kernel import decode_kernel, prefill_attention

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M
SHAPES = "113x900,388x1300,821x821,72x1100,986x986,300x1500,50x2000,20x1000"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated SxL: S new tokens over L columns")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    start = time.monotonic()
    kernel = decode_kernel()
    if kernel is None:
        sys.exit("the kernel did not build (the warning above says why)")
    print(f"kernels loaded in {time.monotonic() - start:.1f} s; {torch.get_num_threads()} torch threads, {args.dtype}")
    dtype = getattr(torch, args.dtype)
    module: Any = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    scale = HEAD_DIM ** -0.5
    torch.manual_seed(0)
    totals = {"transformers SDPA (baseline)": 0.0, "harnessrl kernel": 0.0}
    worst = 0.0
    for shape in args.shapes.split(","):
        tokens, columns = (int(part) for part in shape.split("x"))
        query = torch.randn(1, HEADS, tokens, HEAD_DIM, dtype=dtype)
        key, value = torch.randn(2, 1, KV_HEADS, columns, HEAD_DIM, dtype=dtype)
        mask = None if tokens == columns else torch.ones(tokens, columns, dtype=torch.bool).tril(columns - tokens)[None, None]

        def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            return sdpa_attention_forward(module, query, key, value, mask, scaling=scale)[0]  # type: ignore[no-any-return]

        def harnessrl(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, _: torch.Tensor | None) -> torch.Tensor:
            return prefill_attention(kernel, query, key, value, scale)

        variants = {"transformers SDPA (baseline)": sdpa, "harnessrl kernel": harnessrl}
        best = {name: float("inf") for name in variants}
        for _ in range(args.repeats):
            for name, attend in variants.items():
                began = time.perf_counter()
                attend(query, key, value, mask)
                best[name] = min(best[name], time.perf_counter() - began)
        gap = (sdpa(query, key, value, mask).float() - harnessrl(query, key, value, mask).float()).abs().max().item()
        worst = max(worst, gap)
        flops = 4 * HEADS * HEAD_DIM * tokens * (columns - (tokens - 1) / 2)  # causal: the dots each token makes
        print(f"S={tokens:5d} L={columns:5d}: " + " | ".join(
            f"{name} {1e3 * t:7.2f} ms ({flops / t / 1e9:5.1f} GFLOP/s)" for name, t in best.items())
            + f" | ratio {best['transformers SDPA (baseline)'] / best['harnessrl kernel']:.2f}")
        for name, t in best.items():
            totals[name] += t
    print(f"largest difference: {worst:.1e}")
    if worst > (1e-4 if dtype == torch.float32 else 3e-2):
        print("the kernel's outputs differ from SDPA's", file=sys.stderr)
        sys.exit(1)
    print(f"ratio: {totals['transformers SDPA (baseline)'] / totals['harnessrl kernel']:.2f}")


if __name__ == "__main__":
    main()
