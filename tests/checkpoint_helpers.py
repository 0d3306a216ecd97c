"""Shared pieces of the checkpoint crash tests: a very small real model, its optimizer, a
child process that saves checkpoints in a loop the way the trainer does (each step saved,
then saved again with more state, as the final evaluation does) until it is killed, and a
real `harnessrl train` process killed with SIGKILL at a chosen moment of its run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from harnessrl.rl.checkpoint import (
    latest_checkpoint,
    load_training_state,
    recover_checkpoints,
    restate_checkpoint,
    save_checkpoint,
)

# transformers imports its models lazily: import them with this module, so that processes
# forked from one that imported it start at once.
_MODEL_CLASSES = (transformers.LlamaConfig, transformers.LlamaForCausalLM, transformers.AutoModelForCausalLM)
MARKED = "model.norm.weight"  # a parameter set to the step number: weights and state must agree


def small_model() -> Any:
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def training_objects(model: Any) -> tuple[torch.optim.Optimizer, Any]:
    """Returns an AdamW optimizer that has taken one step (so it has state) and its scheduler."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    model(input_ids=torch.arange(8).unsqueeze(0)).logits.mean().backward()
    optimizer.step()
    scheduler.step()
    return optimizer, scheduler


def mark(model: Any, step: int) -> None:
    with torch.no_grad():
        model.get_parameter(MARKED).fill_(float(step))


def save_step(run_dir: Path, step: int, model: Any, optimizer: Any, scheduler: Any, resaved: bool) -> None:
    mark(model, step)
    state = {"step": step, "resaved": resaved}
    save_checkpoint(run_dir, step, model, None, optimizer, scheduler, state, keep=2)


def restate_step(run_dir: Path, step: int) -> None:
    """The final evaluation's record: checkpoint ``step``'s trainer state rewritten alone."""
    restate_checkpoint(run_dir, step, {"step": step, "resaved": True})


def save_forever(run_dir: str, acks: Any) -> None:
    """The child: resumes from the run's latest checkpoint (as `--resume` does), then saves
    step after step, each followed by its trainer state alone rewritten (as after a final
    evaluation), acknowledging every save that returned."""
    run = Path(run_dir)
    model = small_model()
    optimizer, scheduler = training_objects(model)
    recover_checkpoints(run)
    checkpoint = latest_checkpoint(run)
    step = 0
    if checkpoint is not None:
        step = int(load_training_state(checkpoint, optimizer, scheduler)["step"])
    acks.send(("ready", step))
    while True:
        step += 1
        save_step(run, step, model, optimizer, scheduler, resaved=False)
        acks.send(("saved", step, False))
        restate_step(run, step)
        acks.send(("saved", step, True))


def check_loadable(checkpoint: Path) -> dict[str, Any]:
    """Loads everything a resume loads from ``checkpoint``; returns its trainer state after
    checking that the weights are those of its step."""
    from safetensors.torch import load_file

    state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    weights = load_file(checkpoint / "model" / "model.safetensors")
    assert torch.all(weights[MARKED] == float(state["step"])), (checkpoint, state)
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint / "model")
    optimizer, scheduler = training_objects(model)
    load_training_state(checkpoint, optimizer, scheduler)
    return state


SRC = Path(__file__).resolve().parents[1] / "src"


def write_run_config(path: Path, overrides: dict[str, Any]) -> Path:
    """Writes a `harnessrl train --config` file of the quick preset with ``overrides``."""
    path.write_text("preset: quick\n" + "".join(f"{k}: {json.dumps(v)}\n" for k, v in overrides.items()))
    return path


def train_command(config_file: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "harnessrl.cli", "train", "--config", str(config_file), "--run-dir", str(run_dir)]


def train_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), **extra}


def kill_train_when(config_file: Path, run_dir: Path, ready: Callable[[], bool], *, env: dict[str, str] | None = None,
                    poll_s: float = 0.2, deadline_s: float = 600) -> None:
    """Starts `harnessrl train` on ``config_file`` into ``run_dir`` and kills it with SIGKILL
    (no chance to clean up) as soon as ``ready()`` holds; fails if the run ends first."""
    process = subprocess.Popen(train_command(config_file, run_dir), env=env or train_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + deadline_s
        while not ready():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.time() < deadline, f"the moment to kill it did not come within {deadline_s:g} s"
            time.sleep(poll_s)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
