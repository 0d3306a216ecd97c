"""Checkpoints: model (or adapter), optimizer, scheduler, step and random states, crash-safe.

A checkpoint is a folder ``step-000042``. It is written as ``.tmp-step-000042`` (every file
fsynced, ``manifest.json`` listing each file and its size written last), then renamed into
place. Saving a step that already exists first renames the old folder to
``.old-step-000042``, then the new one into place, then removes the old one: at every
moment one complete copy exists, so a run killed with SIGKILL anywhere in the save path
keeps its last complete checkpoint. ``restate_checkpoint`` (the final evaluation's record,
written after the optimizer is gone) places a new trainer state the same way, its other
files hard links to the checkpoint's. ``latest_checkpoint`` only returns a
folder that holds every file the loader needs, and considers a complete copy stranded in a
``.tmp-``/``.old-`` folder; ``recover_checkpoints`` (run by a resuming trainer, the folder's
only writer) moves such a copy into place and removes what is incomplete or superseded.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harnessrl.diskio import DiskFull, write_text_atomic

STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
OPTIMIZER_FILE = "optim.pt"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "adapter_model.safetensors", "adapter_model.bin")
MODEL_CONFIG_FILES = ("config.json", "adapter_config.json")
# Folder name -> (step, rank): a placed checkpoint outranks a new copy, which outranks an old one.
_FOLDER = re.compile(r"^(?P<prefix>\.tmp-|\.old-|\.trash-)?step-(?P<step>\d+)$")
_RANK = {None: 2, ".tmp-": 1, ".old-": 0}


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


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_synced(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    _fsync(path)


def _manifest(folder: Path) -> dict[str, int]:
    """Returns every file under ``folder`` (relative path -> size), fsyncing each and each
    folder on the way, so that what the manifest lists is on disk before it is."""
    files: dict[str, int] = {}
    for directory, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            path = Path(directory) / name
            _fsync(path)
            files[path.relative_to(folder).as_posix()] = path.stat().st_size
        _fsync(Path(directory))
    return files


def checkpoint_is_complete(folder: Path) -> bool:
    """Returns whether ``folder`` holds every file a resume or an evaluation loads: the
    trainer state, the optimizer state, the model's config and weights (with a manifest,
    each file it lists at its recorded size; without one, a checkpoint written before
    manifests existed, each of those files present and non-empty)."""
    manifest = folder / MANIFEST_FILE
    if manifest.is_file():
        try:
            files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
            present = all((folder / name).is_file() and (folder / name).stat().st_size == size for name, size in files.items())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        names = set(files)
    else:
        names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.stat().st_size > 0}
        present = True
    return (
        present
        and {STATE_FILE, OPTIMIZER_FILE} <= names
        and any(f"model/{name}" in names for name in MODEL_CONFIG_FILES)
        and any(f"model/{name}" in names for name in WEIGHT_FILES)
    )


def _write_checkpoint(tmp: Path, step: int, model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer,
                      scheduler: Any, state: dict[str, Any], extra_modules: dict[str, torch.nn.Module] | None,
                      model_state: dict[str, torch.Tensor] | None, optimizer_state: dict[str, Any] | None) -> None:
    """Writes every file of checkpoint ``step`` into the folder ``tmp`` (see `save_checkpoint`)."""
    model.save_pretrained(tmp / "model", safe_serialization=True, **({"state_dict": model_state} if model_state else {}))
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {"optimizer": optimizer_state or optimizer.state_dict(), "scheduler": scheduler.state_dict() if scheduler else None, "rng": _rng_state()},
        tmp / OPTIMIZER_FILE,
    )
    for module_name, module in (extra_modules or {}).items():
        torch.save(module.state_dict(), tmp / f"{module_name}.pt")
    (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2), encoding="utf-8")
    _write_synced(tmp / MANIFEST_FILE, json.dumps({"step": step, "files": _manifest(tmp)}, indent=2))
    _fsync(tmp)


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
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Writes checkpoint ``step`` (the number of completed steps), replacing an existing one of
    the same step without ever leaving none, and prunes all but the newest ``keep``; returns
    its path. ``model_state`` and ``optimizer_state`` replace ``model.state_dict()`` and
    ``optimizer.state_dict()`` (the full states gathered from a sharded model:
    ``rl.distributed``), so the files are the same whatever the world size."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final, tmp, old = root / name, root / f".tmp-{name}", root / f".old-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)  # an unfinished earlier attempt at this step
    tmp.mkdir()
    try:
        _write_checkpoint(tmp, step, model, tokenizer, optimizer, scheduler, state, extra_modules, model_state,
                          optimizer_state)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk keeps the space it had, not half a checkpoint
        raise
    _place(tmp, final, old)
    _prune(root, keep)
    return final


def restate_checkpoint(run_dir: str | Path, step: int, state: dict[str, Any]) -> Path:
    """Replaces the trainer state of the placed checkpoint ``step`` with ``state`` and returns
    its path. Needs neither the model nor the optimizer (the final evaluation's record, written
    after `Actor.release_training_state`): the new copy's other files are hard links to the
    checkpoint's (copies where the file system has none), and it is placed as `save_checkpoint`
    places one, so a death anywhere leaves one complete checkpoint of ``step``."""
    root = Path(run_dir) / "checkpoints"
    name = f"step-{step:06d}"
    final, tmp, old = root / name, root / f".tmp-{name}", root / f".old-{name}"
    if not checkpoint_is_complete(final):
        raise FileNotFoundError(f"no complete checkpoint {final} to record the trainer state in")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        for source in sorted(final.rglob("*")):
            relative = source.relative_to(final)
            if source.is_dir() or relative.as_posix() in (STATE_FILE, MANIFEST_FILE):
                continue
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, tmp / relative)
            except OSError:
                shutil.copy2(source, tmp / relative)
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=2), encoding="utf-8")
        _write_synced(tmp / MANIFEST_FILE, json.dumps({"step": step, "files": _manifest(tmp)}, indent=2))
        _fsync(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _place(tmp, final, old)
    return final


def _place(tmp: Path, final: Path, old: Path) -> None:
    """Renames the complete copy ``tmp`` to ``final``, an existing ``final`` first to ``old``
    (removed last), so that one complete copy exists at every moment."""
    if final.exists():
        if old.exists():
            shutil.rmtree(old)  # superseded long ago: ``final`` is complete
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync(final.parent)
    if old.exists():
        shutil.rmtree(old)


def _placed(root: Path) -> list[tuple[int, Path]]:
    """Returns the complete checkpoints in place (``step-*``), oldest first."""
    out = []
    for path in root.glob("step-*"):
        match = _FOLDER.match(path.name)
        if match and path.is_dir() and checkpoint_is_complete(path):
            out.append((int(match["step"]), path))
    return sorted(out)


def _prune(root: Path, keep: int) -> None:
    """Removes every checkpoint older than the newest ``keep`` complete ones; each is renamed
    out of ``step-*`` first, so none is ever seen half deleted."""
    placed = _placed(root)
    if not placed:
        return
    kept = {path for _, path in placed[-keep:]}
    oldest_kept = placed[-keep:][0][0]
    for path in sorted(root.glob("step-*")):
        match = _FOLDER.match(path.name)
        if match and path not in kept and int(match["step"]) < oldest_kept:
            trash = root / f".trash-{path.name}"
            if trash.exists():
                shutil.rmtree(trash)
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)


def checkpoint_bytes(run_dir: str | Path) -> int | None:
    """Returns the size of the newest complete checkpoint of ``run_dir`` (what the next one
    needs, about), or None when there is none."""
    placed = _placed(Path(run_dir) / "checkpoints")
    if not placed:
        return None
    return sum(f.stat().st_size for f in placed[-1][1].rglob("*") if f.is_file())


def weights_fingerprint(model_dir: str | Path) -> str:
    """Returns a SHA-256 over the tensors of a saved model's safetensors files (names, dtypes,
    shapes and bytes, in name order): equal for the same weights however the files were written,
    so two trainings can be checked for bit-identical results."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no safetensors weights to fingerprint")
    digest = hashlib.sha256()
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for name in sorted(weights.keys()):
                tensor = weights.get_tensor(name)
                digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
                digest.update(tensor.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def disk_full_error(run_dir: str | Path, exc: BaseException, model: Any = None) -> DiskFull:
    """Returns the `DiskFull` a full disk during training becomes: the run folder, the space
    left and needed (the last checkpoint's size, else ``model``'s weights and two optimizer
    moments, or the failed write's if larger), and where a rerun resumes."""
    latest = latest_checkpoint(run_dir)
    estimate = checkpoint_bytes(run_dir)
    if estimate is None and model is not None:
        estimate = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
    needed = max(estimate or 0, getattr(exc, "needed", None) or 0) or None
    where = f"checkpoint {latest.name}" if latest is not None else "the start (no checkpoint was written)"
    return DiskFull(run_dir, needed=needed,
                    hint=f"free space and run the same command again; it resumes from {where}")


def prepare_run_dir(
    run_dir: Path, resume: bool, config_json: str, parallel: Any, log: Callable[[str], None],
) -> Path | None:
    """Makes ``run_dir`` ready for a run and returns the checkpoint it resumes from (None: from
    step 0). Resuming repairs what a kill mid-save left (``recover_checkpoints``; this trainer
    is the folder's only writer); a new run refuses a folder that is not empty. Rank 0 writes
    the run's ``config.json``; under torchrun every rank has looked first (``parallel``)."""
    main = parallel is None or parallel.is_main
    if resume:
        for message in recover_checkpoints(run_dir):
            log(f"checkpoints: {message}")
    checkpoint = latest_checkpoint(run_dir)
    if resume and checkpoint is None and run_dir.exists():
        log(f"no complete checkpoint in {run_dir}: starting from step 0")
    if not resume and run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(f"run directory {run_dir} is not empty; pass --resume to continue it or --run-dir for a new run")
    if parallel is not None:
        parallel.barrier()  # every rank has looked at the directory before rank 0 fills it
    run_dir.mkdir(parents=True, exist_ok=True)
    if main:
        write_text_atomic(run_dir / "config.json", config_json)
    return checkpoint if resume else None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Returns the newest complete checkpoint of a run (see ``checkpoint_is_complete``), or
    None. A step whose folder is missing or incomplete but has a complete copy stranded by
    a kill mid-save (``.tmp-step-*``, else ``.old-step-*``) returns that copy."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    best: tuple[int, int, Path] | None = None
    for path in root.iterdir():
        match = _FOLDER.match(path.name)
        if not match or match["prefix"] == ".trash-" or not path.is_dir():
            continue
        key = (int(match["step"]), _RANK[match["prefix"]], path)
        if (best is None or key[:2] > best[:2]) and checkpoint_is_complete(path):
            best = key
    return best[2] if best else None


def recover_checkpoints(run_dir: str | Path) -> list[str]:
    """Repairs what a kill mid-save left in a run's checkpoints (call it only from the run's
    writer, before it resumes): a step with no complete folder gets its newest complete
    stranded copy moved into place; stranded copies that are incomplete or superseded, and
    half-pruned folders, are removed. Returns one message per action."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    messages = []
    stranded: dict[int, list[Path]] = {}
    for path in sorted(root.iterdir()):
        match = _FOLDER.match(path.name)
        if match and match["prefix"] == ".trash-":
            shutil.rmtree(path, ignore_errors=True)
            messages.append(f"removed {path} (a checkpoint being pruned when the run stopped)")
        elif match and match["prefix"] is not None:
            stranded.setdefault(int(match["step"]), []).append(path)
    for step, paths in sorted(stranded.items()):
        final = root / f"step-{step:06d}"
        if not (final.is_dir() and checkpoint_is_complete(final)):
            copies = sorted((p for p in paths if checkpoint_is_complete(p)), key=lambda p: -_RANK[_FOLDER.match(p.name)["prefix"]])
            if copies:
                if final.exists():
                    shutil.rmtree(final)
                    messages.append(f"removed {final} (incomplete)")
                os.rename(copies[0], final)
                _fsync(root)
                paths = [p for p in paths if p != copies[0]]
                messages.append(f"recovered {final.name} from {copies[0]} (the run stopped while saving it)")
        for path in paths:
            complete = checkpoint_is_complete(path)
            shutil.rmtree(path)
            reason = f"{final.name} is complete" if complete else "incomplete"
            messages.append(f"removed {path} ({reason}: left by a run that stopped while saving)")
    return messages


def load_training_state(
    checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler: Any,
    shard_optimizer_state: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Restores optimizer, scheduler and random states; returns the saved trainer state.
    ``shard_optimizer_state`` maps the saved full optimizer state to this rank's shards first
    (a sharded model: ``rl.distributed.DataParallel.shard_optimizer_state``)."""
    blob = torch.load(checkpoint / OPTIMIZER_FILE, map_location="cpu", weights_only=False)
    full = blob["optimizer"]
    optimizer.load_state_dict(shard_optimizer_state(full) if shard_optimizer_state is not None else full)
    if scheduler is not None and blob.get("scheduler") is not None:
        scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path | None]:
    """Returns (checkpoint folder, run folder or None) for a checkpoint folder or a run folder
    (whose newest complete checkpoint is used); raises ``FileNotFoundError`` naming the fix."""
    path = Path(path)
    if (path / "model").is_dir() and (path / STATE_FILE).exists():
        if not checkpoint_is_complete(path):
            raise FileNotFoundError(
                f"{path}: an incomplete checkpoint (a file the loader needs is missing or cut short); "
                "pass its run directory to use the newest complete one"
            )
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
        return path, run_dir
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        raise FileNotFoundError(
            f"{path}: no checkpoint here; pass a run directory with checkpoints/step-*/ "
            "or one checkpoint folder (it holds model/ and trainer_state.json)"
        )
    return checkpoint, path


