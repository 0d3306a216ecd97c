"""Data-parallel training under torchrun (gloo, 2 CPU processes) takes the steps one process takes
(full fine-tuning sharded by FSDP2, LoRA replicated), a job with a rank killed by SIGKILL resumes on
the same schedule, and a checkpoint resumes on another number of processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")
pytest.importorskip("torch.distributed", reason="torch.distributed (gloo) is needed")

from harnessrl.rl.checkpoint import latest_checkpoint  # noqa: E402
from harnessrl.rl.config import load_config  # noqa: E402
from harnessrl.rl.distributed import launch_command, strip_nproc  # noqa: E402
from harnessrl.rl.loop import train  # noqa: E402
from harnessrl.trajectory import load_jsonl  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
STEPS = 3
# Measured (2 FSDP2 processes vs 1, same rollouts; float32 gradients reduce-scattered in another
# order): on an Intel Xeon (2026-12-01) the weights after each step differ by at most 1.3e-8; on
# an AMD EPYC (2026-12-03) all but 55-67 of 1.6M elements differ by at most 7e-7, and those few,
# rows of the tied embedding whose gradients sit near AdamW's eps (where the order of the sums
# decides the step), by up to 8.3e-6: under 1% of one step's move (LEARNING_RATE). A wrong
# reduction (a rank's gradient lost or counted twice) moves most elements by about that move.
# Losses, entropies and gradient norms (float64 sums) agree to relative 1e-6 or better.
WEIGHT_ATOL, LOSS_RTOL = 1e-6, 1e-5
FEW_ELEMENTS_ATOL, FEW_ELEMENTS = 2e-5, 1e-4  # at most this fraction past WEIGHT_ATOL, none past this
LEARNING_RATE = 1e-3


def overrides(model, run_dir, **extra):
    """Two GRPO groups per step (one per rank) and one sample per micro-batch (two per rank).
    One episode at a time and one thread (as in each rank): batching or threading would change
    the logits' last bits, and a near-uniform random model's samples with them.
    A random model earns no reward: a large entropy bonus on every sample gives the update a
    gradient well above AdamW's eps (near eps, the order of the sums would decide the step)."""
    return {
        "model": str(model), "run_dir": str(run_dir), "steps": STEPS, "tasks_per_step": 2, "group_size": 2,
        "max_turns": 1, "max_new_tokens": 8, "max_train_tasks": 8, "sft_warm_start_steps": 1, "sft_tasks": 2,
        "eval_tasks": 1, "eval_held_out": 0, "eval_out_of_space": False, "eval_base": False,
        "micro_batch_tokens": 64, "learning_rate": LEARNING_RATE, "temperature": 1.0, "seed": 3,
        "save_every": 1, "keep_checkpoints": STEPS + 1, "max_concurrent": 1,
        "skip_no_signal_groups": False, "entropy_coef": 100.0, **extra,
    }


def train_one_process(config, resume=False):
    """Runs ``config`` in this process with one thread (as each rank has); returns its log."""
    lines = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(config, resume=resume, log=lines.append)
    finally:
        torch.set_num_threads(threads)
    return "\n".join(lines)


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    """The run in one process (the plain path, no torchrun)."""
    run_dir = tmp_path_factory.mktemp("one-process") / "run"
    train_one_process(load_config(preset="quick", overrides=overrides(tiny_model, run_dir)))
    return run_dir


