"""The training loop end to end on a tiny model of the embedded architecture: weights change,
metrics and checkpoints are written, and a run killed with SIGKILL resumes on the same schedule."""

import copy
import json

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from checkpoint_helpers import kill_train_when, write_run_config  # noqa: E402
from harnessrl.rl.algorithms import grpo_samples  # noqa: E402
from harnessrl.rl.batching import UpdateSample  # noqa: E402
from harnessrl.rl.config import load_config  # noqa: E402
from harnessrl.rl.loop import Trainer, train  # noqa: E402
from harnessrl.rl.objectives import UpdateSettings  # noqa: E402
from harnessrl.rl.update import update_step  # noqa: E402
from harnessrl.trajectory import load_jsonl  # noqa: E402


def tiny_overrides(model, run_dir, steps):
    return {
        "model": str(model), "run_dir": str(run_dir), "steps": steps, "tasks_per_step": 1, "group_size": 2,
        "max_turns": 1, "max_new_tokens": 8, "max_train_tasks": 8, "sft_warm_start_steps": 1, "sft_tasks": 2,
        "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": True, "micro_batch_tokens": 4096,
        "learning_rate": 1e-3, "temperature": 1.0, "seed": 3, "save_every": 1, "keep_checkpoints": 2,
    }


def parameters(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_update_step_changes_weights_only_with_signal(tiny_model):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    ids = list(range(10, 30))
    mask = [0] * 10 + [1] * 10
    zero = [UpdateSample(ids, mask, [-1.0] * 20, 0.0), UpdateSample(ids[::-1], mask, [-1.0] * 20, 0.0)]
    update_step(model, optimizer, zero, pad_id=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no advantage, no change
    signal_ = [UpdateSample(ids, mask, [-1.0] * 20, 1.0), UpdateSample(ids[::-1], mask, [-1.0] * 20, -1.0)]
    metrics = update_step(model, optimizer, signal_, pad_id=0)
    assert metrics["grad_norm"] > 0 and metrics["policy_tokens"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_tiny_run_writes_metrics_checkpoints_summary_and_changes_weights(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(preset="quick", overrides=tiny_overrides(tiny_model, run_dir, 2))
    summary = train(cfg, log=lambda message: None)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["episodes"] == 2 and len(r["pairs"]) == 1 for r in records)
    assert (run_dir / "checkpoints" / "step-000002" / "trainer_state.json").exists()
    assert (run_dir / "summary.md").read_text().count("|") > 10
    report = (run_dir / "report" / "index.html").read_text()  # train writes its run report
    assert "Learning curves" in report and (run_dir / "report" / "img" / "learning-curves.png").exists()
    assert set(summary["pass_at_1"]) == {"in_space", "out_of_space"}
    trained = parameters(run_dir / "checkpoints" / "step-000002" / "model")
    initial = parameters(tiny_model)
    assert any(not torch.equal(initial[k], trained[k]) for k in initial)  # the warm start moved them
    with pytest.raises(ValueError, match="not empty"):
        Trainer(cfg)


def test_resume_after_sigkill_continues_the_same_schedule(tiny_model, tmp_path):
    steps = 3
    reference_dir = tmp_path / "reference"
    train(load_config(preset="quick", overrides=tiny_overrides(tiny_model, reference_dir, steps)), log=lambda m: None)
    reference = [json.loads(line) for line in (reference_dir / "metrics.jsonl").read_text().splitlines()]

    killed_dir = tmp_path / "killed"
    config_file = write_run_config(tmp_path / "run.yaml", tiny_overrides(tiny_model, killed_dir, steps))
    kill_train_when(config_file, killed_dir, (killed_dir / "checkpoints" / "step-000001").exists)  # mid-run
    resumed_cfg = load_config(config_file, overrides={"run_dir": str(killed_dir)})
    train(resumed_cfg, resume=True, log=lambda m: None)
    resumed = [json.loads(line) for line in (killed_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == list(range(steps))
    assert [r["pairs"] for r in resumed] == [r["pairs"] for r in reference]
    # Same weights, same seeds: the redone steps sample the same rollouts.
    assert [r["tokens_generated"] for r in resumed] == [r["tokens_generated"] for r in reference]


def test_ppo_run_trains_a_value_head_over_turns(tiny_model, tmp_path):
    run_dir = tmp_path / "ppo"
    overrides = {**tiny_overrides(tiny_model, run_dir, 1), "algorithm": "ppo", "group_size": 1,
                 "tasks_per_step": 2, "max_turns": 2, "sft_warm_start_steps": 0, "eval_base": False,
                 "skip_no_signal_groups": False}
    train(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert record["episodes"] == 2 and record["trained_samples"] >= 2
    assert "update/vf_loss" in record and "update/explained_variance" in record
    checkpoint = run_dir / "checkpoints" / "step-000001"
    head = torch.load(checkpoint / "value_head.pt")
    assert head["weight"].shape[-1] == 32


def test_run_with_epochs_mini_batches_and_rloo_logs_every_optimizer_step(tiny_model, tmp_path):
    run_dir = tmp_path / "epochs"
    overrides = {**tiny_overrides(tiny_model, run_dir, 1), "group_size": 3, "sft_warm_start_steps": 0,
                 "eval_base": False, "skip_no_signal_groups": False, "ppo_epochs": 2, "mini_batches": 3,
                 "advantage": "rloo"}
    cfg = load_config(preset="quick", overrides=overrides)
    lines: list[str] = []
    train(cfg, log=lines.append)
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert record["trained_samples"] == 3
    assert record["update/optimizer_steps"] == 6  # 2 passes x 3 mini-batches, one step each
    assert {"update/clipfrac_low", "update/clipfrac_high", "update/approx_kl", "update/ratio_min",
            "update/ratio_max"} <= set(record)
    assert any("optimizer steps 6 clipped" in line for line in lines)
    # advantage: rloo gives each rollout r - mean of the other two, unscaled.
    trainer = Trainer(cfg, resume=True, log=lambda m: None)
    assert trainer.actor.scheduler.last_epoch == 1  # the schedule advanced once for the step, not six times
    trajectories = load_jsonl(run_dir / "rollouts" / "step-000000.jsonl")
    samples = grpo_samples(trajectories, [1.0, 0.0, 0.0], [0, 0, 0], trainer.cfg)
    assert [s.advantage for s in samples] == pytest.approx([1.0, -0.5, -0.5])
    trainer.cfg.advantage = "grpo"
    samples = grpo_samples(trajectories, [1.0, 0.0, 0.0], [0, 0, 0], trainer.cfg)
    assert [s.advantage for s in samples] == pytest.approx([2 ** 0.5, -(2 ** -0.5), -(2 ** -0.5)])


def test_masked_logprobs_equal_the_full_vocabulary_projection(tiny_model):
    from harnessrl.rl.batching import collate as _collate
    from harnessrl.rl.forward import masked_token_logprobs
    from harnessrl.rl.losses import token_logprobs_and_entropy

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    samples = [UpdateSample(list(range(5, 25)), [0] * 12 + [1] * 8, [0.0] * 20),
               UpdateSample(list(range(30, 45)), [0] * 5 + [1] * 10, [0.0] * 15)]
    data = _collate(samples, 0, torch.device("cpu"))
    _, logprobs, entropy = masked_token_logprobs(model, data, 0.7)
    logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits[:, :-1]
    ref_logprobs, ref_entropy = token_logprobs_and_entropy(logits, data["targets"], 0.7)
    assert torch.allclose(logprobs, ref_logprobs * data["mask"], atol=1e-5)
    assert torch.allclose(entropy, ref_entropy * data["mask"], atol=1e-4)


def test_lora_run_trains_only_the_adapter_and_resumes(tiny_model, tmp_path):
    pytest.importorskip("peft", reason="peft is installed by `make test`")
    run_dir = tmp_path / "lora"
    overrides = {**tiny_overrides(tiny_model, run_dir, 1), "lora_rank": 4, "kl_coef": 0.05, "eval_base": False}
    train(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    adapter = run_dir / "checkpoints" / "step-000001" / "model"
    assert (adapter / "adapter_config.json").exists() and not (adapter / "model.safetensors").exists()
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert record["step"] == 0
    resumed = Trainer(load_config(preset="quick", overrides={**overrides, "steps": 2}), resume=True, log=lambda m: None)
    assert resumed.state["step"] == 1 and resumed.actor.ref_model is not None
    lora_weights = {k: v for k, v in resumed.actor.model.state_dict().items() if "lora_B" in k}
    assert lora_weights and any(float(v.abs().sum()) > 0 for v in lora_weights.values())  # trained adapter loaded
    trainable = [n for n, p in resumed.actor.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lora_rollouts_sample_a_copy_with_the_adapters_merged(tiny_model, tmp_path, dtype):
    """LoRA trains a model of its own; the rollout copy holds the base weights plus each adapter's
    scale * B @ A (as peft's merge_and_unload computes them) after every sync, while the trained
    model keeps its adapters unmerged."""
    pytest.importorskip("peft", reason="peft is installed by `make test`")
    from harnessrl.policy.merged import is_lora_model

    overrides = tiny_overrides(tiny_model, tmp_path / "lora", 1) | {"lora_rank": 4, "dtype": dtype, "device": "cpu"}
    trainer = Trainer(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    actor, rollout_model = trainer.actor, trainer.policy.model
    assert rollout_model is not actor.model and not is_lora_model(rollout_model) and is_lora_model(actor.model)
    # The frozen base is in the run's dtype; only float32 master weights get an autocast of their own.
    assert actor.precision == {"rollout": dtype, "master": dtype, "autocast": "off"}
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in actor.model.named_parameters():
            if "lora_B" in name:  # a trained adapter (B starts at 0)
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)

    def base_weights():  # the trained model's frozen base, under the plain model's names
        return {k.replace(".base_layer", ""): v.detach().clone()
                for k, v in actor.model.get_base_model().named_parameters() if "lora_" not in k}

    base_before = base_weights()
    actor.sync_rollout_weights()
    merged = dict(copy.deepcopy(actor.model).merge_and_unload().named_parameters())
    rollout = dict(rollout_model.named_parameters())
    assert rollout.keys() == merged.keys() == base_before.keys()
    for name, parameter in merged.items():
        assert torch.equal(rollout[name], parameter.detach().to(rollout[name].dtype)), name
    changed = [name for name, parameter in merged.items() if not torch.equal(parameter, base_before[name])]
    assert len(changed) == 7 * 2  # every linear layer of the two decoder layers took its adapter
    assert all(torch.equal(v, base_weights()[k]) for k, v in base_before.items())  # the adapters stay unmerged


def test_an_update_runs_after_the_rollouts_prefix_cache_is_dropped(tiny_model, tmp_path, monkeypatch):
    """The step's rollouts filled the prefix cache; the update (whose weight sync drops it anyway)
    runs without it, so its activations do not sit on top of the cached keys and values."""
    import harnessrl.rl.actor as actor_module
    from harnessrl.policy.base import GenerationRequest, SamplingParams

    trainer = Trainer(load_config(preset="quick", overrides=tiny_overrides(tiny_model, tmp_path / "run", 1)),
                      log=lambda m: None)
    policy = trainer.policy
    prompt = list(range(10, 80))
    policy.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=4))])
    assert policy.prefix_cache.tokens > 0
    cached_during_update = []
    real_update_step = actor_module.update_step

    def spy(*args, **kwargs):
        cached_during_update.append(policy.prefix_cache.tokens)
        return real_update_step(*args, **kwargs)

    monkeypatch.setattr(actor_module, "update_step", spy)
    ids, mask = list(range(10, 30)), [0] * 10 + [1] * 10
    trainer.actor.update([UpdateSample(ids, mask, [-1.0] * 20, 1.0), UpdateSample(ids[::-1], mask, [-1.0] * 20, -1.0)], 0)
    assert cached_during_update == [0]


def test_a_finished_run_releases_its_master_copy_and_optimizer_state_for_evaluation(tiny_model, tmp_path):
    """An experiment evaluates a finished arm through its rollout policy only: release_training_state
    frees the LoRA master copy, the KL reference, the trained adapters and the optimizer's moments
    (nothing else holds them), and the policy's greedy tokens stay what they were."""
    import gc
    import weakref

    pytest.importorskip("peft", reason="peft is installed by `make test`")
    from harnessrl.policy.base import GenerationRequest, SamplingParams

    overrides = tiny_overrides(tiny_model, tmp_path / "lora", 1) | {"lora_rank": 4, "kl_coef": 0.05, "eval_base": False}
    trainer = Trainer(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    actor = trainer.actor
    ids, mask = list(range(10, 30)), [0] * 10 + [1] * 10
    actor.update([UpdateSample(ids, mask, [-1.0] * 20, 1.0), UpdateSample(ids[::-1], mask, [-1.0] * 20, -1.0)], 0)
    assert actor.optimizer.state and actor.model is not trainer.policy.model
    trained = next(p for p in actor.model.parameters() if p.requires_grad)
    master, reference, adapter = weakref.ref(actor.model), weakref.ref(actor.ref_model), weakref.ref(trained)
    moments = weakref.ref(actor.optimizer.state[trained]["exp_avg"])
    del trained
    request = GenerationRequest(list(range(10, 60)), SamplingParams(temperature=0.0, max_new_tokens=6))
    before = trainer.policy.generate([request])[0].token_ids
    trainer.release_training_state()
    gc.collect()
    assert master() is None and reference() is None and adapter() is None and moments() is None
    assert trainer.policy.generate([request])[0].token_ids == before


def test_the_final_evaluation_runs_without_the_optimizer_and_records_into_the_last_checkpoint(
        tiny_model, tmp_path, monkeypatch):
    """After the last step the run frees its optimizer and float32 master copy before the final
    evaluation (its peak memory otherwise), then writes the evaluation into the last checkpoint's
    trainer state alone: the weights and optimizer files stay the ones the step saved (the same
    files, linked), and a resume loads them and finds the evaluation."""
    from harnessrl.rl.checkpoint import checkpoint_is_complete

    run_dir = tmp_path / "bf16"
    cfg = load_config(preset="quick", overrides=tiny_overrides(tiny_model, run_dir, 1) | {"dtype": "bfloat16"})
    last = run_dir / "checkpoints" / "step-000001"
    seen: dict[str, tuple[bool, bool, int | None]] = {}
    real_evaluate = Trainer.evaluate

    def spy(self, label):
        files = [last / "model" / "model.safetensors", last / "optim.pt"]
        inodes = tuple(f.stat().st_ino for f in files) if last.exists() else None
        seen[label] = (self.actor.optimizer is None, self.actor.model is None, inodes)
        return real_evaluate(self, label)

    monkeypatch.setattr(Trainer, "evaluate", spy)
    train(cfg, log=lambda m: None)
    assert seen["base"][:2] == (False, False)
    assert seen["final"][:2] == (True, True)  # the optimizer's moments and the master copy are gone
    assert checkpoint_is_complete(last)
    assert tuple(f.stat().st_ino for f in [last / "model" / "model.safetensors", last / "optim.pt"]) == seen["final"][2]
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["final_eval_step"] == 1 and state["final_eval"] and state["wall_time_s"] > 0
    monkeypatch.setattr(Trainer, "evaluate", real_evaluate)
    resumed = Trainer(load_config(preset="quick", overrides=tiny_overrides(tiny_model, run_dir, 2) | {"dtype": "bfloat16"}),
                      resume=True, log=lambda m: None)
    assert resumed.state["step"] == 1 and resumed.state["final_eval_step"] == 1  # and it loaded optim.pt


def test_bf16_rollouts_keep_float32_master_weights_in_sync(tiny_model, tmp_path):
    """dtype=bfloat16: the optimizer owns float32 master weights, the policy samples from a
    bfloat16 copy, and every optimizer step copies the master into it."""
    overrides = tiny_overrides(tiny_model, tmp_path / "bf16", 1) | {"dtype": "bfloat16", "device": "cpu"}
    trainer = Trainer(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    assert trainer.actor.model is not trainer.policy.model
    assert next(trainer.actor.model.parameters()).dtype == torch.float32
    assert next(trainer.policy.model.parameters()).dtype == torch.bfloat16
    assert trainer.actor.precision == {"rollout": "bfloat16", "master": "float32", "autocast": "bfloat16"}
    master_before = {k: v.clone() for k, v in trainer.actor.model.named_parameters()}
    # An update far below bfloat16's resolution of the weights: only float32 masters keep it.
    ids, mask = list(range(10, 30)), [0] * 10 + [1] * 10
    samples = [UpdateSample(ids, mask, [-1.0] * 20, 1.0), UpdateSample(ids[::-1], mask, [-1.0] * 20, -1.0)]
    for group in trainer.actor.optimizer.param_groups:
        group["lr"] = 1e-6
    update_step(trainer.actor.model, trainer.actor.optimizer, samples, 0, UpdateSettings(autocast_dtype=trainer.actor.autocast_dtype))
    trainer.actor.sync_rollout_weights()
    moved = [k for k, v in trainer.actor.model.named_parameters() if not torch.equal(master_before[k], v)]
    assert moved
    rollout = dict(trainer.policy.model.named_parameters())
    for name, parameter in trainer.actor.model.named_parameters():
        assert torch.equal(rollout[name], parameter.detach().to(torch.bfloat16))
    # The tiny steps are lost in bfloat16 for most weights, which is why the master is float32.
    lost = sum(
        int(torch.equal(master_before[k].to(torch.bfloat16), trainer.actor.model.get_parameter(k).detach().to(torch.bfloat16)))
        for k in moved
    )
    assert lost > 0

    float_overrides = tiny_overrides(tiny_model, tmp_path / "fp32", 1) | {"dtype": "float32", "device": "cpu"}
    single = Trainer(load_config(preset="quick", overrides=float_overrides), log=lambda m: None)
    assert single.actor.model is single.policy.model and single.actor.precision["autocast"] == "off"


def _prefix_samples():
    prompt = [(7 * i) % 90 + 5 for i in range(96)]  # one prompt, three completions (a GRPO group)
    completions = [list(range(20, 32)), list(range(40, 47)), list(range(60, 78))]
    group = [UpdateSample(prompt + c, [0] * len(prompt) + [1] * len(c), [-1.0] * (len(prompt) + len(c)), a)
             for c, a in zip(completions, (1.0, -0.5, -0.5), strict=True)]
    other = list(range(3, 60))  # an unrelated sample: no common prefix with the group
    return [*group, UpdateSample(other, [0] * 40 + [1] * 17, [-1.0] * 57, 0.7)]


def test_shared_prefix_micro_batches_give_the_plain_loss_and_gradients(tiny_model):
    """Running a GRPO group's common prompt once (broadcast KV) changes neither the loss nor
    the update: the same weights come out of one step as from the plain padded batch."""
    from harnessrl.rl.batching import micro_batches, shared_prefix

    samples = _prefix_samples()
    assert shared_prefix(samples[:3]) == 95 and shared_prefix(samples) == 0
    batches = micro_batches(samples, 4096, share_prefix=True)
    assert any(len(b) == 3 and shared_prefix(b) == 95 for b in batches)
    results = {}
    for share in (False, True):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for objective in ("pg", "nll"):
            metrics = update_step(model, optimizer, samples, 0, UpdateSettings(
                objective=objective, share_prefix=share, max_grad_norm=1e9, temperature=0.7))
            results[(share, objective)] = metrics
        results[share] = {k: v.detach().clone() for k, v in model.named_parameters()}
    assert results[(True, "pg")]["prefix_tokens_saved"] == 95 * 2
    assert results[(False, "pg")]["prefix_tokens_saved"] == 0
    for objective in ("pg", "nll"):
        plain, shared = results[(False, objective)], results[(True, objective)]
        for key in ("grad_norm", "trained_tokens") if objective == "pg" else ("grad_norm", "nll"):
            assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    moved = [k for k in results[False] if not torch.equal(results[False][k], parameters(tiny_model)[k])]
    assert moved
    for name, value in results[False].items():
        assert torch.allclose(results[True][name], value, atol=1e-5, rtol=1e-4), name


def test_warm_start_order_is_one_epoch_in_short_runs_per_harness():
    from harnessrl.rl.schedules import sft_order

    samples = [UpdateSample([i, i + 1], [0, 1], [0.0, 0.0]) for i in range(12)]
    harnesses = ["B", "A", "C", "A", "B", "C", "A", "B", "C", "A", "B", "C"]
    order = sft_order(samples, harnesses, seed=1, chunk=2)
    assert sorted(id(s) for s in order) == sorted(id(s) for s in samples)  # each once
    names = [harnesses[samples.index(s)] for s in order]
    runs, length = [], 0
    for i, name in enumerate(names):
        length = length + 1 if i and names[i - 1] == name else 1
        runs.append(length)
    assert max(runs) <= 4 and runs.count(2) >= 3  # pairs share a prompt; no harness dominates a stretch
    assert names[:4] != ["A", "A", "A", "A"] and len(set(names[:6])) >= 2
    assert sft_order(samples, harnesses, seed=1, chunk=2) == order
    assert sft_order(samples, harnesses, seed=2, chunk=2) != order
    shuffled = sft_order(samples, harnesses, seed=1)  # chunk 1: a plain seeded shuffle
    assert sorted(id(s) for s in shuffled) == sorted(id(s) for s in samples) and shuffled != samples
