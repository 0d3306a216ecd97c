"""The trainer's numbers against values recorded before a change (issue 26: restructuring keeps
behaviour bit for bit): seeded tiny-model SFT, GRPO, PPO and rescue runs, each with a scripted
reward so that every path has signal, compared metric by metric and by a digest of the final
weights with `tests/golden/trainer_recorded.json`.

float32 kernels round differently on different CPUs (AMX, AVX-512, AVX2) and thread counts, so
the record is keyed by a fingerprint of the machine class; on a recorded class the numbers must
be identical. On another, the sampled tokens (and so the scripted rewards) part ways with the
record at the first token rounding changes, so the test checks what it can: the run repeats
exactly (metrics and weights), it has the recorded shape, and it warns that identity was not
checked. ``HARNESSRL_RECORD_TRAINER=1`` adds this machine's
record: do it only on code whose behaviour is the one to keep. The three records were made at
ac51daf, before the restructuring (AMD EPYC with AVX2 on 2026-12-04 05:35; AMD EPYC with AVX-512
later that day, and an Intel Xeon with AMX on 2026-12-05, from this file run against a checkout
of ac51daf).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.rl.config import load_config  # noqa: E402
from harnessrl.rl.loop import train  # noqa: E402
from harnessrl.rollout.episode import Episode  # noqa: E402

RECORD = Path(__file__).parent / "golden" / "trainer_recorded.json"
# Keys that measure the machine, not the algorithm.
UNRECORDED = ("time", "memory/", "tok_s", "per_s", "wall", "rss")

BASE = {
    "steps": 2, "tasks_per_step": 2, "group_size": 2, "max_turns": 1, "max_new_tokens": 8,
    "max_train_tasks": 6, "sft_warm_start_steps": 1, "sft_tasks": 2, "eval_base": False, "eval_tasks": 1,
    "eval_held_out": 1, "eval_out_of_space": False, "micro_batch_tokens": 4096, "learning_rate": 1e-3,
    "temperature": 1.0, "seed": 11, "save_every": 1, "keep_checkpoints": 1, "deterministic": True,
    # recorded before the quick preset turned it on; it moves the attention backward's rounding
    # (tests/test_causal_mask_only.py)
    "causal_mask_only": False,
}
RUNS = {
    "sft": {"objective": "sft", "sft_warm_start_steps": 2, "sft_tasks": 4},
    "grpo": {"kl_coef": 0.05, "entropy_coef": 0.01},
    "ppo": {"algorithm": "ppo", "group_size": 1, "tasks_per_step": 3, "max_turns": 2, "skip_no_signal_groups": False},
    "rescue": {"design": "single", "base_harness": "S0-T0-O0-C0-W0", "k": 1, "rescue": "siblings", "rescue_k": 2,
               "rescue_validation_tasks": 1, "reanchor_every": 2, "sft_warm_start_steps": 0},
}


def machine_class() -> str:
    """The float32 kernels' identity: CPU vendor, torch's vector capability, threads, torch."""
    vendor = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{vendor}/{platform.machine()}/{capability}/threads-1/torch-{torch.__version__.split('+')[0]}"


@pytest.fixture
def scripted_reward(monkeypatch):
    """Every episode's reward becomes the parity of its sampled token ids: a deterministic
    function of what the policy sampled, mixed within most groups (a random tiny model solves
    nothing, so a real verifier would leave every path without signal)."""
    finish = Episode.finish

    def scripted(self, policy_name: str = ""):
        trajectory = finish(self, policy_name)
        ids = [i for turn in trajectory.turns for i in turn.completion_ids]
        trajectory.passed = sum(ids) % 2 == 0
        trajectory.reward = float(trajectory.passed)
        return trajectory

    monkeypatch.setattr(Episode, "finish", scripted)


def recorded_values(value):
    """``value`` with the machine-dependent keys of every metrics record left out."""
    if isinstance(value, dict):
        return {k: recorded_values(v) for k, v in sorted(value.items()) if not any(u in k for u in UNRECORDED)}
    if isinstance(value, list):
        return [recorded_values(v) for v in value]
    return value


def weights_digest(folder: Path) -> dict[str, object]:
    """The sha256 of every tensor's bytes in name order, and their float sum (for a tolerance)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder / "model", dtype=torch.float32)
    tensors = dict(model.state_dict())
    head = folder / "value_head.pt"
    if head.exists():
        tensors.update({f"value_head.{k}": v for k, v in torch.load(head).items()})
    digest = hashlib.sha256()
    total = 0.0
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().float()
        digest.update(name.encode() + tensor.numpy().tobytes())
        total += float(tensor.double().abs().sum())
    return {"sha256": digest.hexdigest(), "abs_sum": total}


