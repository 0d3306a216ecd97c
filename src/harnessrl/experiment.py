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

The comparison table has the paper's shape: in-space, out-of-space, overall (their mean,
as the paper's overall averages in-space and Claude Code) and the gain over the reference
arm (single harness H0).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl.rl.config import TrainConfig, load_config

Logger = Callable[[str], None]
ARM_FIELDS = ("design", "design_n", "base_harness", "pairing", "k",
              "rescue", "rescue_k", "siblings", "router", "router_per_family", "mixture_fraction",
              "profile_voters", "rollout_through", "objective", "sft_source")
# Set by the experiment for every arm; a base config must not set them.
MANAGED_FIELDS = ("run_dir", "seed", "eval_held_out", "eval_out_of_space", "eval_base", "eval_every")
MARKER = "arm_result.json"


class ArmSpec(BaseModel):
    """One training arm: what it changes relative to the base config."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="arm name (a folder name: letters, digits, '-', '_', '.')")
    description: str = Field("", description="what this arm is, for the report")
    design: Literal["orthogonal", "first-order", "random", "full", "single"] | None = Field(None, description="training design")
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


class EvalSpec(BaseModel):
    """The evaluation every arm gets, identical across arms."""

    model_config = ConfigDict(extra="forbid")

    configs: str = Field("held-out,out-of-space", description="evaluation set (see resolve_eval_set)")
    design: Literal["orthogonal", "first-order", "random", "full", "single"] = Field(
        "orthogonal", description="the design held-out configurations are drawn against (the paper's OA(18))")
    held_out: int = Field(18, ge=0, description="held-out in-space configurations (paper: 18)")
    tasks: int = Field(16, ge=1, description="test tasks per harness")
    k: int = Field(1, ge=1, description="runs per task")
    temperature: float = Field(0.0, ge=0.0, description="sampling temperature (0 = greedy)")
    seed: int = Field(0, description="seed of the held-out draw and of the test-task order")


class ExperimentSpec(BaseModel):
    """An experiment file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="experiment name (default output folder experiments/<name>)")
    description: str = Field("", description="what is compared, for the report")
    base: dict[str, Any] = Field(default_factory=dict, description="TrainConfig fields shared by every arm; may name a preset")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="training seeds of every arm")
    reference: str | None = Field(None, description="arm the gains are measured against (default: the first arm)")
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
    for name in MANAGED_FIELDS:
        if name in spec.base:
            raise ValueError(f"{path}: field base.{name}: set by the experiment for every arm; remove it "
                             "(seeds go in `seeds`, evaluation in `eval`)")
    from harnessrl.design import make_design
    from harnessrl.harness.registry import default_space

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
    try:
        return load_config(None, preset or "quick", overrides)
    except ValueError as exc:
        # load_config names its source "overrides": say which fields of the file they are
        where = "base" if set(_bad_fields(str(exc))) <= set(base) | {"preset"} else "arm"
        text = str(exc).replace("overrides: invalid training config", "invalid training config", 1)
        if where == "base":
            text = text.replace("  field ", "  field base.")
        raise ValueError(f"{source}: arm {arm.name!r}: {text}") from None


def _bad_fields(message: str) -> list[str]:
    return [line.split("field ", 1)[1].split(":", 1)[0] for line in message.splitlines() if line.startswith("  field ")]


BUDGET_FIELDS = ("steps", "tasks_per_step", "group_size", "max_turns", "max_new_tokens", "context_tokens",
                 "max_train_tasks", "sft_warm_start_steps", "sft_tasks", "algorithm", "model")


def budget(cfg: TrainConfig) -> dict[str, Any]:
    """Returns the fields that make up an arm's budget (equal across arms by construction)."""
    return {name: getattr(cfg, name) for name in BUDGET_FIELDS}


def executor_rollouts_bound(cfg: TrainConfig) -> dict[str, int]:
    """Returns an arm's executor rollouts before it runs: the first pass (steps x tasks x G, as
    plain GRPO), the most rescue can add (K per group, when every group dies), and the paired
    validation of sibling rescue with validation routing (harnesses x tasks per anchor)."""
    first_pass = cfg.steps * cfg.tasks_per_step * cfg.group_size
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
    return {"first_pass": first_pass, "rescue_at_most": rescue_max, "validation": validation}