def load_checkpoint_policy(
    path: str | Path, device: str = "auto", dtype: str = "auto", merge_adapter: bool = True
) -> tuple[Any, dict[str, Any]]:
    """Returns (policy, run config as a dict, or {}) for a run's checkpoint, named
    ``checkpoint:<run>/<step>``.

    A full fine-tune checkpoint loads as it is; a LoRA checkpoint (``adapter_config.json``)
    loads its base model (the run config's ``model``, else the adapter's own record of it)
    and merges the adapter into it (``merge_adapter``: evaluation), or samples through the
    unmerged adapter (``harnessrl serve``: no merged copy of the weights is written or held).
    The policy attends as the run did (its config's ``attention_kernels``).
    """
    from harnessrl.policy.hf import HFPolicy

    checkpoint, run_dir = resolve_checkpoint(path)
    config: dict[str, Any] = {}
    if run_dir is not None and (run_dir / "config.json").exists():
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    model_dir = checkpoint / "model"
    adapter = model_dir / "adapter_config.json"
    kernels = config.get("attention_kernels")
    attention = {"decode_kernel": kernels, "prefill_kernel": kernels}
    if not adapter.exists():
        policy = HFPolicy(str(model_dir), device=device, dtype=dtype, **attention)
    else:
        try:
            from peft import PeftModel
        except ImportError:
            raise ValueError(f"{checkpoint} holds a LoRA adapter; loading it needs peft: pip install 'harnessrl[lora]'") from None
        base = config.get("model") or json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        policy = HFPolicy(None if base in (None, "embedded") else base, device=device, dtype=dtype, **attention)
        adapted = PeftModel.from_pretrained(policy.model, str(model_dir))
        policy.model = (adapted.merge_and_unload() if merge_adapter else adapted).eval()
    policy.name = f"checkpoint:{checkpoint.parent.parent.name if run_dir else checkpoint.name}/{checkpoint.name}"
    return policy, config
