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


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path | None]:
    """Returns (checkpoint folder, run folder or None) for a checkpoint folder or a run folder
    (whose newest complete checkpoint is used); raises ``FileNotFoundError`` naming the fix."""
    path = Path(path)
    if (path / "model").is_dir() and (path / STATE_FILE).exists():
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
        return path, run_dir
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        raise FileNotFoundError(
            f"{path}: no checkpoint here; pass a run directory with checkpoints/step-*/ "
            "or one checkpoint folder (it holds model/ and trainer_state.json)"
        )
    return checkpoint, path


def load_checkpoint_policy(path: str | Path, device: str = "auto", dtype: str = "auto") -> tuple[Any, dict[str, Any]]:
    """Returns (policy, run config as a dict, or {}) for a run's checkpoint.

    A full fine-tune checkpoint loads as it is; a LoRA checkpoint (``adapter_config.json``)
    loads its base model (the run config's ``model``, else the adapter's own record of it)
    and merges the adapter into it for evaluation.
    """
    from harnessrl.policy.hf import HFPolicy

    checkpoint, run_dir = resolve_checkpoint(path)
    config: dict[str, Any] = {}
    if run_dir is not None and (run_dir / "config.json").exists():
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    model_dir = checkpoint / "model"
    adapter = model_dir / "adapter_config.json"
    if not adapter.exists():
        policy = HFPolicy(str(model_dir), device=device, dtype=dtype)
    else:
        try:
            from peft import PeftModel
        except ImportError:
            raise ValueError(f"{checkpoint} holds a LoRA adapter; loading it needs peft: pip install 'harnessrl[lora]'") from None
        base = config.get("model") or json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        policy = HFPolicy(None if base in (None, "embedded") else base, device=device, dtype=dtype)
        policy.model = PeftModel.from_pretrained(policy.model, str(model_dir)).merge_and_unload().eval()
    policy.name = f"checkpoint:{checkpoint.parent.parent.name if run_dir else checkpoint.name}/{checkpoint.name}"
    return policy, config
