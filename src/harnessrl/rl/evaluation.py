"""The trainer's evaluation: Pass@1 of the current policy on the run's held-out sets (the
design's held-out configurations, and the out-of-space harnesses), all sets as one batch of
episodes, with behaviour rates per set; the episodes are saved under ``eval/<label>.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harnessrl.design import Design
from harnessrl.eval.behaviour import rates
from harnessrl.eval.evaluate import EvalResult, evaluate
from harnessrl.eval.sets import EvalTarget
from harnessrl.harness.harness import HarnessLimits, out_of_space_names
from harnessrl.policy.base import Policy
from harnessrl.rl.config import TrainConfig
from harnessrl.tasks.model import Task
from harnessrl.trajectory import save_jsonl


def eval_sets(cfg: TrainConfig, held_out: Design) -> dict[str, list[str]]:
    """Returns the run's evaluation sets: held-out configurations, and out-of-space harnesses."""
    sets = {"in_space": [c.code for c in held_out.configs]}
    if cfg.eval_out_of_space:
        sets["out_of_space"] = out_of_space_names()
    return sets


def evaluate_run(
    policy: Policy, cfg: TrainConfig, sets: dict[str, list[str]], tasks: Sequence[Task], limits: HarnessLimits,
    design: Design, out: Path, log: Callable[[str], None],
) -> dict[str, Any]:
    """Returns Pass@1 (with its interval, episodes, format-error rate, per configuration and
    behaviour rates) per evaluation set; the episodes go to the file ``out``."""
    sets = {name: codes for name, codes in sets.items() if codes}
    if not sets:
        return {}
    targets = [EvalTarget(code, name) for name, codes in sets.items() for code in codes]
    result: EvalResult = evaluate(
        policy, targets, tasks, k=1, settings=cfg.rollout_settings(limits, evaluation=True), design=design,
    )
    save_jsonl(result.trajectories, out)
    scores: dict[str, Any] = {}
    for name, codes in sets.items():
        group = result.per_group[name]
        scores[name] = {
            **{key: group[key] for key in ("pass_at_1", "pass_at_1_ci", "episodes", "format_error_rate")},
            "per_config": {c: result.per_config[c]["pass_at_1"] for c in codes if c in result.per_config},
            "behaviour": rates(result.behaviour["per_group"][name]),
        }
        log(f"eval[{out.stem}] {name}: Pass@1 {scores[name]['pass_at_1']:.3f} over {group['episodes']} episodes")
    return scores
