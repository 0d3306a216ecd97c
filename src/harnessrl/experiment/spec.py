"""The experiment file: arms, seeds, the shared warm start and evaluation, validated; each
(arm, seed)'s training config and the budget it runs under (see ``harnessrl.experiment``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl.diskio import write_text_atomic
from harnessrl.external import EXTERNAL_PREFIX
from harnessrl.rl.config import DesignName, TrainConfig, load_config

Logger = Callable[[str], None]
ARM_FIELDS = ("design", "design_n", "base_harness", "pairing", "k",
              "rescue", "rescue_k", "siblings", "router", "router_per_family", "mixture_fraction",
              "profile_voters", "rollout_through", "objective", "sft_source")
# Set by the experiment for every arm; a base config must not set them.
MANAGED_FIELDS = ("run_dir", "seed", "eval_held_out", "eval_out_of_space", "eval_base", "eval_every", "eval_design",
                  "eval_base_harness")
MARKER = "arm_result.json"
# eval.design kinds whose complement does not depend on an H0: an arm trained otherwise draws its
# curve from it as is; a single or first-order eval design needs eval.base_harness for that.
H0_FREE_DESIGNS = ("orthogonal", "random", "full")
# What a shared warm start may set (the arms then all start from its checkpoint). ``lora_rank: 0``
# there gives RL arms that train LoRA adapters (base ``lora_rank``) a fully fine-tuned warm start.
WARM_START_FIELDS = ("design", "design_n", "base_harness", "sft_warm_start_steps", "sft_tasks", "sft_learning_rate",
                     "sft_lr_schedule", "sft_harness_run", "tiers", "families", "lora_rank")


class ArmSpec(BaseModel):
    """One training arm: what it changes relative to the base config."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="arm name (a folder name: letters, digits, '-', '_', '.')")
    description: str = Field("", description="what this arm is, for the report")
    design: DesignName | None = Field(None, description="training design")
    design_n: int | None = Field(None, ge=1, description="size of a random design (paper: 18)")
    base_harness: str | None = Field(None, description="H0 for single / first-order designs")
    pairing: Literal["neighbour", "repeat", "random"] | None = Field(None, description="pairing strategy")
    k: int | None = Field(None, ge=1, description="configurations per task (paper: 2)")
    rescue: Literal["none", "siblings", "h0", "mixture"] | None = Field(
        None, description="Harness-S: what replaces an all-fail group (see TrainConfig.rescue)")
    rescue_k: int | None = Field(None, ge=1, description="rollouts of a rescue group (paper: 8)")
    siblings: str | None = Field(None, description="sibling source: space or space:R (see TrainConfig.siblings)")
    router: Literal["validation", "profile", "random"] | None = Field(None, description="sibling router")
    profile_voters: list[str] | None = Field(None, description="profile routing: voters, MODEL@URL each")
    router_per_family: bool | None = Field(None, description="validation routing per task family")
    mixture_fraction: float | None = Field(None, ge=0.0, le=1.0, description="sibling share for rescue: mixture")
    rollout_through: str | None = Field(
        None, description="black-box training: 'ext:<agent>' runs every rollout through that agent program "
        "(see TrainConfig.rollout_through); 'harness' (the default) is white-box")
    objective: Literal["rl", "sft"] | None = Field(None, description="rl (GRPO) or sft on the step's successful runs")
    sft_source: Literal["policy", "gold"] | None = Field(
        None, description="objective sft: the policy's own successful runs, or gold replayed through the agent")
    control: Literal["sft-only"] | None = Field(
        None, description="sft-only: no RL step; the arm is the warm start alone, evaluated like the others "
        "(the control that says what RL added)")


class EvalSpec(BaseModel):
    """The evaluation every arm gets, identical across arms."""

    model_config = ConfigDict(extra="forbid")

    configs: str = Field("held-out,out-of-space", description="evaluation set (see resolve_eval_set)")
    design: DesignName = Field(
        "orthogonal", description="the design held-out configurations are drawn against (the paper's OA(18))")
    base_harness: str | None = Field(
        None, description="H0 of a single or first-order design: held-out configurations and every arm's "
        "learning curve are drawn around it (None: the space's default H0, and each arm's curve around its own)")
    held_out: int = Field(18, ge=0, description="held-out in-space configurations (paper: 18)")
    tasks: int = Field(16, ge=1, description="test tasks per harness")
    external_tasks: int | None = Field(
        None, ge=1, description="test tasks per agent program (ext:<name> in configs): the first N of the same "
        "draw, a small fixed set where one agent run costs tens of seconds; None: tasks")
    k: int = Field(1, ge=1, description="runs per task")
    temperature: float = Field(0.0, ge=0.0, description="sampling temperature (0 = greedy)")
    seed: int = Field(0, description="seed of the held-out draw and of the test-task order")
    curve_every: int = Field(
        0, ge=0, description="learning curves: every RL arm also evaluates a fixed held-out subset (greedy, the "
        "same tasks and configurations at every point) before step 1, every N steps and after the last; 0 = off")
    curve_tasks: int = Field(8, ge=1, description="learning curves: test tasks per configuration of that subset")
    curve_held_out: int = Field(4, ge=1, description="learning curves: held-out in-space configurations of that subset")


