"""The clipped update over epochs and mini-batches against a slow, obviously-correct reference
on a tiny model of the embedded architecture: old log-probs computed once, ratios that leave 1,
the 0.20 / 0.28 clip and the truncated importance weight acting, and 1 x 1 the on-policy step."""

import math

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.rl.batching import UpdateSample, mini_batch_order  # noqa: E402
from harnessrl.rl.objectives import UpdateSettings  # noqa: E402
from harnessrl.rl.update import update_step  # noqa: E402

TEMPERATURE = 0.7
CLIP_LOW, CLIP_HIGH, CAP = 0.20, 0.28, 2.0


def reference_token_logprobs(model, ids):
    """log pi(token t | tokens < t) for t = 1.., from the full-vocabulary logits of one sequence."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def reference_values(model, head, ids):
    hidden = model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0]
    return head(hidden.float())[:, 0]


def reference_update(model, head, optimizer, samples, steps, vf_coef=0.1, vf_clip=0.2, norm_tokens=None):
    """PPO over the optimizer steps ``steps`` (lists of sample indices), one sequence and one
    token at a time: old log-probs once before the first step, per token
    max(-A r, -A clip(r, 1 - low, 1 + high)) x min(exp(old - rollout), cap), the mean over the
    mini-batch's policy tokens (with ``norm_tokens``, Dr. GRPO: their sum / (the mini-batch's
    sequences x norm_tokens)), plus vf_coef x CleanRL's clipped value loss averaged over the
    mini-batch's value positions. Returns the losses of the steps."""
    with torch.no_grad():
        old = [reference_token_logprobs(model, s.input_ids).tolist() for s in samples]
    losses = []
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        terms, value_terms = [], []
        for index in step:
            sample = samples[index]
            logprobs = reference_token_logprobs(model, sample.input_ids)
            for t in range(1, len(sample.input_ids)):
                if not sample.loss_mask[t]:
                    continue
                advantage = sample.advantage[t] if isinstance(sample.advantage, list) else sample.advantage
                ratio = torch.exp(logprobs[t - 1] - old[index][t - 1])
                clipped = torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
                weight = min(max(math.exp(old[index][t - 1] - sample.rollout_logprobs[t]), 0.0), CAP)
                terms.append(max(-advantage * ratio, -advantage * clipped) * weight)
            if head is not None and sample.value_positions:
                values = reference_values(model, head, sample.input_ids)
                for position, ret, old_value in zip(sample.value_positions, sample.returns, sample.old_values, strict=True):
                    value = values[position]
                    clipped_value = old_value + torch.clamp(value - old_value, -vf_clip, vf_clip)
                    value_terms.append(0.5 * max((value - ret) ** 2, (clipped_value - ret) ** 2))
        loss = sum(terms) / (len(terms) if norm_tokens is None else len(step) * norm_tokens)
        if value_terms:
            loss = loss + vf_coef * sum(value_terms) / len(value_terms)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def tiny(tiny_model):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def grpo_batch(model, n_groups=2, group_size=3):
    """Groups sharing a 70-token prompt; rollout log-probs off the model's own by +-1 nat, so
    the importance weight is capped at 2 on some tokens and below 1 on others."""
    samples = []
    for group in range(n_groups):
        prompt = [(7 * i + 13 * group) % 90 + 5 for i in range(70)]
        for member in range(group_size):
            completion = [(11 * j + 5 * member + 17 * group) % 200 + 100 for j in range(8 + 3 * member)]
            ids = prompt + completion
            with torch.no_grad():
                own = reference_token_logprobs(model, ids).tolist()
            rollout = [0.0] + [lp + (-1.0 if t % 2 else 0.3) for t, lp in enumerate(own)]
            advantage = (1.0, -0.6, -0.2)[member] * (1.0 if group == 0 else -0.5)
            samples.append(UpdateSample(ids, [0] * len(prompt) + [1] * len(completion), rollout, advantage))
    return samples


