"""What RL taught one run: the change of its first-pass training reward from the first quarter
of its steps to the last (with an interval over tasks), the same change on the tasks drawn in
both halves, and how far its updates moved the weights relative to the model they started from;
per (arm, seed) of an experiment and as the comparison's table of them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

GROUPS_KEY = "sampling/first_pass_groups"  # per step: [[task, mean reward], ...] of the first pass


def _task_means(records: list[dict[str, Any]]) -> dict[str, float]:
    """Returns each task's mean first-pass reward over the groups of ``records``."""
    rewards: dict[str, list[float]] = {}
    for record in records:
        for task, reward in record.get(GROUPS_KEY) or []:
            rewards.setdefault(task, []).append(float(reward))
    return {task: float(np.mean(values)) for task, values in rewards.items()}


def _parts(records: list[dict[str, Any]], share: float
           ) -> tuple[int, int, dict[str, float], dict[str, float]] | None:
    """Returns (steps with groups, steps per part, each task's mean first-pass reward in the
    first ``share`` of those steps, the same in the last ``share``), or None below 2 steps."""
    steps = sorted({r["step"] for r in records if r.get(GROUPS_KEY)})
    if len(steps) < 2:
        return None
    n = max(1, math.floor(len(steps) * share))
    first = _task_means([r for r in records if r.get("step") in set(steps[:n])])
    last = _task_means([r for r in records if r.get("step") in set(steps[-n:])])
    return len(steps), n, first, last


def reward_gain(records: list[dict[str, Any]], share: float = 0.25, n_boot: int = 2000,
                seed: int = 0) -> dict[str, Any] | None:
    """Returns the mean first-pass reward of the last ``share`` of a run's RL steps minus that
    of the first ``share``, each a mean over tasks of the task's mean reward there, with the
    95% percentile bootstrap interval that resamples the tasks of each part independently (a
    task seen in both parts is resampled in each). None when the records carry no groups
    (runs written before the groups were logged, or fewer than 2 steps).

    The tasks of both parts come from one definition (the sampler's first pass: the frontier's
    draws when it is on), so the difference is the policy's, not a change of what is measured;
    with the frontier on, the drawn tasks move toward pass rate 1/2 as estimates settle, which
    this difference does not correct for (the held-out curve is the measure free of it)."""
    parts = _parts(records, share)
    if parts is None:
        return None
    steps, n, first, last = parts
    a, b = np.asarray(list(first.values())), np.asarray(list(last.values()))
    rng = np.random.default_rng(seed)
    draws = (rng.choice(b, size=(n_boot, b.size)).mean(axis=1) - rng.choice(a, size=(n_boot, a.size)).mean(axis=1))
    return {"steps": steps, "steps_per_part": n, "first": float(a.mean()), "last": float(b.mean()),
            "gain": float(b.mean() - a.mean()), "ci": [float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))],
            "tasks_first": int(a.size), "tasks_last": int(b.size)}


def same_task_gain(records: list[dict[str, Any]], share: float = 0.5, n_boot: int = 2000,
                   seed: int = 0) -> dict[str, Any] | None:
    """Returns the training reward's change on the same tasks: for each task drawn in both the
    first and the last ``share`` of a run's RL steps, its mean first-pass reward in the last part
    minus that in the first; the mean over those tasks, with the 95% percentile bootstrap
    interval that resamples the tasks (each task's pair stays together). None when fewer than 2
    tasks appear in both parts.

    ``reward_gain`` compares whatever tasks each part drew; with the frontier on, the draws move
    toward tasks whose estimated pass rate is near 1/2 as the estimates settle, so a policy that
    learned can show a flat training reward there. Holding the task fixed takes that selection
    out (at the cost of fewer tasks: those drawn twice, far apart; a half instead of a quarter
    keeps enough of them). It leans low: the frontier stops drawing a task once it is always
    solved, so the tasks RL taught best are the likeliest to be missing from the last part."""
    parts = _parts(records, share)
    if parts is None:
        return None
    _, n, first, last = parts
    both = sorted(set(first) & set(last))
    if len(both) < 2:
        return None
    diffs = np.asarray([last[task] - first[task] for task in both])
    rng = np.random.default_rng(seed)
    draws = rng.choice(diffs, size=(n_boot, diffs.size)).mean(axis=1)
    return {"steps_per_part": n, "tasks": int(diffs.size), "first": float(np.mean([first[t] for t in both])),
            "last": float(np.mean([last[t] for t in both])), "gain": float(diffs.mean()),
            "ci": [float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))]}


