"""Checkpoints: model (or adapter), optimizer, scheduler, step and random states, written atomically.

A checkpoint is a folder ``step-000042`` written as ``.tmp-step-000042`` and renamed into
place only when complete (``os.replace`` is atomic on one filesystem), so a run killed with
SIGKILL mid-write leaves the previous checkpoint intact and resume loses at most the step
in flight.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.json"


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep: int = 2,
    extra_modules: dict[str, torch.nn.Module] | None = None,
) -> Path:
    """Writes checkpoint ``step`` (the number of completed steps) and prunes old ones; returns its path."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict() if scheduler else None, "rng": _rng_state()},
        tmp / "optim.pt",
    )
    for name, module in (extra_modules or {}).items():
        torch.save(module.state_dict(), tmp / f"{name}.pt")
    (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Returns the newest complete checkpoint of a run, or None."""
    root = Path(run_dir) / "checkpoints"
    complete = [p for p in sorted(root.glob("step-*")) if (p / STATE_FILE).exists() and (p / "optim.pt").exists()]
    return complete[-1] if complete else None


def load_training_state(
    checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict[str, Any]:
    """Restores optimizer, scheduler and random states; returns the saved trainer state."""
    blob = torch.load(checkpoint / "optim.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob.get("scheduler") is not None:
        scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
