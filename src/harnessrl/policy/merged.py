"""The weights a sampling copy takes from a trained model: its own, or a LoRA model's merged.

A trainer that rolls out from a copy of its model (bfloat16 beside float32 master weights, or a
plain model beside a PEFT LoRA model) hands that copy the trained weights after every optimizer
step. For a plain model they are its parameters; for a PEFT LoRA model they are the base
model's with each adapted layer's ``scale * B @ A`` added, under the base model's own parameter
names (``...q_proj.base_layer.weight`` is the copy's ``...q_proj.weight``). Sampling through the
merged copy instead of through the adapters runs one packed linear layer per projection of
``policy/hf.py`` (1.1-1.3x the tokens per second in float32 on this project's CPU,
``benchmarks/bench_lora_rollout.py``), in the trainer's rollout dtype, and never changes the
master weights: the adapters stay unmerged.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

_BASE_LAYER = ".base_layer"


def is_lora_model(model: torch.nn.Module) -> bool:
    """True for a PEFT model (it carries ``peft_config``)."""
    return hasattr(model, "peft_config")


def sampling_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields ``(name, tensor)`` for every parameter of the model a sampling copy holds: ``model``'s
    own for a plain model; for a PEFT LoRA model, the base model's, with each adapted linear
    layer's weight merged (``base + get_delta_weight`` of its active adapters, in the base
    weight's dtype) and the adapters' own parameters left out. Tensors are detached; merged
    ones are new tensors, the rest are the model's own."""
    if not is_lora_model(model):
        for name, parameter in model.named_parameters():
            yield name, parameter.detach()
        return
    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for module_name, module in base.named_modules():
        if not (hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")):
            continue
        if getattr(module, "merged", False):  # merged in place: the base weight already holds it
            continue
        adapters = [name for name in module.active_adapters if name in module.lora_A]
        if adapters:
            with torch.no_grad():
                deltas[f"{module_name}{_BASE_LAYER}.weight"] = sum(module.get_delta_weight(a) for a in adapters)
    for name, parameter in base.named_parameters():
        if ".lora_" in name:
            continue
        value = parameter.detach()
        if name in deltas:  # summed in float32, rounded once to the base weight's dtype
            value = (value.float() + deltas[name].float()).to(value.dtype)
        yield name.replace(_BASE_LAYER, ""), value