def ppo_batch(model, head):
    """GRPO-shaped samples with per-token advantages and two critic positions each, the old
    values being the critic's own at rollout time."""
    samples = grpo_batch(model)
    for i, sample in enumerate(samples):
        start = sample.loss_mask.index(1)
        sample.advantage = [0.0] * start + [(-1) ** i * (0.5 + 0.1 * t) for t in range(len(sample.input_ids) - start)]
        sample.value_positions = [start - 1, start + 2]
        with torch.no_grad():
            values = reference_values(model, head, sample.input_ids)
        sample.old_values = [float(values[p]) for p in sample.value_positions]
        sample.returns = [1.0 - 0.3 * i, 0.5]
    return samples


def test_mini_batch_order_is_a_seeded_shuffle_per_epoch():
    steps = mini_batch_order(10, ppo_epochs=3, mini_batches=4, seed=7)
    assert len(steps) == 12 and [len(s) for s in steps[:4]] == [3, 3, 2, 2]
    epochs = [sorted(i for s in steps[k : k + 4] for i in s) for k in (0, 4, 8)]
    assert epochs == [list(range(10))] * 3  # each epoch sees every sample once
    assert [i for s in steps[:4] for i in s] != [i for s in steps[4:8] for i in s]  # reshuffled per epoch
    assert mini_batch_order(10, 3, 4, seed=7) == steps
    assert mini_batch_order(10, 3, 4, seed=8) != steps
    assert mini_batch_order(5, 2, 1) == [list(range(5))] * 2  # one part keeps the order
    assert [len(s) for s in mini_batch_order(3, 1, 8)] == [1, 1, 1]  # never an empty mini-batch


@pytest.mark.parametrize(
    ("share_prefix", "micro_batch_tokens"), [(True, 4096), (False, 200)], ids=["shared-prefix", "accumulated"]
)
def test_epochs_and_mini_batches_match_the_slow_reference_and_clip(tiny_model, share_prefix, micro_batch_tokens):
    model, reference = tiny(tiny_model), tiny(tiny_model)
    samples = grpo_batch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    metrics = update_step(
        model, optimizer, samples, 0, UpdateSettings(
            temperature=TEMPERATURE, max_grad_norm=1e9, ppo_epochs=2, mini_batches=2, share_prefix=share_prefix,
            micro_batch_tokens=micro_batch_tokens),
        scheduler=scheduler, seed=3,
    )
    reference_update(reference, None, torch.optim.SGD(reference.parameters(), lr=0.1), samples,
                     mini_batch_order(len(samples), 2, 2, seed=3))
    assert metrics["optimizer_steps"] == 4
    # The ratio leaves 1 after the first optimizer step and the clip acts on both sides.
    assert metrics["ratio_min"] < 1 - CLIP_LOW and metrics["ratio_max"] > 1 + CLIP_HIGH
    assert metrics["clipfrac_low"] > 0 and metrics["clipfrac_high"] > 0 and metrics["approx_kl"] > 1e-4
    # The importance weight compares the old policy with the sampler: capped at 2, fixed over the passes.
    assert metrics["iw_max"] == pytest.approx(CAP) and 0 < metrics["iw_capped_frac"] < 1
    # The scheduler advanced once for the rollout batch; all four steps ran at the first rate.
    assert scheduler.last_epoch == 1 and scheduler.get_last_lr() == [pytest.approx(0.05)]
    for (name, value), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(value, expected, atol=2e-5, rtol=1e-4), name
    initial = dict(tiny(tiny_model).named_parameters())
    assert any(not torch.equal(value, initial[name]) for name, value in model.named_parameters())


