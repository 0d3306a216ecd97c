"""Running an experiment: each seed's shared warm start, then every unfinished (arm, seed)
trained and evaluated under the shared protocol, with an atomic marker per finished run; or
the seeds split over worker processes that share the machine's cores."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.experiment.compare import compare, executor_rollouts, write_experiment_report
from harnessrl.experiment.spec import (
    MARKER,
    ArmSpec,
    ExperimentSpec,
    Logger,
    arm_config,
    arm_id,
    budget,
    changed_fields,
    eval_additions,
    eval_changed,
    warm_start_config,
    warm_start_model,
    write_json_atomic,
)

if TYPE_CHECKING:
    from harnessrl.eval.evaluate import EvalResult
    from harnessrl.eval.sets import EvalTarget
    from harnessrl.rl.config import TrainConfig


def shared_warm_start(spec: ExperimentSpec, seed: int, out: Path, log: Logger = print) -> Path:
    """Trains (or finds) the seed's shared warm start and returns the model folder the arms
    start from; a killed warm start is redone (it has no checkpoint before it ends).

    A finished warm start whose weights are gone (the folder is a record of an earlier sitting,
    kept without checkpoints: docs/evaluation.md) is trained again and must come out bit for bit
    as recorded (``weights_fingerprint``), or the arms finished on it would not pair with the
    arms trained now; another machine class rounds differently, and that is an error."""
    from harnessrl.memory import release_freed_memory
    from harnessrl.rl.checkpoint import weights_fingerprint
    from harnessrl.rl.loop import Trainer

    cfg = warm_start_config(spec, seed, out)
    run_dir, model = Path(cfg.run_dir), warm_start_model(out, seed)
    marker = run_dir / "warm_start.json"
    recorded = None
    if marker.exists():
        done = json.loads(marker.read_text(encoding="utf-8"))
        changed = changed_fields(done.get("config", {}), cfg)
        if changed:
            raise ValueError(f"{run_dir}: a warm start with another {', '.join(changed)} is there; delete the "
                             "experiment's warm-start and arms folders to rerun with the new one")
        if model.is_dir():
            return model
        recorded = done.get("fingerprint")
        if recorded is None:
            raise ValueError(f"{run_dir}: the warm start finished but its weights are gone, and its record has no "
                             "fingerprint to check a retrained one against; delete the experiment's warm-start "
                             "and arms folders to rerun")
        log(f"[warm-start-seed{seed}] the recorded warm start's weights are not here: training it again "
            "(it must match the record bit for bit)")
    log(f"[warm-start-seed{seed}] SFT warm start: {cfg.sft_warm_start_steps} steps on {cfg.sft_tasks} "
        f"demonstrations under the {cfg.design} design, shared by every arm of seed {seed}")
    started = time.time()
    trainer = Trainer(cfg, resume=True, log=lambda m: log(f"[warm-start-seed{seed}] {m}"))
    trainer.run()
    fingerprint = weights_fingerprint(model)
    if recorded is not None and fingerprint != recorded:
        raise ValueError(f"{run_dir}: the warm start trained again differs from the recorded one (weights "
                         f"{fingerprint[:12]} against {recorded[:12]}; another machine class or library version "
                         "rounds differently), so the finished arms would not pair with new ones: run the file "
                         "into a new folder")
    write_json_atomic(marker, {"seed": seed, "config": cfg.model_dump(), "warm_start": trainer.state.get("warm_start"),
                               "fingerprint": fingerprint, "wall_time_s": round(time.time() - started, 1)})
    del trainer
    release_freed_memory()  # the warm start's model copies and optimizer: its arms run in this process next
    return model


def write_record(out_dir: str | Path, dest: str | Path) -> Path:
    """Copies the experiment folder ``out_dir`` to ``dest`` without what can be trained again
    (checkpoints' model weights, optimizer state, the rollout copy's ``sync`` folder): every
    marker, metric, trajectory, log and report stays (3-20 MB per run). Each finished warm start's
    record gets its weights' fingerprint. Run into that copy (on another machine of the same
    class, say), the experiment skips the finished arms, trains a new arm's warm start again
    and checks it against the fingerprint (``shared_warm_start``), and compares old and new arms
    on the same units."""
    from harnessrl.rl.checkpoint import OPTIMIZER_FILE, weights_fingerprint

    out, dest = Path(out_dir), Path(dest)
    if not (out / "experiment.json").exists():
        raise FileNotFoundError(f"{out}: not an experiment folder (no experiment.json)")
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"{dest}: not empty; a record is written into a new folder")

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {name for name in names if name in (OPTIMIZER_FILE, "sync")}
        return skip | ({"model"} & set(names) if Path(folder).parent.name == "checkpoints" else set())

    shutil.copytree(out, dest, ignore=ignore, dirs_exist_ok=True)
    for marker in sorted(dest.glob("warm-start/*/warm_start.json")):
        done = json.loads(marker.read_text(encoding="utf-8"))
        weights = out / marker.parent.relative_to(dest) / "checkpoints" / "step-000000" / "model"
        if "fingerprint" not in done and weights.is_dir():  # a warm start recorded before fingerprints
            write_json_atomic(marker, {**done, "fingerprint": weights_fingerprint(weights)})
    return dest


def run_experiment(
    spec: ExperimentSpec, out_dir: str | Path, log: Logger = print, source: str = "",
    seeds: Sequence[int] | None = None, arms: Sequence[str] | None = None, table: bool = True,
) -> dict[str, Any] | None:
    """Runs every unfinished (arm, seed), evaluates it, and writes the table and report;
    returns the comparison (of every arm finished in ``out_dir``). ``seeds`` and ``arms``
    restrict what runs now to those of the file (a second seed on another machine, one new
    arm); the folder, its budget check and its table stay the whole file's. ``table=False``
    runs the arms only and returns None (a worker of ``run_experiment_jobs``)."""
    from harnessrl.design import make_design
    from harnessrl.eval.sets import resolve_eval_set
    from harnessrl.harness.registry import default_space

    unknown = sorted(set(seeds or ()) - set(spec.seeds)) + sorted(set(arms or ()) - {a.name for a in spec.arms})
    if unknown:
        raise ValueError(f"{spec.name} has no seed or arm {', '.join(map(str, unknown))}: its seeds are "
                         f"{spec.seeds}, its arms {', '.join(a.name for a in spec.arms)}")
    out = Path(out_dir)
    (out / "arms").mkdir(parents=True, exist_ok=True)
    configs = {arm_id(arm, seed): arm_config(spec, arm, seed, out) for arm in spec.arms for seed in spec.seeds}
    trained = [arm for arm in spec.arms if arm.control is None]
    for seed in spec.seeds:  # cannot differ while arms may only set ARM_FIELDS; checked anyway
        budgets = {json.dumps(budget(configs[arm_id(arm, seed)]), sort_keys=True) for arm in trained}
        if len(budgets) != 1:
            raise ValueError(f"arms of {spec.name} do not share one budget (seed {seed}): {sorted(budgets)}")
    eval_design = make_design(default_space(), spec.eval.design, seed=spec.eval.seed, base=spec.eval.base_harness)
    targets = resolve_eval_set(spec.eval.configs, eval_design, held_out=spec.eval.held_out, seed=spec.eval.seed)
    warm = warm_start_config(spec, spec.seeds[0], out) if spec.warm_start is not None else None
    write_json_atomic(out / "experiment.json", {
        "spec": spec.model_dump(), "source": source, "budget": budget(configs[arm_id(trained[0], spec.seeds[0])]),
        "warm_start": None if warm is None else {name: getattr(warm, name) for name in (
            "design", "sft_warm_start_steps", "sft_tasks", "sft_learning_rate", "tiers", "families")},
        "targets": [[t.name, t.group] for t in targets],
        "runs": [{"arm": arm.name, "seed": seed, "id": arm_id(arm, seed)} for seed in spec.seeds for arm in spec.arms],
    })
    # Seeds outer: an interrupted experiment has whole seeds to compare, not whole arms.
    for seed in spec.seeds:
        if seeds and seed not in seeds:
            continue
        needs = {arm.name: _still_to_evaluate(configs[arm_id(arm, seed)], spec, targets, arm_id(arm, seed), source, log)
                 for arm in spec.arms if not arms or arm.name in arms}
        pending = [arm for arm in spec.arms if needs.get(arm.name)]
        if pending and spec.warm_start is not None:  # a seed with every arm done needs no warm start
            shared_warm_start(spec, seed, out, log)
        for arm in pending:
            cfg = configs[arm_id(arm, seed)]
            what = ("control: the warm start alone, no RL step" if arm.control == "sft-only" else
                    f"design {cfg.design}, pairing {cfg.pairing}, K={cfg.k}, rescue {cfg.rescue}, "
                    f"through {cfg.rollout_through} ({cfg.objective}), {cfg.steps} steps")
            if len(needs[arm.name]) == len(targets):
                log(f"[{arm_id(arm, seed)}] training: {what}")
            _run_arm(spec, arm, seed, cfg, targets, needs[arm.name], log)
    if not table:
        return None
    comparison = compare(out)
    write_experiment_report(out)
    return comparison


def _still_to_evaluate(cfg: TrainConfig, spec: ExperimentSpec, targets: Sequence[EvalTarget], run_id: str,
                       source: str, log: Logger) -> list[EvalTarget]:
    """Returns the targets the (arm, seed) run ``cfg`` still has to be evaluated through: every
    one (no marker in its run folder: it trains, or resumes, first), none (finished with this
    config and evaluation), or those that the evaluation added since it finished (its
    weights are evaluated through them and the results merged). A marker with another config,
    or an evaluation changed otherwise, is an error that says what to do."""
    run_dir = Path(cfg.run_dir)
    marker = run_dir / MARKER
    if not marker.exists():
        return list(targets)
    done = json.loads(marker.read_text(encoding="utf-8"))
    changed = changed_fields(done.get("config", {}), cfg)
    added = None
    if eval_changed(done.get("eval"), spec.eval):
        added = eval_additions(done.get("eval"), spec.eval, done["results"]["per_config"], [t.name for t in targets])
        if added is None:
            changed.append("eval")
    if changed:
        raise ValueError(
            f"{run_dir}: finished with another {', '.join(changed)} than {source or spec.name} now asks for; "
            "delete that folder to rerun the arm, or give the arm a new name"
        )
    if added:
        log(f"[{run_id}] finished earlier; evaluating it through what the evaluation added since: {', '.join(added)}")
        return [t for t in targets if t.name in added]
    log(f"[{run_id}] finished earlier: skipped")
    return []


def _run_arm(spec: ExperimentSpec, arm: ArmSpec, seed: int, cfg: TrainConfig, targets: Sequence[EvalTarget],
             todo: Sequence[EvalTarget], log: Logger) -> None:
    """Trains one (arm, seed) (resuming a killed run), evaluates it on the experiment's units
    through ``todo``, and writes its trajectories, its marker (written last, atomically) and its
    report. A finished run (its marker there) is evaluated through the added ``todo`` only, its
    results rescored over all ``targets`` from the recorded trajectories and the new ones."""
    from harnessrl.eval.evaluate import score_trajectories, target_groups
    from harnessrl.eval.report import write_run_report
    from harnessrl.rl.loop import Trainer
    from harnessrl.trajectory import load_jsonl, save_jsonl

    run_id, run_dir = arm_id(arm, seed), Path(cfg.run_dir)
    done = json.loads((run_dir / MARKER).read_text(encoding="utf-8")) if (run_dir / MARKER).exists() else None
    trainer = Trainer(cfg, resume=True, log=lambda m: log(f"[{run_id}] {m}"))
    trainer.run()  # a finished run: nothing left to train
    trainer.release_training_state()  # the evaluation below reads the rollout policy only
    started = time.time()
    result = _evaluate(spec, cfg, trainer, todo)
    trajectories = result.trajectories
    if done is not None:
        trajectories = load_jsonl(run_dir / "eval" / "experiment.jsonl") + trajectories
    save_jsonl(trajectories, run_dir / "eval" / "experiment.jsonl")
    results = evaluated = result.to_dict()
    if done is None:
        record = {"arm": arm.model_dump(), "seed": seed, "config": cfg.model_dump(),
                  "train_configs": trainer.design.codes, "rollouts": executor_rollouts(run_dir),
                  # training over every sitting (a killed arm resumes), then this evaluation
                  "wall_time_s": round(float(trainer.state.get("wall_time_s", 0.0)) + time.time() - started, 1),
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    else:  # the first evaluation's timing stays; each addition says what it evaluated and what it took
        results = {**score_trajectories(trajectories, spec.eval.k, target_groups(targets), trainer.design).to_dict(),
                   "timing": done["results"].get("timing", {})}
        spent = round(time.time() - started, 1)
        record = {**done, "wall_time_s": round(done.get("wall_time_s", 0.0) + spent, 1), "added": [
            *done.get("added", []), {"targets": [t.name for t in todo], "wall_time_s": spent,
                                     "timing": evaluated["timing"], "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}]}
    write_json_atomic(run_dir / MARKER, {**record, "eval": spec.eval.model_dump(), "results": results})
    in_space = results["per_group"].get("in_space", {}).get("pass_at_1")
    log(f"[{run_id}] evaluated: in-space Pass@1 {in_space}")
    write_run_report(run_dir)
    del trainer


def _evaluate(spec: ExperimentSpec, cfg: TrainConfig, trainer: Any, targets: Sequence[EvalTarget]) -> EvalResult:
    """Returns the evaluation of the trained run's rollout policy through ``targets`` on the
    experiment's test tasks (agent programs on the first ``external_tasks`` of them)."""
    from harnessrl.eval.evaluate import evaluate
    from harnessrl.external.run import ExternalConfig
    from harnessrl.tasks.suite import select_tasks

    tasks = select_tasks(cfg.suite, cfg.eval_split, spec.eval.tasks, spec.eval.seed, cfg.tiers, cfg.families)
    return evaluate(
        trainer.policy, targets, tasks, k=spec.eval.k, design=trainer.design,
        settings=cfg.rollout_settings(trainer.limits, evaluation=True, temperature=spec.eval.temperature,
                                      seed=spec.eval.seed),
        # Agent programs evaluated through get the per-turn token limit of in-space episodes.
        external=ExternalConfig(max_steps=cfg.agent_max_steps, time_limit_s=cfg.agent_time_limit_s,
                                max_tokens=cfg.max_new_tokens,
                                backend="auto" if cfg.sandbox_backend == "none" else cfg.sandbox_backend),
        external_tasks=None if spec.eval.external_tasks is None else tasks[:spec.eval.external_tasks],
    )


