"""Writes the parquet files of the recipe: 300 steps x 16 tasks of the workspace suite, K=2
neighbour pairing over the orthogonal design's append-only (C0) configurations, one row per
(task, harness) in step order; and a small validation file from the test split."""

from __future__ import annotations

import sys
from pathlib import Path

from harnessrl.integrations.verl.dataset import build_dataset, write_parquet

out = Path(sys.argv[1] if len(sys.argv) > 1 else "data/harnessrl-verl")
train = build_dataset("workspace", "train", design="orthogonal", n_steps=300, tasks_per_step=16, k=2,
                      seed=0, append_only="keep-c0")
val = build_dataset("workspace", "test", n_tasks=32, design="orthogonal", n_steps=1, tasks_per_step=32, k=2,
                    seed=0, append_only="keep-c0")
print(write_parquet(train, out / "train.parquet"), len(train), "rows")
print(write_parquet(val, out / "val.parquet"), len(val), "rows")