def executor_rollouts(run_dir: Path) -> dict[str, Any]:
    """Returns the executor rollouts an arm spent, from its metrics: training (first pass and
    rescue) and paired validation, and the training rollouts relative to plain GRPO's first pass."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()] if (run_dir / "metrics.jsonl").exists() else []
    rescue = sum(int(r.get("rescue/rescue_rollouts", 0)) for r in records)
    first = sum(int(r.get("episodes", 0)) for r in records) - rescue
    validation = sum(int(r.get("rescue_anchor", {}).get("episodes", 0)) for r in records)
    state = run_dir / "checkpoints"
    finals = sorted(state.glob("step-*/trainer_state.json")) if state.exists() else []
    if finals:
        validation += int(json.loads(finals[-1].read_text(encoding="utf-8")).get("final_anchor", {}).get("episodes", 0))
    cost = {key: sum(float(r.get(key, 0)) for r in records) for key in COST_FIELDS}
    ratios = {key: float(np.mean([r[key] for r in records if key in r])) if any(key in r for r in records) else None
              for key in ("valid_group_ratio", "effective_token_ratio", "rescue/rescue_success_rate",
                          "rescue/rescue_trigger_rate")}
    return {"first_pass": first, "rescue": rescue, "validation": validation,
            "vs_grpo": (first + rescue) / first if first else None, **{k.split("/")[-1]: v for k, v in ratios.items()},
            **cost}


COST_FIELDS = ("tokens_prompt", "tokens_generated", "tokens_side", "rollout_time_s", "update_time_s")
"""What an arm's rollouts cost, summed over its steps' metrics (see the module docstring)."""


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def run_experiment(spec: ExperimentSpec, out_dir: str | Path, log: Logger = print, source: str = "") -> dict[str, Any]:
    """Runs every unfinished (arm, seed), evaluates it, and writes the table and report;
    returns the comparison."""
    from harnessrl.design import make_design
    from harnessrl.eval.evaluate import evaluate
    from harnessrl.eval.report import write_run_report
    from harnessrl.eval.sets import resolve_eval_set
    from harnessrl.external.run import ExternalConfig
    from harnessrl.harness.registry import default_space
    from harnessrl.rl.loop import Trainer
    from harnessrl.tasks.suite import select_tasks
    from harnessrl.trajectory import save_jsonl

    out = Path(out_dir)
    (out / "arms").mkdir(parents=True, exist_ok=True)
    configs = {arm_id(arm, seed): arm_config(spec, arm, seed, out) for arm in spec.arms for seed in spec.seeds}
    budgets = {json.dumps(budget(c), sort_keys=True) for c in configs.values()}
    if len(budgets) != 1:  # cannot happen while arms may only set ARM_FIELDS; checked anyway
        raise ValueError(f"arms of {spec.name} do not share one budget: {sorted(budgets)}")
    eval_design = make_design(default_space(), spec.eval.design, seed=spec.eval.seed)
    targets = resolve_eval_set(spec.eval.configs, eval_design, held_out=spec.eval.held_out, seed=spec.eval.seed)
    _write_atomic(out / "experiment.json", {
        "spec": spec.model_dump(), "source": source, "budget": budget(next(iter(configs.values()))),
        "targets": [[t.name, t.group] for t in targets],
        "runs": [{"arm": arm.name, "seed": seed, "id": arm_id(arm, seed)} for arm in spec.arms for seed in spec.seeds],
    })
    for arm in spec.arms:
        for seed in spec.seeds:
            run_id = arm_id(arm, seed)
            cfg = configs[run_id]
            run_dir = Path(cfg.run_dir)
            marker = run_dir / MARKER
            if marker.exists():
                done = json.loads(marker.read_text(encoding="utf-8"))
                if done.get("config") != cfg.model_dump() or done.get("eval") != spec.eval.model_dump():
                    raise ValueError(
                        f"{run_dir}: finished with a different config or evaluation than {source or spec.name} "
                        "now asks for; delete that folder to rerun the arm, or give the arm a new name"
                    )
                log(f"[{run_id}] finished earlier: skipped")
                continue
            log(f"[{run_id}] training: design {cfg.design}, pairing {cfg.pairing}, K={cfg.k}, rescue {cfg.rescue}, "
                f"through {cfg.rollout_through} ({cfg.objective}), {cfg.steps} steps")
            started = time.time()
            trainer = Trainer(cfg, resume=True, log=lambda m, r=run_id: log(f"[{r}] {m}"))
            trainer.run()
            tasks = select_tasks(cfg.suite, cfg.eval_split, spec.eval.tasks, spec.eval.seed, cfg.tiers, cfg.families)
            result = evaluate(
                trainer.policy, targets, tasks, k=spec.eval.k, limits=trainer.limits,
                temperature=spec.eval.temperature, max_new_tokens=cfg.max_new_tokens, seed=spec.eval.seed,
                max_concurrent=cfg.max_concurrent, env_workers=cfg.env_workers, backend=cfg.sandbox_backend,
                design=trainer.design,
                # Agent programs evaluated through get the per-turn token limit of in-space episodes.
                external=ExternalConfig(max_steps=cfg.agent_max_steps, time_limit_s=cfg.agent_time_limit_s,
                                        max_tokens=cfg.max_new_tokens,
                                        backend="auto" if cfg.sandbox_backend == "none" else cfg.sandbox_backend),
            )
            save_jsonl(result.trajectories, run_dir / "eval" / "experiment.jsonl")
            results = result.to_dict()
            _write_atomic(marker, {
                "arm": arm.model_dump(), "seed": seed, "config": cfg.model_dump(), "eval": spec.eval.model_dump(),
                "train_configs": trainer.design.codes, "results": results, "rollouts": executor_rollouts(run_dir),
                "wall_time_s": round(time.time() - started, 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            })
            in_space = results["per_group"].get("in_space", {}).get("pass_at_1")
            log(f"[{run_id}] evaluated: in-space Pass@1 {in_space}")
            write_run_report(run_dir)
            del trainer
    comparison = compare(out)
    write_experiment_report(out)
    return comparison


def _finished(out: Path, spec: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for arm in spec["arms"]:
        for seed in spec["seeds"]:
            marker = out / "arms" / f"{arm['name']}-seed{seed}" / MARKER
            if marker.exists():
                by_arm.setdefault(arm["name"], []).append(json.loads(marker.read_text(encoding="utf-8")))
    return by_arm


def compare(out_dir: str | Path) -> dict[str, Any]:
    """Returns the comparison of the finished arms of an experiment folder: per arm, Pass@1
    in-space / out-of-space / overall (mean over seeds, pooled 95% interval) and the gain
    over the reference arm."""
    from harnessrl.eval.evaluate import score_trajectories
    from harnessrl.eval.metrics import bootstrap_ci_mean_of_means
    from harnessrl.trajectory import load_jsonl

    out = Path(out_dir)
    meta = json.loads((out / "experiment.json").read_text(encoding="utf-8"))
    spec = meta["spec"]
    groups = {name: group for name, group in meta["targets"]}
    finished = _finished(out, spec)
    rows: dict[str, dict[str, Any]] = {}
    for arm in spec["arms"]:
        markers = finished.get(arm["name"], [])
        if not markers:
            continue
        row: dict[str, Any] = {"arm": arm["name"], "description": arm.get("description", ""),
                               "design": markers[0]["config"]["design"], "train_configs": len(markers[0]["train_configs"]),
                               "pairing": markers[0]["config"]["pairing"], "k": markers[0]["config"]["k"],
                               "rescue": markers[0]["config"].get("rescue", "none"),
                               "router": markers[0]["config"].get("router"),
                               "seeds": [m["seed"] for m in markers]}
        spent = [m.get("rollouts") or {} for m in markers]
        row["rollouts"] = {key: _mean([s.get(key) for s in spent]) for key in
                           ("first_pass", "rescue", "validation", "vs_grpo", "valid_group_ratio",
                            "effective_token_ratio", "rescue_success_rate", "rescue_trigger_rate", *COST_FIELDS)}
        row["rollout_through"] = markers[0]["config"].get("rollout_through", "harness")
        row["objective"] = markers[0]["config"].get("objective", "rl")
        pooled = []
        for m in markers:
            path = out / "arms" / f"{arm['name']}-seed{m['seed']}" / "eval" / "experiment.jsonl"
            pooled += load_jsonl(path) if path.exists() else []
        pooled_scores = score_trajectories(pooled, spec["eval"]["k"], groups).to_dict() if pooled else {"per_group": {}}
        for group in ("in_space", "out_of_space", "external"):
            values = [m["results"]["per_group"][group]["pass_at_1"] for m in markers if group in m["results"]["per_group"]]
            row[group] = float(np.mean(values)) if values else None
            row[f"{group}_seed_std"] = float(np.std(values)) if len(values) > 1 else None
            row[f"{group}_ci"] = pooled_scores["per_group"].get(group, {}).get("pass_at_1_ci")
        # The training configurations themselves (H0 for a single-harness design): Pass@k and
        # Avg@k under them, Harness-S's protocol (Pass@3 / Avg@3 under H0).
        train_scores = pooled_scores["per_group"].get("train", {})
        row["train_pass_at_k"], row["train_avg_at_k"] = train_scores.get("pass_at_k"), train_scores.get("avg_at_k")
        # Overall: in-space and out of it (the paper's overall averages in-space and Claude Code;
        # an external agent program is out of the space, so it joins the out-of-space side).
        outside = [row[g] for g in ("out_of_space", "external") if row[g] is not None]
        parts = [v for v in (row["in_space"], float(np.mean(outside)) if outside else None) if v is not None]
        row["overall"] = float(np.mean(parts)) if parts else None
        row["overall_ci"] = list(bootstrap_ci_mean_of_means(
            [unit_scores(pooled, groups, "in_space"),
             unit_scores(pooled, groups, "out_of_space") + unit_scores(pooled, groups, "external")])) if pooled else None
        row["behaviour"] = {name: cell["rate"] for name, cell in pooled_scores.get("behaviour", {}).get("overall", {}).items()}
        row["wall_time_s"] = sum(m.get("wall_time_s", 0.0) for m in markers)
        rows[arm["name"]] = row
    reference = spec.get("reference") or spec["arms"][0]["name"]
    ref = rows.get(reference)
    for row in rows.values():
        for key in ("in_space", "out_of_space", "overall"):
            gain = None
            if ref is not None and row[key] is not None and ref[key] is not None:
                gain = row[key] - ref[key]
            row[f"gain_{key}"] = gain
    result = {"name": spec["name"], "reference": reference, "budget": meta["budget"], "seeds": spec["seeds"],
              "eval": spec["eval"], "arms": list(rows.values()),
              "missing": [f"{a['name']}-seed{s}" for a in spec["arms"] for s in spec["seeds"]
                          if not (out / "arms" / f"{a['name']}-seed{s}" / MARKER).exists()]}
    _write_atomic(out / "comparison.json", result)
    (out / "comparison.md").write_text(comparison_markdown(result), encoding="utf-8")
    return result


def _mean(values: list[Any]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return float(np.mean(present)) if present else None


def unit_scores(trajectories: list[Any], groups: dict[str, str], group: str) -> list[float]:
    """Returns the Pass@1 of each (task, harness) unit of one group (the mean over its runs)."""
    units: dict[tuple[str, str], list[bool]] = {}
    for t in trajectories:
        if groups.get(t.config, "out_of_space" if t.out_of_space else "in_space") == group:
            units.setdefault((t.task_id, t.config), []).append(bool(t.passed))
    return [sum(runs) / len(runs) for runs in units.values()]


def comparison_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Returns the paper-shaped table: headers and one row per arm."""
    from harnessrl.eval.report import pct, pct_ci, signed

    headers = ["arm", "design (configs)", "pairing, K", "seeds", "in-space Pass@1", "95% CI", "out-of-space Pass@1",
               "95% CI", "overall", "95% CI", f"gain in-space vs {result['reference']}", "gain overall"]
    rows = [[r["arm"], f"{r['design']} ({r['train_configs']})", f"{r['pairing']}, K={r['k']}", len(r["seeds"]),
             pct(r["in_space"]), pct_ci(r["in_space_ci"]), pct(r["out_of_space"]), pct_ci(r["out_of_space_ci"]),
             pct(r["overall"]), pct_ci(r.get("overall_ci")), signed(r["gain_in_space"]), signed(r["gain_overall"])] for r in result["arms"]]
    if any(r.get("external") is not None for r in result["arms"]):
        # The agent programs evaluated through (the paper's Claude Code column).
        headers += ["external agents Pass@1", "95% CI"]
        for row, r in zip(rows, result["arms"], strict=True):
            row += [pct(r.get("external")), pct_ci(r.get("external_ci"))]
    if any(r.get("rollout_through", "harness") != "harness" or r.get("objective", "rl") != "rl" for r in result["arms"]):
        # Black-box arms: what the equal steps cost (see the module docstring).
        headers += ["trains through", "update", "prompt tokens", "sampled tokens", "side tokens", "rollout s", "update s"]
        for row, r in zip(rows, result["arms"], strict=True):
            spent = r.get("rollouts") or {}
            row += [r.get("rollout_through", "harness"), r.get("objective", "rl"),
                    *[f"{spent[key]:.0f}" if spent.get(key) is not None else "-" for key in COST_FIELDS]]
    if any(r.get("rescue", "none") != "none" for r in result["arms"]):
        # Harness-S's columns: the signal rescue restores and what it costs in executor rollouts.
        k = result["eval"]["k"]
        headers += ["rescue (router)", f"train configs Pass@{k}", f"Avg@{k}", "valid groups", "effective tokens",
                    "rescue success", "rollouts vs GRPO", "validation rollouts"]
        for row, r in zip(rows, result["arms"], strict=True):
            spent = r.get("rollouts") or {}
            row += [f"{r.get('rescue', 'none')}" + (f" ({r['router']})" if r.get("rescue") == "siblings" else ""),
                    pct(r.get("train_pass_at_k")), pct(r.get("train_avg_at_k")), pct(spent.get("valid_group_ratio")),
                    pct(spent.get("effective_token_ratio")), pct(spent.get("rescue_success_rate")),
                    f"{100 * spent['vs_grpo']:.0f}%" if spent.get("vs_grpo") else "-",
                    f"{spent['validation']:.0f}" if spent.get("validation") is not None else "-"]
    return headers, rows