class ExperimentSpec(BaseModel):
    """An experiment file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="experiment name (default output folder experiments/<name>)")
    description: str = Field("", description="what is compared, for the report")
    base: dict[str, Any] = Field(default_factory=dict, description="TrainConfig fields shared by every arm; may name a preset")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="training seeds of every arm")
    reference: str | None = Field(None, description="arm the gains are measured against (default: the first arm)")
    contrasts: list[tuple[str, str]] = Field(
        default_factory=list, description="pairs [arm, against] tested on the same units beside the reference "
        "(the directions an ablation asks, e.g. [orthogonal-18, random-18]; comparison.md's 'Contrasts')")
    warm_start: dict[str, Any] | None = Field(
        None, description="one SFT warm start per seed shared by every arm: TrainConfig fields of the warm-start "
        f"run over base ({', '.join(WARM_START_FIELDS)}); the arms then start from its checkpoint with no warm "
        "start of their own. Without it each arm warm-starts under its own training harnesses")
    eval: EvalSpec = Field(default_factory=EvalSpec)
    arms: list[ArmSpec] = Field(min_length=1, description="the arms")


def _spec_error(path: str, exc: ValidationError) -> str:
    lines = [f"{path}: invalid experiment file"]
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(p) for p in loc) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            if loc[:1] == ["arms"]:
                msg = f"unknown arm field; an arm may set only: name, description, {', '.join(ARM_FIELDS)} (budget fields go in base)"
            elif loc[:1] == ["eval"]:
                msg = f"unknown eval field; valid: {', '.join(EvalSpec.model_fields)}"
            else:
                msg = f"unknown field; valid top-level fields: {', '.join(ExperimentSpec.model_fields)}"
        lines.append(f"  field {where}: {msg}")
    return "\n".join(lines)


def load_experiment(path: str | Path) -> ExperimentSpec:
    """Returns the validated experiment; raises ``ValueError`` naming file, field and fix."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with name, base, seeds, eval and arms at the top level")
    try:
        spec = ExperimentSpec(**data)
    except ValidationError as exc:
        raise ValueError(_spec_error(str(path), exc)) from None
    names = [arm.name for arm in spec.arms]
    for arm in spec.arms:
        if not arm.name or any(not (c.isalnum() or c in "-_.") for c in arm.name):
            raise ValueError(f"{path}: field arms.{arm.name!r}.name: use letters, digits, '-', '_' or '.' only")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: field arms: arm names repeat ({', '.join(duplicates)}); give each arm its own name")
    if spec.reference is not None and spec.reference not in names:
        raise ValueError(f"{path}: field reference: {spec.reference!r} is not an arm; choose one of {', '.join(names)}")
    for index, (arm, against) in enumerate(spec.contrasts):
        unknown = [n for n in (arm, against) if n not in names]
        if unknown or arm == against:
            what = f"{unknown[0]!r} is not an arm" if unknown else "an arm against itself"
            raise ValueError(f"{path}: field contrasts.{index}: {what}; name two of {', '.join(names)}")
    for name in MANAGED_FIELDS:
        if name in spec.base:
            raise ValueError(f"{path}: field base.{name}: set by the experiment for every arm; remove it "
                             "(seeds go in `seeds`, evaluation in `eval`)")
    if spec.warm_start is not None:
        extra = sorted(set(spec.warm_start) - set(WARM_START_FIELDS))
        if extra:
            raise ValueError(f"{path}: field warm_start.{extra[0]}: a shared warm start may set only "
                             f"{', '.join(WARM_START_FIELDS)}")
        if not warm_start_config(spec, spec.seeds[0], Path("/nonexistent"), source=str(path)).sft_warm_start_steps:
            raise ValueError(f"{path}: field warm_start.sft_warm_start_steps: a shared warm start needs at least "
                             "one SFT step (set it here or in base)")
    if not any(arm.control is None for arm in spec.arms):
        raise ValueError(f"{path}: field arms: every arm is a control; add a training arm")
    from harnessrl.design import make_design
    from harnessrl.harness.registry import default_space

    if spec.eval.base_harness is not None:
        if spec.eval.design in H0_FREE_DESIGNS:
            raise ValueError(f"{path}: field eval.base_harness: an {spec.eval.design} design has no H0; it applies "
                             "to a single or first-order eval.design only")
        try:
            default_space().parse(spec.eval.base_harness)
        except ValueError as exc:
            raise ValueError(f"{path}: field eval.base_harness: {exc}") from None
    for arm in spec.arms:  # every arm must build a valid training config and schedule
        cfg = arm_config(spec, arm, spec.seeds[0], Path("/nonexistent"), source=str(path))
        try:
            size = len(make_design(default_space(), cfg.design, n=cfg.design_n, seed=cfg.seed, base=cfg.base_harness))
        except ValueError as exc:
            raise ValueError(f"{path}: arm {arm.name!r}: field design: {exc}") from None
        if cfg.pairing != "repeat" and cfg.k > size:
            raise ValueError(
                f"{path}: arm {arm.name!r}: field k: K={cfg.k} with {cfg.pairing} pairing needs {cfg.k} distinct "
                f"configurations, the {cfg.design} design has {size}; set pairing: repeat (the same harness on "
                f"K successive steps) or k: {size}"
            )
    return spec


