"""Experiment tracking: each record of ``metrics.jsonl`` mirrored to TensorBoard and, offline,
to Weights & Biases (``TrainConfig.report_to``).

``metrics.jsonl`` stays the source of truth: a tracker gets the same keys, flattened
(``eval/in_space/pass_at_1`` for a nested value), as scalars at the record's step, and
each evaluation's table as text. A tracker that was asked for and cannot start is an error
naming the install command (TensorBoard); W&B, which is not a dependency, is skipped with a
logged line when it is not installed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

Logger = Callable[[str], None]


def scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Yields (key, value) for every number in ``record``, nested mappings flattened with
    ``/``; strings, lists and booleans-as-flags are not scalars and are left out."""
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from scalars(value, f"{name}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield name, float(value)


def eval_table(label: str, results: Mapping[str, Any]) -> str:
    """Returns the Markdown table of one evaluation (``Trainer.evaluate``'s result): Pass@1,
    its interval and the episodes per evaluation set."""
    lines = [f"evaluation {label}", "", "| set | Pass@1 | 95% CI | episodes |", "|---|---|---|---|"]
    for name, scores in results.items():
        ci = scores.get("pass_at_1_ci") or [None, None]
        interval = "" if None in ci else f"{ci[0]:.3f} to {ci[1]:.3f}"
        lines.append(f"| {name} | {scores.get('pass_at_1', 0.0):.3f} | {interval} | {scores.get('episodes')} |")
    return "\n".join(lines)


class Tracker:
    """The trackers of one run; ``log_step`` and ``log_eval`` write to each, ``close`` flushes."""

    def __init__(self, run_dir: str | Path, report_to: list[str], config: Mapping[str, Any], log: Logger) -> None:
        self.run_dir = Path(run_dir)
        self.tensorboard: Any = None
        self.wandb_run: Any = None
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ValueError(
                    "report_to: tensorboard needs the tensorboard package: pip install tensorboard "
                    "(or pip install 'harnessrl[tracking]')"
                ) from exc
            self.tensorboard = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            log(f"tracking: tensorboard --logdir {self.run_dir / 'tensorboard'}")
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError:
                log("tracking: wandb is not installed (pip install wandb); metrics.jsonl only")
            else:
                # Offline: nothing leaves the machine; `wandb sync RUN_DIR/wandb/...` uploads later.
                self.wandb_run = wandb.init(mode="offline", dir=str(self.run_dir), config=dict(config),
                                            name=self.run_dir.name)
                log(f"tracking: wandb offline in {self.run_dir / 'wandb'}")

    def log_step(self, record: Mapping[str, Any]) -> None:
        """Writes every number of one ``metrics.jsonl`` record at its step."""
        step = int(record.get("step", 0))
        values = dict(scalars(record))
        if self.tensorboard is not None:
            for key, value in values.items():
                self.tensorboard.add_scalar(key, value, step)
            self.tensorboard.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def log_eval(self, label: str, results: Mapping[str, Any], step: int) -> None:
        """Writes one evaluation's table as text (its numbers reach ``log_step`` too, in the
        record of its step, or, for ``base`` and ``final``, as ``eval_<label>/...`` here)."""
        if not results:
            return
        table = eval_table(label, results)
        if label in ("base", "final"):
            values = dict(scalars(results, f"eval_{label}/"))
            if self.tensorboard is not None:
                for key, value in values.items():
                    self.tensorboard.add_scalar(key, value, step)
            if self.wandb_run is not None:
                self.wandb_run.log(values, step=step)
        if self.tensorboard is not None:
            self.tensorboard.add_text(f"eval/{label}", table, step)
            self.tensorboard.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({f"eval/{label}": table}, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
