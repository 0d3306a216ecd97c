"""Activation checkpointing (`activation_checkpointing`, rl/forward.py): an update's numbers are
unchanged bit for bit on every path through `decoder_hidden` (one pass, a shared prefix run
once, the two calls of a data-parallel rank; full fine-tuning and LoRA; float32 and bfloat16
autocast; one optimizer step and several), and the forward keeps a fraction of the activations
for the backward pass. The trainer-level check is in tests/test_trainer_recorded.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.rl.batching import collate, micro_batches  # noqa: E402
from harnessrl.rl.forward import decoder_hidden, enable_activation_checkpointing  # noqa: E402
from harnessrl.rl.objectives import UpdateSettings  # noqa: E402
from harnessrl.rl.update import update_step  # noqa: E402
from test_clipped_update import TEMPERATURE, grpo_batch, tiny  # noqa: E402


def updated(model, checkpointed: bool, **settings):
    """Runs one update of the GRPO batch on ``model`` and returns (trained tensors, metrics)."""
    if checkpointed:
        enable_activation_checkpointing(model)
    samples = grpo_batch(model)
    params = [p for p in model.parameters() if p.requires_grad]
    metrics = update_step(model, torch.optim.SGD(params, lr=0.1), samples, 0,
                          UpdateSettings(temperature=TEMPERATURE, max_grad_norm=1e9, **settings))
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, metrics


@pytest.mark.parametrize(("share_prefix", "micro_batch_tokens", "autocast", "passes"), [
    (True, 4096, None, 1), (True, 4096, torch.bfloat16, 1), (False, 200, None, 1), (True, 4096, None, 2),
], ids=["shared-prefix", "shared-prefix-bf16", "one-pass-accumulated", "two-epochs-two-mini-batches"])
def test_a_checkpointed_update_is_the_plain_one_bit_for_bit(tiny_model, share_prefix, micro_batch_tokens, autocast,
                                                            passes):
    settings = {"share_prefix": share_prefix, "micro_batch_tokens": micro_batch_tokens, "autocast_dtype": autocast,
                "ppo_epochs": passes, "mini_batches": passes}
    plain, plain_metrics = updated(tiny(tiny_model), False, **settings)
    checkpointed, metrics = updated(tiny(tiny_model), True, **settings)
    assert plain_metrics == metrics
    assert plain_metrics["prefix_tokens_saved"] > 0 if share_prefix else plain_metrics["micro_batches"] > 1
    assert all(torch.equal(plain[name], checkpointed[name]) for name in plain)
    assert any(not torch.equal(plain[name], tiny(tiny_model).state_dict()[name]) for name in plain)  # it trained


def test_lora_adapters_train_the_same_checkpointed(tiny_model):
    peft = pytest.importorskip("peft", reason="peft is installed by `make test`")

    def lora():
        torch.manual_seed(1)
        return peft.get_peft_model(tiny(tiny_model), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                     init_lora_weights=False))

    plain, plain_metrics = updated(lora(), False)
    checkpointed, metrics = updated(lora(), True)
    assert plain and all(".lora_" in name for name in plain)
    assert plain_metrics == metrics
    assert all(torch.equal(plain[name], checkpointed[name]) for name in plain)


def training_model(tiny_model, checkpointed: bool):
    model = tiny(tiny_model)
    if checkpointed:
        enable_activation_checkpointing(model)
    return model.train()


def shared_prefix_batch(model):
    batch = next(iter(micro_batches(grpo_batch(model)[:3], 4096, True)))
    data = collate(batch, 0, torch.device("cpu"), True)
    assert len(batch) == 3 and int(data["prefix_len"]) > 0
    return data


@pytest.mark.parametrize("split", [False, True], ids=["shared-prefix", "data-parallel-split"])
def test_the_two_call_forward_gives_the_same_states_and_gradients(tiny_model, split):
    """``decoder_hidden``'s two calls (the prefix once, then the rows against its keys and
    values; or a rank's split at the first token) replay under checkpointing from a cache that
    does not grow: the states and every gradient equal the plain pass's."""
    results = []
    for checkpointed in (False, True):
        model = training_model(tiny_model, checkpointed)
        data = shared_prefix_batch(model)
        if split:
            batch = next(iter(micro_batches(grpo_batch(model)[:3], 4096, False)))
            data = collate(batch, 0, torch.device("cpu"), False)
            data["split"] = True
        hidden = decoder_hidden(model.get_decoder(), data)
        (hidden * torch.linspace(-1, 1, hidden.shape[-1])).sum().backward()
        results.append((hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain, plain_grads), (checkpointed, grads) = results
    assert torch.equal(plain, checkpointed)
    assert plain_grads.keys() == grads.keys() and len(grads) > 10
    assert all(torch.equal(plain_grads[name], grads[name]) for name in grads)


def test_checkpointing_keeps_a_fraction_of_the_activations(tiny_model):
    """What autograd keeps for the backward pass of a shared-prefix forward (parameters left
    out): checkpointed, only each layer's inputs; a small fraction of what the plain pass keeps."""
    kept = []
    for checkpointed in (False, True):
        model = training_model(tiny_model, checkpointed)
        data = shared_prefix_batch(model)
        sizes: list[int] = []

        def pack(tensor, sizes=sizes):
            if not isinstance(tensor, torch.nn.Parameter):
                sizes.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            decoder_hidden(model.get_decoder(), data)
        kept.append(sum(sizes))
    plain, checkpointed = kept
    assert checkpointed * 5 < plain, kept