def torchrun(config_file, run_dir, *extra, via_nproc=False):
    """Starts the 2-process job: torchrun's command, or ``harnessrl train --nproc 2`` (which
    relaunches itself under torchrun)."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    argv = ["--config", str(config_file), "--run-dir", str(run_dir), *extra]
    command = [sys.executable, "-m", "harnessrl.cli", "train", "--nproc", "2", *argv] if via_nproc else launch_command(2, argv)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def write_config(tmp_path, model, run_dir, **extra):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"preset": "quick", **overrides(model, run_dir, **extra)}), encoding="utf-8")
    return path


def checkpoints_up_to(source, target, step):
    """Copies run ``source`` to ``target`` as it was after its checkpoint ``step`` (later ones dropped)."""
    shutil.copytree(source, target)
    for folder in (target / "checkpoints").glob("step-*"):
        if int(folder.name.removeprefix("step-")) > step:
            shutil.rmtree(folder)
    return target


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir, step):
    model = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / f"step-{step:06d}" / "model")
    return {k: v.clone() for k, v in model.state_dict().items()}


def rollout_seeds(run_dir, step):
    return [(t.task_id, t.config, t.seed, [turn.completion_ids for turn in t.turns]) for t in load_jsonl(run_dir / "rollouts" / f"step-{step:06d}.jsonl")]


def assert_same_steps(run_dir, reference_dir):
    ours, theirs = metrics(run_dir), metrics(reference_dir)
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] == list(range(STEPS))
    for mine, one in zip(ours, theirs, strict=True):
        assert mine["pairs"] == one["pairs"] and mine["episodes"] == one["episodes"] == 4
        assert rollout_seeds(run_dir, mine["step"]) == rollout_seeds(reference_dir, one["step"])
        assert mine["reward_mean"] == one["reward_mean"]
        assert mine["trained_samples"] == one["trained_samples"]
        assert mine["update/micro_batches"] == one["update/micro_batches"]
        assert mine["trained_samples"] == 4
        for key in ("update/pg_loss", "update/grad_norm", "update/entropy", "update/policy_tokens"):
            assert mine[key] == pytest.approx(one[key], abs=1e-9, rel=LOSS_RTOL), (mine["step"], key)
    for step in range(STEPS + 1):
        two, one = weights(run_dir, step), weights(reference_dir, step)
        differences = torch.cat([(two[name] - value).abs().reshape(-1) for name, value in one.items()])
        past = int((differences > WEIGHT_ATOL).sum())
        assert past <= FEW_ELEMENTS * differences.numel(), (step, past, float(differences.max()))
        assert float(differences.max()) <= FEW_ELEMENTS_ATOL, (step, float(differences.max()))
    assert any(not torch.equal(weights(reference_dir, 0)[k], v) for k, v in weights(reference_dir, STEPS).items())


@pytest.fixture(scope="module")
def two_processes(tiny_model, tmp_path_factory):
    """The run on 2 processes (``--nproc 2``): its folder and its output."""
    folder = tmp_path_factory.mktemp("two-processes")
    run_dir = folder / "run"
    process = torchrun(write_config(folder, tiny_model, run_dir), run_dir, via_nproc=True)
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output[-3000:]
    return run_dir, output


def test_two_processes_take_the_steps_of_one(two_processes, reference):
    run_dir, output = two_processes
    assert_same_steps(run_dir, reference)
    assert "step 3/3" in output and output.count("step 3/3") == 1  # rank 0 alone logs
    assert "data parallel: 2 processes, model sharded by FSDP2" in output


def test_a_two_process_checkpoint_resumes_on_one_process(tiny_model, two_processes, reference, tmp_path):
    run_dir = checkpoints_up_to(two_processes[0], tmp_path / "resumed", 1)
    log = train_one_process(load_config(preset="quick", overrides=overrides(tiny_model, run_dir)), resume=True)
    assert "(step 1)" in log
    assert_same_steps(run_dir, reference)


def test_a_one_process_checkpoint_resumes_on_two_processes(tiny_model, reference, tmp_path):
    run_dir = checkpoints_up_to(reference, tmp_path / "resumed", 1)
    process = torchrun(write_config(tmp_path, tiny_model, run_dir), run_dir, "--resume")
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output[-3000:]
    assert "(step 1)" in output
    assert_same_steps(run_dir, reference)


def test_lora_adapters_stay_replicated_and_take_the_step_of_one_process(tiny_model, tmp_path):
    lora = {"lora_rank": 4, "steps": 1, "sft_warm_start_steps": 0}
    one_dir, two_dir = tmp_path / "lora-one", tmp_path / "lora-two"
    train_one_process(load_config(preset="quick", overrides=overrides(tiny_model, one_dir, **lora)))
    process = torchrun(write_config(tmp_path, tiny_model, two_dir, **lora), two_dir)
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output[-3000:]
    assert "data parallel: 2 processes, LoRA adapters replicated" in output
    from safetensors.torch import load_file

    adapters = [load_file(run / "checkpoints" / "step-000001" / "model" / "adapter_model.safetensors") for run in (one_dir, two_dir)]
    start = load_file(one_dir / "checkpoints" / "step-000000" / "model" / "adapter_model.safetensors")
    assert set(adapters[0]) == set(adapters[1]) == set(start)
    assert any(not torch.equal(start[name], value) for name, value in adapters[0].items())  # the step trained
    for name, value in adapters[0].items():
        assert float((adapters[1][name] - value).abs().max()) <= WEIGHT_ATOL, name


def descendants(pid):
    """Returns every process below ``pid`` (children of children included)."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with open(task / "children") as handle:
                children = [int(c) for c in handle.read().split()]
            found += children
            frontier += children
    return found


def rank_process(pid, rank):
    for child in descendants(pid):
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"LOCAL_RANK=" + str(rank).encode() in environ:
            return child
    return None


def test_a_job_with_a_rank_killed_resumes_on_the_same_schedule(tiny_model, reference, tmp_path):
    run_dir = tmp_path / "killed"
    config_file = write_config(tmp_path, tiny_model, run_dir)
    process = torchrun(config_file, run_dir)
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "step-000001" / "trainer_state.json").exists():
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the first step did not finish"
        time.sleep(0.2)
    victim = rank_process(process.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    output, _ = process.communicate(timeout=120)
    assert process.returncode != 0, output[-3000:]  # torchrun ends the job when a rank dies
    done = int(latest_checkpoint(run_dir).name.removeprefix("step-"))
    assert 1 <= done < STEPS

    resumed = torchrun(config_file, run_dir, "--resume")
    output, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, output[-3000:]
    assert f"(step {done})" in output  # continued from the last checkpoint, not from scratch
    assert_same_steps(run_dir, reference)


def test_nproc_relaunches_train_under_torchrun_without_the_flag():
    argv = ["--preset", "quick", "--nproc", "2", "--steps", "1", "--nproc=3"]
    assert strip_nproc(argv) == ["--preset", "quick", "--steps", "1"]
    command = launch_command(2, strip_nproc(argv))
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert command[-5:] == ["train", "--preset", "quick", "--steps", "1"]
    with pytest.raises(ValueError, match="at least 2"):
        launch_command(1, [])