def arm_id(arm: ArmSpec, seed: int) -> str:
    return f"{arm.name}-seed{seed}"


def arm_config(spec: ExperimentSpec, arm: ArmSpec, seed: int, out_dir: Path, source: str = "experiment") -> TrainConfig:
    """Returns the training config of one (arm, seed): base, then the arm's changes, then
    what the experiment manages (seed, run folder, no built-in evaluation)."""
    base = dict(spec.base)
    preset = base.pop("preset", None)
    overrides = {**base, **arm.model_dump(include=set(ARM_FIELDS), exclude_none=True),
                 "seed": seed, "run_dir": str(out_dir / "arms" / arm_id(arm, seed)),
                 "eval_held_out": 0, "eval_out_of_space": False, "eval_base": False, "eval_every": 0}
    if spec.warm_start is not None:  # every arm continues the seed's shared warm start
        overrides.update(model=str(warm_start_model(out_dir, seed)), sft_warm_start_steps=0)
    if spec.eval.curve_every and arm.control is None:  # the curve's subset; step 0 is the warm start (the control)
        overrides.update(eval_every=spec.eval.curve_every, eval_base=True, eval_tasks=spec.eval.curve_tasks,
                         eval_held_out=spec.eval.curve_held_out, eval_temperature=0.0)
    if arm.control == "sft-only":
        overrides["steps"] = 0
    try:
        cfg = load_config(None, preset or "quick", overrides)
        curve = _curve_design(spec, cfg)
        if curve:  # its curve on the configurations the arms trained on eval.design draw
            cfg = load_config(None, preset or "quick", {**overrides, **curve})
        return cfg
    except ValueError as exc:
        # load_config names its source "overrides": say which fields of the file they are
        where = "base" if set(_bad_fields(str(exc))) <= set(base) | {"preset"} else "arm"
        text = str(exc).replace("overrides: invalid training config", "invalid training config", 1)
        if where == "base":
            text = text.replace("  field ", "  field base.")
        raise ValueError(f"{source}: arm {arm.name!r}: {text}") from None


def _curve_design(spec: ExperimentSpec, cfg: TrainConfig) -> dict[str, Any]:
    """Returns the ``eval_design`` (and ``eval_base_harness``) that puts an arm's learning curve on
    the configurations drawn from eval.design's complement, as every arm's: none where the arm's
    own design (and H0) already gives them, or where eval.design needs an H0 the eval section does
    not name (then each arm's curve stays on its own design's complement)."""
    from harnessrl.design import make_design
    from harnessrl.harness.registry import default_space

    evaluated = spec.eval
    if not cfg.eval_every:
        return {}
    if evaluated.design in H0_FREE_DESIGNS:
        return {} if cfg.design == evaluated.design else {"eval_design": evaluated.design}
    if evaluated.base_harness is None:
        return {}
    space = default_space()
    h0 = space.parse(evaluated.base_harness)
    own = make_design(space, cfg.design, n=cfg.design_n, seed=cfg.seed, base=cfg.base_harness)
    if cfg.design == evaluated.design and own.params.get("base") == h0.code:
        return {}
    return {"eval_design": evaluated.design, "eval_base_harness": h0.code}