def comparison_markdown(result: dict[str, Any]) -> str:
    """Returns the comparison table as Markdown, with the budget it was run under."""
    headers, rows = comparison_rows(result)
    b = result["budget"]
    lines = [f"# Experiment `{result['name']}`", "",
             f"Budget per arm: {b['steps']} {b['algorithm'].upper()} steps x {b['tasks_per_step']} tasks x "
             f"{b['group_size']} rollouts, at most {b['max_turns']} turns of {b['max_new_tokens']} tokens, "
             f"SFT warm start {b['sft_warm_start_steps']} steps on {b['sft_tasks']} demonstrations; model {b['model']}; "
             f"seeds {result['seeds']}. Evaluation: {result['eval']['configs']} ({result['eval']['held_out']} held-out), "
             f"{result['eval']['tasks']} tasks per harness, k={result['eval']['k']}, temperature {result['eval']['temperature']}.",
             "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if result["missing"]:
        lines += ["", f"Not finished yet: {', '.join(result['missing'])}."]
    return "\n".join(lines) + "\n"


def write_experiment_report(out_dir: str | Path) -> Path:
    """(Re)builds DIR/report/ of an experiment: the comparison table, bars, learning curves,
    per-level heatmaps and distance curves per arm, behaviours, sample transcripts."""
    from harnessrl.eval.behaviour import BEHAVIOURS
    from harnessrl.eval.report import (
        Doc,
        eval_sections,
        make_decoder,
        pct,
        plot_distance,
        plot_learning_curves,
        plot_level_heatmap,
        pyplot,
        read_jsonl_records,
    )
    from harnessrl.trajectory import load_jsonl

    out = Path(out_dir)
    result = compare(out)
    spec = json.loads((out / "experiment.json").read_text(encoding="utf-8"))["spec"]
    doc = Doc(f"Experiment {result['name']}", out / "report")
    if spec.get("description"):
        doc.para(spec["description"])
    doc.para(comparison_markdown(result).splitlines()[2])
    doc.heading("Comparison")
    headers, rows = comparison_rows(result)
    doc.table(headers, rows)
    if result["missing"]:
        doc.para(f"Not finished yet: {', '.join(result['missing'])}.")
    arms = result["arms"]
    if arms:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(arms) + 2), 3.6))
        xs = np.arange(len(arms))
        for offset, key, colour in ((-0.27, "in_space", "#1e88e5"), (0.0, "out_of_space", "#fb8c00"), (0.27, "overall", "#43a047")):
            values = [100 * (a[key] or 0.0) for a in arms]
            errors = None
            if key != "overall":
                lows = [100 * ((a[f"{key}_ci"] or [a[key] or 0.0])[0]) for a in arms]
                highs = [100 * ((a[f"{key}_ci"] or [0.0, a[key] or 0.0])[-1]) for a in arms]
                errors = [[max(0.0, v - lo) for v, lo in zip(values, lows, strict=True)],
                          [max(0.0, hi - v) for v, hi in zip(values, highs, strict=True)]]
            ax.bar(xs + offset, values, 0.27, yerr=errors, capsize=3, label=key.replace("_", "-"), color=colour)
        ax.set_xticks(xs, [a["arm"] for a in arms], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("Pass@1 (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=8)
        doc.figure("comparison", fig, "Pass@1 per arm (mean over seeds; bars: pooled 95% bootstrap interval)")
        series: dict[str, list[dict[str, Any]]] = {}
        for arm in arms:
            per_seed = [read_jsonl_records(out / "arms" / f"{arm['arm']}-seed{s}" / "metrics.jsonl") for s in arm["seeds"]]
            steps = sorted({r["step"] for records in per_seed for r in records})
            series[arm["arm"]] = [
                {"step": step, **{key: float(np.mean([r[key] for records in per_seed for r in records if r["step"] == step]))
                                  for key in ("reward_mean", "pass_rate")}}
                for step in steps
            ]
        doc.heading("Learning curves")
        doc.figure("learning-curves", plot_learning_curves(series, ["reward_mean", "pass_rate"]),
                   "Training rollouts per step, mean over seeds")
        doc.heading("Per factor level and distance to training")
        curves = {}
        for arm in arms:
            trajectories = []
            for s in arm["seeds"]:
                path = out / "arms" / f"{arm['arm']}-seed{s}" / "eval" / "experiment.jsonl"
                trajectories += load_jsonl(path) if path.exists() else []
            marker = json.loads((out / "arms" / f"{arm['arm']}-seed{arm['seeds'][0]}" / MARKER).read_text(encoding="utf-8"))
            analysis = marker["results"].get("analysis") or {}
            if analysis.get("marginals"):
                doc.figure(f"levels-{arm['arm']}", plot_level_heatmap(analysis["marginals"], arm["arm"]),
                           f"{arm['arm']}: Pass@1 per factor level (seed {arm['seeds'][0]})")
            if analysis.get("distance"):
                curves[arm["arm"]] = analysis["distance"]
        if curves:
            doc.figure("distance", plot_distance(curves), "Pass@1 against distance to each arm's nearest training configuration")
        doc.heading("Behaviour metrics (pooled over seeds)")
        doc.table(["arm", *BEHAVIOURS], [[a["arm"], *[pct(a["behaviour"].get(b)) for b in BEHAVIOURS]] for a in arms])
        best = max(arms, key=lambda a: a["overall"] or 0.0)
        path = out / "arms" / f"{best['arm']}-seed{best['seeds'][0]}" / "eval" / "experiment.jsonl"
        if path.exists():
            trajectories = load_jsonl(path)
            marker = json.loads((out / "arms" / f"{best['arm']}-seed{best['seeds'][0]}" / MARKER).read_text(encoding="utf-8"))
            doc.heading(f"Best arm in detail: {best['arm']} (seed {best['seeds'][0]})")
            eval_sections(doc, marker["results"], trajectories, f"best-{best['arm']}",
                          decode=make_decoder(trajectories, marker["config"].get("model")))
        doc.heading("Runs")
        for arm in arms:
            for s in arm["seeds"]:
                run = out / "arms" / f"{arm['arm']}-seed{s}"
                if (run / "report" / "index.html").exists():
                    doc.link(f"{arm['arm']} seed {s}: training report", f"../arms/{run.name}/report/index.html")
    return doc.write()
