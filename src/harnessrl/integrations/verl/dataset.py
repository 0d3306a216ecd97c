"""The verl dataset of a run: task suite x pairing schedule -> one parquet row per (task, harness).

verl's trainer reads a parquet file through ``RLHFDataset``; every column of a row reaches the
agent loop's ``run`` as a keyword. Each row names the agent loop (``agent_name``), the harness
code, the suite and the task, and where the pairing schedule put it (step, slot, round,
anchor). Rows are written step after step, ``tasks_per_step`` rows per step, so verl's sampler
follows the schedule (K=2 neighbour pairing over the design) when the recipe sets
``data.train_batch_size`` to ``tasks_per_step`` and ``data.shuffle`` to false.

verl trains one sequence per agent-loop call, so a design's configurations whose context is
not append-only (C1, C2) are refused, or, with ``append_only="keep-c0"``, left out (the
schedule then pairs over the design's C0 configurations only).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harnessrl.design import make_design
from harnessrl.harness.harness import Harness
from harnessrl.harness.registry import default_space
from harnessrl.integrations.verl import AGENT_NAME
from harnessrl.integrations.verl.sequence import NotAppendOnly, require_append_only
from harnessrl.pairing import PairingSchedule
from harnessrl.space import HarnessConfig
from harnessrl.tasks.model import Task
from harnessrl.tasks.suite import select_tasks

APPEND_ONLY_CHOICES: tuple[str, ...] = ("refuse", "keep-c0")


def append_only_configs(configs: Sequence[HarnessConfig], append_only: str = "refuse") -> list[HarnessConfig]:
    """Returns the configurations verl can train as one sequence each: all of ``configs`` when
    every one is append-only; otherwise raises ``NotAppendOnly`` (``refuse``) or keeps only the
    append-only ones (``keep-c0``)."""
    if append_only not in APPEND_ONLY_CHOICES:
        raise ValueError(f"unknown append_only {append_only!r}; choose one of {', '.join(APPEND_ONLY_CHOICES)}")
    kept, refused = [], []
    for config in configs:
        try:
            require_append_only(Harness.from_config(config))
            kept.append(config)
        except NotAppendOnly:
            refused.append(config.code)
    if refused and append_only == "refuse":
        raise NotAppendOnly(
            f"{len(refused)} of {len(configs)} design configurations rewrite earlier turns "
            f"({', '.join(refused)}); verl trains one sequence per agent-loop call. Pass "
            "append_only='keep-c0' to pair over the append-only ones only."
        )
    if not kept:
        raise NotAppendOnly("no configuration of the design is append-only; verl cannot train any of them")
    return kept


def build_rows(
    suite: str,
    tasks: Sequence[Task],
    configs: Sequence[HarnessConfig],
    n_steps: int,
    tasks_per_step: int,
    k: int = 2,
    strategy: str = "neighbour",
    seed: int = 0,
    append_only: str = "refuse",
) -> list[dict[str, Any]]:
    """Returns the rows of ``n_steps`` steps of the pairing schedule, in step order."""
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    configs = append_only_configs(configs, append_only)
    by_id = {task.id: task for task in tasks}
    schedule = PairingSchedule(list(by_id), configs, tasks_per_step, k, strategy, seed)
    rows = []
    for step, pairs in enumerate(schedule.steps(n_steps)):
        for pair in pairs:
            task = by_id[pair.task]
            placement = {"step": step, **pair.to_dict()}
            rows.append({
                "data_source": f"harnessrl/{suite}",
                "agent_name": AGENT_NAME,
                # verl filters and logs by the prompt; the harness writes the episode's own messages.
                "prompt": [{"role": "user", "content": task.instruction}],
                "harness": pair.config.code,
                "suite": suite,
                "task_id": task.id,
                "step": step,
                "slot": pair.slot,
                "round": pair.round,
                "anchor": pair.anchor.code,
                "extra_info": {"index": len(rows), **placement},
            })
    return rows


def build_dataset(
    suite: str,
    split: str = "train",
    n_tasks: int | None = None,
    design: str = "orthogonal",
    n_steps: int = 300,
    tasks_per_step: int = 16,
    k: int = 2,
    seed: int = 0,
    append_only: str = "refuse",
) -> list[dict[str, Any]]:
    """Returns the rows for a suite's split under a design (``design.make_design`` kinds)."""
    tasks = select_tasks(suite, split, n_tasks, seed)
    if not tasks:
        raise ValueError(f"suite {suite!r} has no tasks in split {split!r}")
    configs = make_design(default_space(), design, seed=seed).configs
    return build_rows(suite, tasks, configs, n_steps, tasks_per_step, k, "neighbour", seed, append_only)


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Writes ``rows`` as verl's parquet file (needs pandas and pyarrow, which verl installs)."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("writing verl's parquet needs pandas and pyarrow: pip install 'harnessrl[verl]'") from exc
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(list(rows)).to_parquet(path)
    return path