def _weights(model_dir: Path) -> dict[str, Any] | None:
    """Returns the float32 tensors of a full model folder (None for an adapter or a folder
    without safetensors weights)."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("model*.safetensors"))
    if not files:
        return None
    tensors: dict[str, Any] = {}
    for path in files:
        tensors.update({name: t.float() for name, t in load_file(str(path)).items()})
    return tensors


def _lora_delta_sq(adapter_dir: Path) -> float | None:
    """Returns ||W_merged - W_base||^2 of a LoRA adapter folder (every adapted module's
    ``scale * B @ A``, scale ``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA), or None when the
    folder holds no plain LoRA adapter (DoRA or per-module rank / alpha patterns: not computed)."""
    from safetensors.torch import load_file

    config_path, weights_path = adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"
    if not (config_path.is_file() and weights_path.is_file()):
        return None
    config = json.loads(config_path.read_text())
    if config.get("peft_type") != "LORA" or config.get("use_dora") or config.get("rank_pattern") \
            or config.get("alpha_pattern"):
        return None
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    tensors = load_file(str(weights_path))
    total = 0.0
    for name, a in tensors.items():
        if name.endswith(".lora_A.weight"):
            b = tensors[name.removesuffix(".lora_A.weight") + ".lora_B.weight"]
            total += float(((scale * b.float() @ a.float()) ** 2).sum())
    return total


def relative_movement(model_dir: str | Path, start_dir: str | Path) -> float | None:
    """Returns ||W - W_start|| / ||W_start|| over every tensor the two full models share
    (Frobenius norms of all weights together; a tied embedding counted once). A LoRA checkpoint
    trained over ``start_dir`` moves the merged weights by its adapters' ``scale * B @ A``
    (``_lora_delta_sq``), measured against all of the start's weights. None when the start
    holds no full weights or the checkpoint is neither."""
    import torch

    moved, start = _weights(Path(model_dir)), _weights(Path(start_dir))
    if start is None:
        return None
    if moved is None:
        delta_sq = _lora_delta_sq(Path(model_dir))
        norm = sum(float(torch.sum(t ** 2)) for t in start.values())
        return math.sqrt(delta_sq / norm) if delta_sq is not None and norm else None
    shared = sorted(set(moved) & set(start))
    if not shared:
        return None
    diff = sum(float(torch.sum((moved[name] - start[name]) ** 2)) for name in shared)
    norm = sum(float(torch.sum(start[name] ** 2)) for name in shared)
    return math.sqrt(diff / norm) if norm else None


def final_model_dir(run_dir: str | Path) -> Path | None:
    """Returns the model folder of a run's latest checkpoint, or None."""
    checkpoints = sorted((Path(run_dir) / "checkpoints").glob("step-*/model"))
    return checkpoints[-1] if checkpoints else None


def learned(out: Path, arm: str, marker: dict[str, Any]) -> dict[str, Any]:
    """Returns what RL taught one (arm, seed): the first-pass reward's change from the first
    quarter of steps to the last (with its interval over tasks), the same on the tasks drawn in
    both halves, and the weights' relative movement from the model it started from, beside the
    warm start's own from the base model."""
    from harnessrl.eval.report import read_jsonl_records
    from harnessrl.experiment.spec import warm_start_dir, warm_start_model

    run = out / "arms" / f"{arm}-seed{marker['seed']}"
    warm = warm_start_dir(out, marker["seed"]) / "warm_start.json"
    final = final_model_dir(run)
    start = warm_start_model(out, marker["seed"]) if warm.exists() else Path(marker["config"]["model"] or "")
    records = read_jsonl_records(run / "metrics.jsonl")
    row: dict[str, Any] = {"seed": marker["seed"], "reward": reward_gain(records), "same_tasks": same_task_gain(records),
                           "moved": relative_movement(final, start) if final and start.is_dir() else None,
                           "warm_start_moved": None}
    if warm.exists() and start.is_dir():  # the shared warm start against the model it started from
        from harnessrl.policy.embedded import resolve_model_path

        base = json.loads(warm.read_text(encoding="utf-8"))["config"].get("model")
        row["warm_start_moved"] = relative_movement(start, resolve_model_path(base))
    return row


def learning_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Returns the table of what RL taught each (RL arm, seed): the mean first-pass reward of
    the first and last quarter of steps, their difference with its 95% interval over tasks,
    the same difference on the tasks drawn in both halves, and the relative weight movement
    under RL against the warm start's."""
    headers = ["arm", "seed", "RL steps (per quarter)", "first-pass reward, first quarter", "last quarter",
               "difference [95% CI over tasks]", "same tasks, first half → last half [95% CI] (tasks)",
               "‖W − W_start‖ / ‖W_start‖ (RL)", "(warm start, from the base)"]
    rows = []
    for r in result["arms"]:
        for entry in r.get("learning") or []:
            gain, same = entry.get("reward"), entry.get("same_tasks")
            cells = ["-"] * 4 if gain is None else [
                f"{gain['steps']} ({gain['steps_per_part']})", f"{gain['first']:.3f}", f"{gain['last']:.3f}",
                f"{gain['gain']:+.3f} [{gain['ci'][0]:+.3f}, {gain['ci'][1]:+.3f}]"]
            cells.append("-" if same is None else
                         f"{same['gain']:+.3f} [{same['ci'][0]:+.3f}, {same['ci'][1]:+.3f}] ({same['tasks']})")
            rows.append([r["arm"], entry["seed"], *cells,
                         *[f"{entry[k]:.2e}" if entry.get(k) is not None else "-" for k in ("moved", "warm_start_moved")]])
    return headers, rows