RL_STEP_FIELDS = (
    "tasks_per_step", "group_size",
    "learning_rate", "warmup_steps", "lr_schedule", "weight_decay", "ppo_epochs", "mini_batches", "clip_low",
    "clip_high", "aggregation", "loss_norm_tokens", "policy_loss", "advantage", "scale_std", "importance_cap",
    "kl_coef", "kl_estimator", "entropy_coef", "skip_no_signal_groups", "dynamic_sampling_rounds", "temperature",
    "top_p", "frontier", "frontier_decay", "frontier_prior", "frontier_low", "frontier_high", "frontier_explore",
    "rescue_k", "rescue_validation_tasks", "reanchor_every", "mixture_fraction", "router_per_family",
)
"""TrainConfig fields that only RL steps read (their batch, optimizer, loss, training rollouts, task
frontier, and a rescue's settings: a run with no RL step has no rescue): a run with no RL step (a
seed's warm start, the SFT-only control) is the same run whatever they are, so a file whose RL
settings changed (an RL sweep, a file with more tasks per step, a Harness-S file on another file's
warm starts) reuses its warm starts and controls instead of retraining them
(tests/test_experiment_report.py holds the list to that)."""


SAME_NUMBERS_FIELDS = ("activation_checkpointing",)
"""TrainConfig fields that change how a run computes, not what: with or without them a run gives
the same metrics and weights bit for bit (tests/test_activation_checkpointing.py,
test_trainer_recorded.py), so a finished run is reused whatever they are."""


def eval_changed(recorded: dict[str, Any] | None, evaluation: EvalSpec) -> bool:
    """Returns whether a finished run's recorded eval section differs from ``evaluation``; a field
    the record lacks was added since, and counts as its default there (as in ``changed_fields``)."""
    return {**EvalSpec().model_dump(), **(recorded or {})} != evaluation.model_dump()


def eval_additions(recorded: dict[str, Any] | None, evaluation: EvalSpec, evaluated: Collection[str],
                   targets: Sequence[str]) -> list[str] | None:
    """Returns the ``targets`` that ``evaluation`` adds to a finished run's recorded one, whose
    results hold the targets ``evaluated``, when it only adds some: the same tasks, runs,
    temperature, seed and held-out draw, and every evaluated target still asked for (agent
    programs' task count as well, if one was evaluated). Those are evaluated on the run's
    weights and merged into its results, as if asked for from the start (an agent program
    added to a finished file, say). None when the evaluation changed otherwise."""
    was, now = {**EvalSpec().model_dump(), **(recorded or {})}, evaluation.model_dump()
    free = {"configs"} | (set() if any(name.startswith(EXTERNAL_PREFIX) for name in evaluated) else {"external_tasks"})
    if any(was[name] != now[name] for name in now if name not in free) or not set(evaluated) <= set(targets):
        return None
    return [name for name in targets if name not in evaluated]


