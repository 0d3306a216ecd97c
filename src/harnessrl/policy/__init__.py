"""Policies: the protocol, scripted policies, and model-backed policies (loaded lazily)."""

from __future__ import annotations

from typing import Any

from harnessrl.policy.base import (
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
    WeightSyncedPolicy,
)

POLICY_SPECS = (
    "oracle | random | faulty | embedded | hf:<local model folder> | openai:<model>@<base url> "
    "| openai-text:<model>@<base url> | vllm:<local model folder or 'embedded'>"
)


def make_policy(spec: str, seed: int = 0, **kwargs: Any) -> Policy:
    """Returns a policy from a spec string (see ``POLICY_SPECS``); model stacks load lazily."""
    from harnessrl.policy.scripted import OraclePolicy, RandomPolicy

    if spec == "oracle":
        return OraclePolicy()
    if spec == "random":
        return RandomPolicy(seed=seed)
    if spec == "faulty":
        from harnessrl.policy.faulty import FaultyPolicy

        return FaultyPolicy()
    if spec in ("embedded", "hf") or spec.startswith("hf:"):
        from harnessrl.policy.hf import HFPolicy

        return HFPolicy(None if spec in ("embedded", "hf") else spec[3:], **kwargs)
    if spec.startswith("vllm:"):
        from harnessrl.policy.vllm_cpu import VLLMPolicy

        target = spec[5:]
        return VLLMPolicy(None if target in ("", "embedded") else target, **kwargs)
    if spec.startswith(("openai:", "openai-text:")):
        from harnessrl.policy.openai import OpenAIPolicy

        kind, _, rest = spec.partition(":")
        model, _, url = rest.partition("@")
        if not model or not url:
            raise ValueError(f"policy {spec!r}: expected {kind}:<model>@<base url>")
        kwargs.setdefault("context_length", "server")
        return OpenAIPolicy(model, url, mode="text" if kind == "openai-text" else "tokens", **kwargs)
    raise ValueError(f"unknown policy {spec!r}; use one of: {POLICY_SPECS}")


def make_training_policy(
    model: str | None, device: str = "auto", dtype: Any = "auto", *,
    server: str | None = None, server_model: str = "embedded", weights_dir: Any = None, cascade_attention: bool = False,
    attention_kernels: bool | None = None,
) -> WeightSyncedPolicy:
    """Returns the policy that rolls out for the trainer (``rl/loop.py``): with ``server`` (a
    vLLM server's ``http://host:port/v1``) a ``ServedTrainingPolicy`` of its model
    ``server_model``, whose weights are synced over HTTP through the folder ``weights_dir``; else an in-process ``HFPolicy`` of
    the local model folder ``model`` (``None`` or ``"embedded"``: the embedded default) on
    ``device`` with weights in ``dtype`` (``cascade_attention``: see ``HFPolicy``; ``attention_kernels``:
    its ``decode_kernel`` and ``prefill_kernel``). The trainer
    uses only the ``WeightSyncedPolicy`` interface."""
    if server is not None:
        from harnessrl.policy.served import ServedTrainingPolicy

        return ServedTrainingPolicy(server, server_model, weights_dir)
    from harnessrl.policy.hf import HFPolicy

    return HFPolicy(model, device=device, dtype=dtype, cascade_attention=cascade_attention,
                    decode_kernel=attention_kernels, prefill_kernel=attention_kernels)


__all__ = [
    "POLICY_SPECS",
    "Generation",
    "GenerationRequest",
    "Policy",
    "SamplingParams",
    "WeightSyncedPolicy",
    "make_policy",
    "make_training_policy",
]