def run_experiment_jobs(
    spec: ExperimentSpec, source: str | Path, out_dir: str | Path, jobs: int, log: Logger = print,
    seeds: Sequence[int] | None = None, arms: Sequence[str] | None = None, poll_s: float = 60.0,
) -> dict[str, Any]:
    """Runs the experiment file ``source`` with its seeds split over ``jobs`` worker processes
    (``harnessrl experiment --seeds ...``, round-robin), each with its share of the cores as
    torch threads (``OMP_NUM_THREADS``, unless set) and its output in ``DIR/logs/``; then writes
    the table and report once. Small models on CPU use cores better as parallel runs than as
    threads of one run. A worker that fails stops nothing else; its finished arms are kept
    (re-running resumes), and the error names its log."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    chosen = [s for s in spec.seeds if not seeds or s in seeds]
    groups = [chosen[i::jobs] for i in range(min(jobs, len(chosen)))]
    out = Path(out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // len(groups))))
    workers = []
    for group in groups:
        name = "seed-" + "-".join(map(str, group))
        command = [sys.executable, "-m", "harnessrl.cli", "experiment", str(source), "--out", str(out),
                   "--seeds", ",".join(map(str, group)), "--no-table"]
        if arms:
            command += ["--arms", ",".join(arms)]
        path = out / "logs" / f"{name}.log"
        stream = path.open("a", encoding="utf-8")
        workers.append((name, path, stream, subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, env=env)))
        log(f"[{name}] worker started ({env['OMP_NUM_THREADS']} threads): log {path}")
    try:
        shown = time.time()
        while any(proc.poll() is None for *_, proc in workers):
            time.sleep(min(1.0, poll_s))
            if time.time() - shown >= poll_s:  # each running worker's newest event, every poll_s
                shown = time.time()
                for name, path, _, proc in workers:
                    if proc.poll() is None:
                        log(f"[{name}] {_last_line(path)}")
    finally:
        for _, _, stream, proc in workers:
            if proc.poll() is None:  # interrupted: stop the workers too (finished arms stay)
                proc.terminate()
                proc.wait()
            stream.close()
    failed = [(name, path, proc.returncode) for name, path, _, proc in workers if proc.returncode != 0]
    comparison = compare(out)
    write_experiment_report(out)
    if failed:
        raise RuntimeError("; ".join(f"worker {name} exited with {rc} (log {path}: {_last_line(path, False)})"
                                     for name, path, rc in failed) + "; re-run to resume its unfinished arms")
    return comparison


def _last_line(path: Path, event: bool = True) -> str:
    """A worker's last log line; with ``event`` its newest logged event (``[time] [run] ...``,
    not a progress line) if it has one."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    events = [line for line in lines if re.match(r"\[\d\d:\d\d:\d\d\] \[", line)] if event else []
    return (events or lines or ["(no output yet)"])[-1]