def run_values(name: str, model: Path, run_dir: Path, **extra: object) -> dict[str, object]:
    cfg = load_config(preset="quick", overrides={**BASE, **RUNS[name], **extra, "model": str(model),
                                                 "run_dir": str(run_dir)})
    summary = train(cfg, log=lambda message: None)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = sorted((run_dir / "checkpoints").iterdir())[-1]
    state = json.loads((final / "trainer_state.json").read_text())
    return {"metrics": recorded_values(metrics), "warm_start": recorded_values(state.get("warm_start")),
            "pass_at_1": recorded_values(summary.get("pass_at_1")), "weights": weights_digest(final)}


def close(recorded, actual, path: str = "") -> list[str]:
    """Differences beyond float rounding between two recorded values, as readable lines."""
    if isinstance(recorded, dict) and isinstance(actual, dict):
        if set(recorded) != set(actual):
            return [f"{path}: keys differ: {sorted(set(recorded) ^ set(actual))}"]
        return [line for k in recorded for line in close(recorded[k], actual[k], f"{path}.{k}")]
    if isinstance(recorded, list) and isinstance(actual, list):
        if len(recorded) != len(actual):
            return [f"{path}: {len(recorded)} entries recorded, {len(actual)} now"]
        return [line for i, (a, b) in enumerate(zip(recorded, actual, strict=True)) for line in close(a, b, f"{path}[{i}]")]
    if isinstance(recorded, float) and isinstance(actual, (float, int)):
        if math.isnan(recorded) and math.isnan(actual):
            return []
        return [] if math.isclose(recorded, actual, rel_tol=1e-3, abs_tol=1e-5) else [f"{path}: {recorded} -> {actual}"]
    if path.endswith("sha256"):
        return []  # other kernels round the weights' last bits: the abs_sum is compared instead
    return [] if recorded == actual else [f"{path}: {recorded!r} -> {actual!r}"]


def one_thread_run(name: str, model: Path, run_dir: Path, **extra: object) -> dict[str, object]:
    """``run_values`` with one torch thread (the machine class's ``threads-1``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_values(name, model, run_dir, **extra)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_trainer_numbers_match_the_record(name, tiny_model, tmp_path, scripted_reward):
    actual = one_thread_run(name, tiny_model, tmp_path / name)
    # The scripted reward gave every run's update something to learn from.
    assert any(record.get("update/grad_norm", 0) > 0 for record in actual["metrics"])
    records = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    machine = machine_class()
    if os.environ.get("HARNESSRL_RECORD_TRAINER") == "1":
        records.setdefault(machine, {})[name] = actual
        RECORD.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        return
    assert records, f"no record in {RECORD}; make one with HARNESSRL_RECORD_TRAINER=1"
    if name in records.get(machine, {}):
        recorded = records[machine][name]
        assert actual["metrics"] == recorded["metrics"], close(recorded["metrics"], actual["metrics"], "metrics")
        assert actual["warm_start"] == recorded["warm_start"]
        assert actual["pass_at_1"] == recorded["pass_at_1"]
        assert actual["weights"] == recorded["weights"]
        return
    # Another machine class: its kernels round differently, the scripted reward (the parity of
    # sampled ids) flips with the first token that rounding changes, and the runs part ways, so
    # identity with the record cannot be checked here. What can be: the same code gives the same
    # numbers twice on this machine, and the runs have the recorded shape.
    again = one_thread_run(name, tiny_model, tmp_path / f"{name}-again")
    assert again == actual, close(actual, again, "second run")
    recorded_runs = [runs[name] for runs in records.values() if name in runs]
    assert all(len(actual["metrics"]) == len(run["metrics"]) for run in recorded_runs)
    # A step's keys depend on its data (a step whose groups all lost their signal logs
    # update/skipped instead of the update's terms), so the last step's keys must be those of
    # some recorded class, not of one in particular.
    assert sorted(actual["metrics"][-1]) in [sorted(run["metrics"][-1]) for run in recorded_runs]
    warnings.warn(f"{machine} is not a recorded machine class ({', '.join(records)}): checked that the run repeats "
                  "bit for bit, not that it matches the record; HARNESSRL_RECORD_TRAINER=1 on the code before a "
                  "change records this class", stacklevel=1)


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_activation_checkpointing_changes_no_number(name, tiny_model, tmp_path, scripted_reward, monkeypatch):
    """``activation_checkpointing: true`` recomputes the layers in the backward pass: every metric,
    the warm start and the final weights (value head included) are those of the run without it."""
    from harnessrl.rl import actor

    enabled = []
    monkeypatch.setattr(actor, "enable_activation_checkpointing",
                        lambda model, enable=actor.enable_activation_checkpointing: enabled.append(enable(model)))
    plain = one_thread_run(name, tiny_model, tmp_path / "plain", activation_checkpointing=False)
    assert not enabled
    checkpointed = one_thread_run(name, tiny_model, tmp_path / "checkpointed", activation_checkpointing=True)
    assert len(enabled) == 1  # the trained model, once
    assert any(record.get("update/grad_norm", 0) > 0 for record in plain["metrics"])
    assert checkpointed == plain, close(plain, checkpointed, "checkpointed")
