"""Drawing one token per row of logits: the temperature below which a row is greedy, the
nucleus filter and one inverse-CDF draw per request generator; numerically safe for every
accepted value (a row never yields an index outside its vocabulary)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harnessrl.policy.base import SamplingParams

GREEDY_TEMPERATURE = 1e-5
"""A temperature below this samples greedily (argmax, log-probabilities of the raw logits),
as vLLM does: dividing float32 logits by a tinier one overflows (1e-300 is 0 in float32)."""


def effective_temperature(temperature: float) -> float:
    """Returns the temperature a request samples with: 0 (greedy) below `GREEDY_TEMPERATURE`."""
    return 0.0 if temperature < GREEDY_TEMPERATURE else float(temperature)


def sample_index(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Returns one index drawn from ``probs`` (one row, unnormalized is fine), shape [1].

    Inverse-CDF sampling with exactly one uniform draw from ``generator`` per call, so a
    request's stream of draws does not depend on anything else in the batch. (It is also
    ~20x faster than ``torch.multinomial`` over a 49k vocabulary on CPU.) Zero-probability
    entries are never drawn. A row with no positive finite mass (all zero, NaN or infinite
    entries) yields its largest finite entry instead of an index past its end.
    """
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[-1:]
    uniform = torch.rand(1, generator=generator, device=probs.device, dtype=cdf.dtype) * total
    # Rounding could make uniform == total, which would index past the last nonzero entry.
    uniform = torch.minimum(uniform, torch.nextafter(total, torch.zeros_like(total)))
    index = torch.searchsorted(cdf, uniform, right=True).clamp(max=probs.shape[-1] - 1)
    # Chosen without a device sync: the draw where the row has mass, else its largest entry.
    usable = torch.isfinite(total) & (total > 0)
    fallback = torch.argmax(torch.nan_to_num(probs, nan=0.0, posinf=0.0, neginf=0.0)).reshape(1)
    return torch.where(usable, index, fallback)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Returns ``probs`` (one row, unnormalized is fine) with everything outside the nucleus
    zeroed: the smallest set of most likely tokens whose mass reaches ``top_p`` is kept
    (Holtzman et al. 2020, section 3.1). The most likely token is always kept, also when
    ``top_p`` times the mass underflows to 0 (``top_p`` 1e-300): then it alone is kept."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    outside = mass_before >= top_p * sorted_probs.sum()
    outside[..., 0] = False
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def seeded_generator(device: torch.device | str, seed: int | None) -> torch.Generator:
    """Returns a fresh generator on ``device`` seeded with ``seed`` (random if None): a
    request's own stream of draws (``HFPolicy``'s convention)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return generator


def sample_rows(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Returns one sampled token per row of ``logits`` (float32, [rows, vocab]) and its
    log-probability under the row's temperature; row r draws from ``generators[r]`` with
    ``params[r]`` (greedy rows take the argmax)."""
    used = [effective_temperature(p.temperature) for p in params]  # 0: greedy
    temperatures = torch.tensor([t if t > 0 else 1.0 for t in used], device=logits.device, dtype=logits.dtype)
    logprobs = torch.log_softmax(logits / temperatures[:, None], dim=-1)
    chosen: list[torch.Tensor] = []
    for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
        if used[row] == 0:
            chosen.append(torch.argmax(logprobs[row]).reshape(1))
            continue
        probs = top_p_filter(logprobs[row].exp(), row_params.top_p)
        chosen.append(sample_index(probs, generator))
    tokens = torch.cat(chosen)
    token_logprobs = logprobs.gather(-1, tokens[:, None])[:, 0]
    return tokens.tolist(), token_logprobs.tolist()