def changed_fields(recorded: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """Returns the fields in which a finished run's recorded config differs from ``cfg`` (none:
    the same run), ``SAME_NUMBERS_FIELDS`` left out; for a run with no RL step (``steps: 0``)
    ``RL_STEP_FIELDS`` are not compared either. A field the record lacks was added since, and
    a new field's default keeps the behaviour from before it: the record counts as having it.
    ``run_dir`` and ``model`` compare relative to the experiment folder that holds the run where
    they lie in it, so a folder moved or copied whole (or its warm starts and controls copied into
    another experiment's folder) holds the same runs."""
    recorded, now = _in_experiment(recorded), _in_experiment(cfg.model_dump())
    fields = type(cfg).model_fields
    skip = set(SAME_NUMBERS_FIELDS)
    if cfg.steps == 0 and recorded.get("steps") == 0:
        skip |= set(RL_STEP_FIELDS)

    def was(name: str) -> Any:
        if name in recorded:
            return recorded[name]
        return fields[name].get_default(call_default_factory=True) if name in fields else "<absent>"

    return sorted(name for name in set(now) | set(recorded) if name not in skip and was(name) != now.get(name, "<absent>"))


def _in_experiment(config: dict[str, Any]) -> dict[str, Any]:
    """Returns ``config`` with its ``run_dir`` and ``model`` relative to the experiment folder
    (``run_dir``'s grandparent: ``<out>/arms/<run>``, ``<out>/warm-start/<seed>``) where they lie in it."""
    root = Path(str(config.get("run_dir") or ".")).parent.parent
    located = dict(config)
    for name in ("run_dir", "model"):
        value = located.get(name)
        if isinstance(value, str) and value:
            with contextlib.suppress(ValueError):
                located[name] = Path(value).relative_to(root).as_posix()
    return located


def warm_start_dir(out_dir: Path, seed: int) -> Path:
    """Returns the folder of a seed's shared warm-start run."""
    return out_dir / "warm-start" / f"seed{seed}"


def warm_start_model(out_dir: Path, seed: int) -> Path:
    """Returns the model folder the arms of ``seed`` start from (the warm start's step-0 checkpoint)."""
    return warm_start_dir(out_dir, seed) / "checkpoints" / "step-000000" / "model"


def warm_start_config(spec: ExperimentSpec, seed: int, out_dir: Path, source: str = "experiment") -> TrainConfig:
    """Returns the training config of a seed's shared warm start: base, then the file's
    ``warm_start`` fields, no RL step and no evaluation."""
    base = dict(spec.base)
    preset = base.pop("preset", None)
    overrides = {**base, **(spec.warm_start or {}), "steps": 0, "seed": seed,
                 "run_dir": str(warm_start_dir(out_dir, seed)),
                 "eval_held_out": 0, "eval_out_of_space": False, "eval_base": False, "eval_every": 0}
    try:
        return load_config(None, preset or "quick", overrides)
    except ValueError as exc:
        text = str(exc).replace("overrides: invalid training config", "invalid training config", 1)
        raise ValueError(f"{source}: warm_start: {text}") from None


def _bad_fields(message: str) -> list[str]:
    return [line.split("field ", 1)[1].split(":", 1)[0] for line in message.splitlines() if line.startswith("  field ")]


BUDGET_FIELDS = ("steps", "tasks_per_step", "group_size", "max_turns", "max_new_tokens", "context_tokens",
                 "max_train_tasks", "sft_warm_start_steps", "sft_tasks", "algorithm", "model")


def budget(cfg: TrainConfig) -> dict[str, Any]:
    """Returns the fields that make up an arm's budget (equal across the RL arms of a seed by
    construction), with the bound on the tokens the first pass may sample."""
    return {**{name: getattr(cfg, name) for name in BUDGET_FIELDS},
            "sampled_tokens_at_most": cfg.steps * cfg.tasks_per_step * cfg.group_size * cfg.max_turns
            * cfg.max_new_tokens}


COST_FIELDS = ("tokens_prompt", "tokens_generated", "tokens_side", "trained_tokens", "rollout_time_s", "update_time_s")
"""What an arm's rollouts cost, summed over its steps' metrics (see the module docstring)."""




def executor_rollouts_bound(cfg: TrainConfig) -> dict[str, int]:
    """Returns an arm's executor rollouts before it runs: the first pass (steps x tasks x G, as
    plain GRPO), the most dynamic sampling can add (every group redrawn in every round), the
    most rescue can add (K per group, when every group dies), and the paired validation of
    sibling rescue with validation routing (harnesses x tasks per anchor)."""
    first_pass = cfg.steps * cfg.tasks_per_step * cfg.group_size
    sampling_max = first_pass * cfg.dynamic_sampling_rounds
    rescue_max = cfg.steps * cfg.tasks_per_step * cfg.rescue_k if cfg.rescue in ("siblings", "h0") else 0
    validation = 0
    if cfg.rescue == "siblings" and cfg.router in ("validation", "profile"):
        from harnessrl.design import make_design
        from harnessrl.harness.registry import default_space

        space = default_space()
        design = make_design(space, cfg.design, n=cfg.design_n, seed=cfg.seed, base=cfg.base_harness)
        from harnessrl.rl.rescue import Rescue

        rescue = Rescue(cfg, design.codes, [], lambda name: None, lambda step, index: 0, log=lambda m: None,
                        check_endpoints=False)
        harnesses = set(rescue.validation_harnesses())
        anchors = 1 + (cfg.steps // cfg.reanchor_every if cfg.reanchor_every else 0)
        validation = anchors * len(harnesses) * cfg.rescue_validation_tasks
    return {"first_pass": first_pass, "sampling_at_most": sampling_max, "rescue_at_most": rescue_max,
            "validation": validation}


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Writes ``data`` as JSON through a rename, so a killed run never leaves half a marker."""
    write_text_atomic(path, json.dumps(data, indent=2))