@pytest.mark.parametrize(
    ("share_prefix", "micro_batch_tokens"), [(True, 4096), (False, 200), (False, 90)],
    ids=["shared-prefix", "accumulated", "one-per-micro-batch"],
)
def test_dr_grpo_divides_by_a_constant_whatever_the_packing(tiny_model, share_prefix, micro_batch_tokens):
    """Dr. GRPO (Liu et al. 2025): sum over policy tokens / (sequences x a fixed length), so a
    token counts the same in a short or a long completion and in any micro-batch packing."""
    model, reference = tiny(tiny_model), tiny(tiny_model)
    samples = grpo_batch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    update_step(
        model, optimizer, samples, 0, UpdateSettings(
            temperature=TEMPERATURE, max_grad_norm=1e9, ppo_epochs=2, mini_batches=2, share_prefix=share_prefix,
            micro_batch_tokens=micro_batch_tokens, aggregation="token_sum_norm", loss_norm_tokens=32),
        seed=3,
    )
    reference_update(reference, None, torch.optim.SGD(reference.parameters(), lr=0.5), samples,
                     mini_batch_order(len(samples), 2, 2, seed=3), norm_tokens=32)
    for (name, value), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(value, expected, atol=2e-5, rtol=1e-4), name
    with pytest.raises(ValueError, match="loss_norm_tokens"):
        update_step(model, optimizer, samples, 0, UpdateSettings(aggregation="token_sum_norm"))


def test_ppo_value_head_trains_in_the_same_passes_with_its_clipped_loss(tiny_model):
    model, reference = tiny(tiny_model), tiny(tiny_model)
    torch.manual_seed(1)
    head = torch.nn.Linear(32, 1)
    reference_head = torch.nn.Linear(32, 1)
    reference_head.load_state_dict(head.state_dict())
    samples = ppo_batch(model, head)
    optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
    metrics = update_step(model, optimizer, samples, 0, UpdateSettings(
        temperature=TEMPERATURE, max_grad_norm=1e9, vf_coef=0.5, vf_clip=0.2, ppo_epochs=3, mini_batches=2),
        value_head=head, seed=5)
    reference_update(reference, reference_head,
                     torch.optim.SGD([*reference.parameters(), *reference_head.parameters()], lr=0.1),
                     samples, mini_batch_order(len(samples), 3, 2, seed=5), vf_coef=0.5, vf_clip=0.2)
    assert metrics["optimizer_steps"] == 6 and metrics["vf_clipfrac"] > 0 and metrics["clipfrac_low"] > 0
    assert torch.allclose(head.weight, reference_head.weight, atol=2e-5, rtol=1e-4)
    assert torch.allclose(head.bias, reference_head.bias, atol=2e-5, rtol=1e-4)
    for (name, value), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(value, expected, atol=2e-5, rtol=1e-4), name


def test_one_pass_of_one_mini_batch_is_the_on_policy_step(tiny_model):
    """The default: old log-probs are the current ones, so every ratio is exactly 1 and the
    clip never acts; loss, gradient norm and weights are those of the slow reference."""
    model, reference = tiny(tiny_model), tiny(tiny_model)
    samples = grpo_batch(model)
    metrics = update_step(model, torch.optim.SGD(model.parameters(), lr=0.1), samples, 0,
                          UpdateSettings(temperature=TEMPERATURE, max_grad_norm=1e9))
    (loss,) = reference_update(reference, None, torch.optim.SGD(reference.parameters(), lr=0.1), samples,
                               [list(range(len(samples)))])
    assert metrics["optimizer_steps"] == 1
    assert metrics["ratio_min"] == metrics["ratio_max"] == metrics["ratio_mean"] == 1.0
    assert metrics["clipfrac_low"] == metrics["clipfrac_high"] == metrics["approx_kl"] == 0.0
    assert metrics["pg_loss"] == pytest.approx(loss, rel=1e-5)
    for (name, value), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(value, expected, atol=2e-6, rtol=1e-5), name


def test_the_same_seed_gives_the_same_update_and_bad_counts_are_refused(tiny_model):
    results = []
    for seed in (4, 4, 9):
        model = tiny(tiny_model)
        samples = grpo_batch(model)
        update_step(model, torch.optim.SGD(model.parameters(), lr=0.1), samples, 0,
                    UpdateSettings(ppo_epochs=1, mini_batches=3), seed=seed)
        results.append({k: v.detach().clone() for k, v in model.named_parameters()})
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])
    assert any(not torch.equal(results[0][k], results[2][k]) for k in results[0])  # another order
    with pytest.raises(ValueError, match="at least 1"):
        UpdateSettings(ppo_epochs=0)
