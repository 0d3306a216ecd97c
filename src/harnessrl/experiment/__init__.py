"""The experiment suite: training arms under one matched budget, evaluated the same way, compared.

An experiment file (YAML) names a ``base`` training config shared by every arm, the
``seeds``, one ``eval`` protocol, and the ``arms``. An arm may change only what the papers'
ablations change: the design (single / first-order / orthogonal / random / full), the
pairing strategy and K (Harness Scaling), the rescue of dead groups, its K, the sibling
source and the router (Harness-S), and what the rollouts run through and what the update is
(the Harness Scaling paper's black-box baselines: ``rollout_through: ext:<agent>``,
``objective: rl | sft``, ``sft_source``). Everything that sets the budget (optimizer steps,
tasks and rollouts per step, turns, warm start) comes from ``base``, so every arm gets the
same budget in optimizer steps by construction; rescue adds executor rollouts, which the
comparison counts per arm (and ``--dry-run`` bounds) so that arms are compared at stated
rollout costs.

Matched budgets across harnesses and agent programs. "Matched" means equal optimizer steps
and equal rollouts per step (tasks_per_step x group_size runs, on the same task draws): an
agent run and an in-space episode each count as one rollout. They do not cost the same (an
agent program sends a long system prompt and tool schemas with every request, makes side
requests, and may take more turns), so the comparison also reports per arm what the
rollouts cost: prompt tokens, sampled tokens, side-request tokens, and rollout and update
wall time, summed over the run's steps. Equal steps are then stated next to unequal costs. Each (arm, seed) is a training run via ``rl/loop.py`` in
``DIR/arms/<arm>-seed<seed>/``, followed by the shared evaluation; a marker
``arm_result.json`` is written atomically after it, so a re-run skips finished arms and a
killed suite resumes (a half-trained arm continues from its last checkpoint).

A shared warm start (``warm_start:``, one per seed, in ``DIR/warm-start/seed<S>/``) makes the
RL phase the only difference between arms: every arm continues the same SFT checkpoint, and a
``control: sft-only`` arm is that checkpoint evaluated with no RL step, so "RL vs the SFT-only
control" measures what the RL steps added. Runs go seed by seed (an interrupted experiment
has whole seeds to compare).

The comparison table has the paper's shape: in-space, out-of-space, overall (their mean,
as the paper's overall averages in-space and Claude Code) and the gain over the reference
arm (single harness H0), with a paired comparison on the same evaluation units (each
(seed, task, harness) scored by both arms): the mean difference with its paired bootstrap
interval and the exact sign test.

Modules: ``spec`` (the file, arm configs, budgets), ``run`` (training and evaluating the
arms), ``compare`` (the table, the paired tests, the report).
"""

from harnessrl.experiment.compare import (
    compare,
    comparison_markdown,
    comparison_rows,
    executor_rollouts,
    unit_scores,
    write_experiment_report,
)
from harnessrl.experiment.run import (
    run_experiment,
    run_experiment_jobs,
    shared_warm_start,
    write_record,
)
from harnessrl.experiment.spec import (
    ARM_FIELDS,
    BUDGET_FIELDS,
    COST_FIELDS,
    MANAGED_FIELDS,
    MARKER,
    WARM_START_FIELDS,
    ArmSpec,
    EvalSpec,
    ExperimentSpec,
    arm_config,
    arm_id,
    budget,
    executor_rollouts_bound,
    load_experiment,
    warm_start_config,
    warm_start_model,
)

__all__ = [
    "ARM_FIELDS", "BUDGET_FIELDS", "COST_FIELDS", "MANAGED_FIELDS", "MARKER", "WARM_START_FIELDS", "ArmSpec",
    "EvalSpec", "ExperimentSpec", "arm_config", "arm_id", "budget", "compare", "comparison_markdown",
    "comparison_rows", "executor_rollouts", "executor_rollouts_bound", "load_experiment", "run_experiment", "run_experiment_jobs",
    "shared_warm_start", "unit_scores", "warm_start_config", "warm_start_model", "write_experiment_report",
    "write_record",
]
