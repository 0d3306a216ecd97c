"""Comparing the finished arms of an experiment: the paper-shaped table (in-space,
out-of-space, overall, gains with intervals), paired tests against the reference arm on the
same evaluation units (overall, per seed and per task family), and the HTML/Markdown report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.experiment.learning import learned, learning_rows
from harnessrl.experiment.spec import COST_FIELDS, MARKER, write_json_atomic


def _finished(out: Path, spec: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for arm in spec["arms"]:
        for seed in spec["seeds"]:
            marker = out / "arms" / f"{arm['name']}-seed{seed}" / MARKER
            if marker.exists():
                by_arm.setdefault(arm["name"], []).append(json.loads(marker.read_text(encoding="utf-8")))
    return by_arm


def _first_pass(record: dict[str, Any]) -> int:
    """Returns a step's first-pass rollouts (G per group) from its metrics record."""
    if "rescue/base_rollouts" in record:
        return int(record["rescue/base_rollouts"])
    vs, rescue = record.get("rescue/executor_rollouts_vs_grpo"), int(record.get("rescue/rescue_rollouts", 0))
    if rescue and vs and vs > 1:  # records written before base_rollouts was logged
        return round(rescue / (vs - 1))
    return int(record.get("episodes", 0))


def executor_rollouts(run_dir: Path) -> dict[str, Any]:
    """Returns the executor rollouts an arm spent, from its metrics: training (first pass and
    rescue) and paired validation, and the training rollouts relative to plain GRPO's first pass."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()] if (run_dir / "metrics.jsonl").exists() else []
    rescue = sum(int(r.get("rescue/rescue_rollouts", 0)) for r in records)
    sampling = sum(int(r.get("sampling/extra_rollouts", 0)) for r in records)  # dynamic sampling's rounds
    # A step's ``episodes`` are the trained ones: a rescued group's first-pass rollouts were
    # replaced by its rescue rollouts, so the first pass is counted where rescue ran.
    first = sum(_first_pass(r) for r in records)
    validation = sum(int(r.get("rescue_anchor", {}).get("episodes", 0)) for r in records)
    state = run_dir / "checkpoints"
    finals = sorted(state.glob("step-*/trainer_state.json")) if state.exists() else []
    if finals:
        validation += int(json.loads(finals[-1].read_text(encoding="utf-8")).get("final_anchor", {}).get("episodes", 0))
    cost = {key: sum(float(r.get(key, 0)) for r in records) for key in COST_FIELDS}
    ratios = {key: float(np.mean([r[key] for r in records if key in r])) if any(key in r for r in records) else None
              for key in ("valid_group_ratio", "effective_token_ratio", "rescue/rescue_success_rate",
                          "rescue/rescue_trigger_rate")}
    return {"first_pass": first, "sampling": sampling, "rescue": rescue, "validation": validation,
            "vs_grpo": (first + sampling + rescue) / first if first else None, **{k.split("/")[-1]: v for k, v in ratios.items()},
            **cost}


def compare(out_dir: str | Path) -> dict[str, Any]:
    """Returns the comparison of the finished arms of an experiment folder: per arm, Pass@1
    in-space / out-of-space / overall (mean over seeds, pooled 95% interval) and the gain
    over the reference arm."""
    out = Path(out_dir)
    meta = json.loads((out / "experiment.json").read_text(encoding="utf-8"))
    spec = meta["spec"]
    groups = {name: group for name, group in meta["targets"]}
    finished = _finished(out, spec)
    rows: dict[str, dict[str, Any]] = {}
    units: dict[str, dict[str, dict[tuple[Any, ...], float]]] = {}  # arm -> group -> (seed, task, harness) -> Pass@1
    for arm in spec["arms"]:
        markers = finished.get(arm["name"], [])
        if markers:
            rows[arm["name"]], units[arm["name"]] = arm_row(out, spec, arm, markers, groups)
    reference = spec.get("reference") or spec["arms"][0]["name"]
    ref = rows.get(reference)
    for row in rows.values():
        for key in ("in_space", "out_of_space", "overall"):
            gain = None
            if ref is not None and row[key] is not None and ref[key] is not None:
                gain = row[key] - ref[key]
            row[f"gain_{key}"] = gain
        if ref is not None and row["arm"] != reference:
            pair_with_reference(row, units.get(row["arm"], {}), units.get(reference, {}))
        else:
            row["paired"] = None
    result = {"name": spec["name"], "reference": reference, "budget": meta["budget"],
              "warm_start": meta.get("warm_start"), "seeds": spec["seeds"],
              "eval": spec["eval"], "arms": list(rows.values()), "contrasts": contrasts(spec, units),
              "missing": [f"{a['name']}-seed{s}" for a in spec["arms"] for s in spec["seeds"]
                          if not (out / "arms" / f"{a['name']}-seed{s}" / MARKER).exists()]}
    write_json_atomic(out / "comparison.json", result)
    (out / "comparison.md").write_text(comparison_markdown(result), encoding="utf-8")
    return result


def arm_row(out: Path, spec: dict[str, Any], arm: dict[str, Any], markers: list[dict[str, Any]],
            groups: dict[str, str]) -> tuple[dict[str, Any], dict[str, dict[tuple[Any, ...], float]]]:
    """Returns one arm's row of the comparison (its seeds' ``markers``: Pass@1 per evaluation
    group with pooled intervals, rollouts and tokens spent, behaviours, what RL taught) and its
    units, side -> (seed, task, harness) -> Pass@1, for the paired tests."""
    from harnessrl.eval.evaluate import score_trajectories
    from harnessrl.eval.metrics import bootstrap_ci_mean_of_means
    from harnessrl.trajectory import load_jsonl

    config = markers[0]["config"]
    row: dict[str, Any] = {"arm": arm["name"], "description": arm.get("description", ""),
                           "design": config["design"], "train_configs": len(markers[0]["train_configs"]),
                           "pairing": config["pairing"], "k": config["k"], "rescue": config.get("rescue", "none"),
                           "router": config.get("router"), "seeds": [m["seed"] for m in markers]}
    # recounted from each run's metrics, so a folder written by an older count is read right
    spent = [executor_rollouts(out / "arms" / f"{arm['name']}-seed{m['seed']}") for m in markers]
    row["rollouts"] = {key: _mean([s.get(key) for s in spent]) for key in
                       ("first_pass", "sampling", "rescue", "validation", "vs_grpo", "valid_group_ratio",
                        "effective_token_ratio", "rescue_success_rate", "rescue_trigger_rate", *COST_FIELDS)}
    row["rollout_through"] = config.get("rollout_through", "harness")
    row["suite"] = config.get("suite", "workspace")
    row["objective"] = config.get("objective", "rl")
    pooled = []
    units: dict[str, dict[tuple[Any, ...], float]] = {}
    for m in markers:
        path = out / "arms" / f"{arm['name']}-seed{m['seed']}" / "eval" / "experiment.jsonl"
        runs = load_jsonl(path) if path.exists() else []
        pooled += runs
        # the paired sides: an external agent program counts on the out-of-space side
        for group, names in (("in_space", ("in_space",)), ("out_of_space", ("out_of_space", "external"))):
            units.setdefault(group, {}).update(
                {(m["seed"], *unit): score for unit, score in unit_table(runs, groups, *names).items()})
    row["control"] = arm.get("control")
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
    row["learning"] = None if arm.get("control") else [learned(out, arm["name"], m) for m in markers]
    return row, units


def pair_with_reference(row: dict[str, Any], mine: dict[str, dict[tuple[Any, ...], float]],
                        theirs: dict[str, dict[tuple[Any, ...], float]]) -> None:
    """Sets ``row["paired"]``: the arm against the reference on the same (seed, task, harness)
    units (the test of a gain, see the module docstring), in-space, out-of-space and all
    together; and ``row["paired_by_family"]`` / ``row["paired_by_seed"]``, the same pairs per
    task family and per seed."""
    row["paired"] = paired_sides(mine, theirs)
    # Per task family: an arm can gain on one family and lose another (on cpu_learn, RL taught
    # one family's procedure and the others' plans turned to it), which the overall difference hides.
    row["paired_by_family"] = paired_by_family(
        mine, theirs, task_families(row["suite"], {u[1] for side in mine.values() for u in side}))
    row["paired_by_seed"] = paired_split(mine, theirs, lambda unit: f"seed {unit[0]}")


def paired_sides(mine: dict[str, dict[tuple[Any, ...], float]],
                 theirs: dict[str, dict[tuple[Any, ...], float]]) -> dict[str, dict[str, Any]]:
    """Returns the paired comparison of two arms' units in-space, out-of-space and all together."""
    from harnessrl.eval.metrics import paired_comparison

    paired = {group: paired_comparison(mine.get(group, {}), theirs.get(group, {})) for group in ("in_space", "out_of_space")}
    both = {(side, *u): v for side, group in (("in", "in_space"), ("out", "out_of_space"))
            for u, v in mine.get(group, {}).items()}
    base = {(side, *u): v for side, group in (("in", "in_space"), ("out", "out_of_space"))
            for u, v in theirs.get(group, {}).items()}
    paired["all"] = paired_comparison(both, base)
    return paired


def contrasts(spec: dict[str, Any], units: dict[str, dict[str, dict[tuple[Any, ...], float]]]) -> list[dict[str, Any]]:
    """Returns the spec's contrasts (``[arm, against]``) whose arms both finished: each paired on
    their shared (seed, task, harness) units, in all and per seed."""
    out = []
    for arm, against in spec.get("contrasts") or []:
        if arm in units and against in units:
            out.append({"arm": arm, "against": against, "paired": paired_sides(units[arm], units[against]),
                        "paired_by_seed": paired_split(units[arm], units[against], lambda unit: f"seed {unit[0]}")})
    return out


def task_families(suite: str, task_ids: set[str]) -> dict[str, str]:
    """Returns task id -> the task's family in ``suite`` ("?" for an id the suite no longer
    has, e.g. a task file edited since the run; {} when the suite cannot be loaded here)."""
    from harnessrl.tasks.suite import find_suite

    try:
        tasks = find_suite(suite)
    except (ValueError, TypeError, OSError, ImportError):
        return {}
    families = {}
    for task_id in sorted(task_ids):
        try:
            families[task_id] = tasks.get(task_id).family
        except KeyError:
            families[task_id] = "?"
    return families


def paired_split(mine: dict[str, dict[tuple[Any, ...], float]], theirs: dict[str, dict[tuple[Any, ...], float]],
                 label: Callable[[tuple[Any, ...]], str | None]) -> dict[str, dict[str, Any]]:
    """Returns part -> {side: the paired comparison on the units of that side whose ``label``
    is the part} (units keyed ``(seed, task, harness)``, as in ``compare``; a unit labelled None
    is left out, and so are sides without units)."""
    from harnessrl.eval.metrics import paired_comparison

    out: dict[str, dict[str, Any]] = {}
    parts = {label(u) for units in (mine, theirs) for side in units.values() for u in side} - {None}
    for part in sorted(parts):
        for side in ("in_space", "out_of_space"):
            keep = [{u: v for u, v in units.get(side, {}).items() if label(u) == part} for units in (mine, theirs)]
            cell = paired_comparison(*keep)
            if cell["units"]:
                out.setdefault(part, {})[side] = cell
    return out


def paired_by_family(mine: dict[str, dict[tuple[Any, ...], float]], theirs: dict[str, dict[tuple[Any, ...], float]],
                     families: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Returns family -> {side: the paired comparison on that family's units of that side}."""
    return paired_split(mine, theirs, lambda unit: families.get(unit[1]))


def _mean(values: list[Any]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return float(np.mean(present)) if present else None


def unit_table(trajectories: list[Any], groups: dict[str, str], *names: str) -> dict[tuple[str, str], float]:
    """Returns (task, harness) -> Pass@1 of that unit (the mean over its runs) for the
    trajectories in the evaluation groups ``names``."""
    units: dict[tuple[str, str], list[bool]] = {}
    for t in trajectories:
        if groups.get(t.config, "out_of_space" if t.out_of_space else "in_space") in names:
            units.setdefault((t.task_id, t.config), []).append(bool(t.passed))
    return {unit: sum(runs) / len(runs) for unit, runs in units.items()}


def unit_scores(trajectories: list[Any], groups: dict[str, str], group: str) -> list[float]:
    """Returns the Pass@1 of each (task, harness) unit of one group (the mean over its runs)."""
    return list(unit_table(trajectories, groups, group).values())


def comparison_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Returns the paper-shaped table: headers and one row per arm."""
    from harnessrl.eval.report import pct, pct_ci, signed

    headers = ["arm", "design (configs)", "pairing, K", "seeds", "in-space Pass@1", "95% CI", "out-of-space Pass@1",
               "95% CI", "overall", "95% CI", f"gain in-space vs {result['reference']}", "gain overall"]
    rows = [[r["arm"], "SFT-only control" if r.get("control") else f"{r['design']} ({r['train_configs']})",
             "-" if r.get("control") else f"{r['pairing']}, K={r['k']}", len(r["seeds"]),
             pct(r["in_space"]), pct_ci(r["in_space_ci"]), pct(r["out_of_space"]), pct_ci(r["out_of_space_ci"]),
             pct(r["overall"]), pct_ci(r.get("overall_ci")), signed(r["gain_in_space"]), signed(r["gain_overall"])] for r in result["arms"]]
    # Budgets in the units that matter beside the equal steps (mean per seed): executor rollouts
    # (first pass, dynamic sampling, rescue and validation), tokens sampled and trained, wall time.
    headers += ["executor rollouts", "sampled tokens", "trained tokens", "wall min"]
    for row, r in zip(rows, result["arms"], strict=True):
        spent = r.get("rollouts") or {}
        executed = sum(spent.get(key) or 0 for key in ("first_pass", "sampling", "rescue", "validation"))
        row += [f"{executed:.0f}", *[f"{spent[key]:.0f}" if spent.get(key) is not None else "-"
                                     for key in ("tokens_generated", "trained_tokens")],
                f"{r.get('wall_time_s', 0.0) / 60 / max(1, len(r['seeds'])):.1f}"]
    if any(r.get("external") is not None for r in result["arms"]):
        # The agent programs evaluated through (the paper's Claude Code column).
        headers += ["external agents Pass@1", "95% CI"]
        for row, r in zip(rows, result["arms"], strict=True):
            row += [pct(r.get("external")), pct_ci(r.get("external_ci"))]
    if any(r.get("rollout_through", "harness") != "harness" or r.get("objective", "rl") != "rl" for r in result["arms"]):
        # Black-box arms: what the equal steps cost (see the module docstring).
        headers += ["trains through", "update", "prompt tokens", "sampled tokens", "side tokens", "trained tokens",
                    "rollout s", "update s"]
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


def _label(entry: dict[str, Any]) -> str:
    """Returns a paired table's row label: the arm, or "arm - against" for a contrast."""
    return f"{entry['arm']} - {entry['against']}" if "against" in entry else entry["arm"]


def paired_rows(result: dict[str, Any], key: str = "arms") -> tuple[list[str], list[list[str]]]:
    """Returns the paired table against the reference arm: per arm and evaluation side, the
    mean difference in Pass@1 on the shared units with its paired 95% interval, units won /
    lost, the sign-test p-value and the difference those units resolve (80% power); plus the
    tokens the arm's training sampled. ``key="contrasts"``: the same per contrast (arm - against)."""
    from harnessrl.eval.report import pct, pct_ci, signed

    headers = ["arm"]
    for side in ("in-space", "out-of-space", "all"):
        headers += [f"{side} diff", "paired 95% CI", "won/lost", "sign p", "resolvable"]
    headers += ["sampled tokens (training)"]
    rows = []
    for r in result.get(key) or []:
        if not r.get("paired"):
            continue
        row = [_label(r)]
        for group in ("in_space", "out_of_space", "all"):
            cell = r["paired"].get(group) or {}
            if not cell.get("units"):
                row += ["-", "-", "-", "-", "-"]
                continue
            resolvable = cell.get("resolvable")  # absent from results compared before it existed
            row += [signed(cell["difference"]), pct_ci(cell["difference_ci"]), f"{cell['wins']}/{cell['losses']}",
                    f"{cell['sign_test_p']:.3f}", f"±{pct(resolvable)}" if resolvable is not None else "-"]
        tokens = (r.get("rollouts") or {}).get("tokens_generated")
        row.append(f"{tokens:.0f}" if tokens is not None else "-")
        rows.append(row)
    return headers, rows


def split_rows(result: dict[str, Any], key: str = "paired_by_family", part: str = "task family",
               entries: str = "arms") -> tuple[list[str], list[list[str]]]:
    """Returns the paired table split by ``key`` (``paired_by_family``, ``paired_by_seed``): per
    arm (or contrast: ``entries="contrasts"``) and part, each side's units, mean difference with
    its paired 95% interval, and units won / lost."""
    from harnessrl.eval.report import pct_ci, signed

    headers = ["arm", part]
    for side in ("in-space", "out-of-space"):
        headers += [f"{side} units", "diff", "paired 95% CI", "won/lost"]
    rows = []
    for r in result.get(entries) or []:
        for name, sides in (r.get(key) or {}).items():
            row = [_label(r), name]
            for side in ("in_space", "out_of_space"):
                cell = sides.get(side)
                row += ["0", "-", "-", "-"] if cell is None else [
                    str(cell["units"]), signed(cell["difference"]), pct_ci(cell["difference_ci"]),
                    f"{cell['wins']}/{cell['losses']}"]
            rows.append(row)
    return headers, rows


def sections(result: dict[str, Any]) -> list[tuple[str, str, tuple[list[str], list[list[str]]]]]:
    """Returns the comparison's tables after the main one, as (heading, what it shows, (headers,
    rows)): the paired tests against the reference arm, overall, per seed and per task family,
    and what RL taught each run. ``comparison.md`` and the HTML report print the same list."""
    ref = result["reference"]
    return [
        (f"Paired against {ref}", f"Paired against {ref} on the same (seed, task, harness) units: the difference "
         "in Pass@1 points, its paired bootstrap interval, units won / lost, the exact sign test, and the "
         "smallest difference these units resolve (80% power, two-sided 5%, from the spread of the differences "
         "observed): a direction that did not resolve was smaller than that, or needs more units.",
         paired_rows(result)),
        (f"Paired against {ref}, per seed", "The same pairs per seed (each seed has its own warm start, and every "
         "arm of a seed continues it).", split_rows(result, "paired_by_seed", "seed")),
        (f"Paired against {ref}, per task family", "The same pairs per task family (a gain on one family can hide "
         "a loss on another).", split_rows(result, "paired_by_family", "task family")),
        ("Contrasts", "The experiment's contrasts (arm - against), each on the units both arms share, in the same "
         "columns as the paired table above.", paired_rows(result, "contrasts")),
        ("Contrasts, per seed", "The same contrasts per seed.",
         split_rows(result, "paired_by_seed", "seed", entries="contrasts")),
        ("What RL taught", "What RL taught each run: the first-pass training reward of the first and last quarter "
         "of its steps (mean over tasks; interval: bootstrap over tasks), the same change on the tasks drawn in "
         "both halves (free of the frontier's selection), and the weights' relative movement under RL against "
         "the warm start's from the base model.", learning_rows(result)),
    ]


def budget_line(result: dict[str, Any]) -> str:
    """Returns the one-paragraph statement of the budget every arm ran under."""
    b, warm = result["budget"], result.get("warm_start")
    start = (f"shared SFT warm start per seed ({warm['sft_warm_start_steps']} steps on {warm['sft_tasks']} "
             f"demonstrations under the {warm['design']} design), then" if warm else
             f"SFT warm start {b['sft_warm_start_steps']} steps on {b['sft_tasks']} demonstrations, then")
    tokens = f" (at most {b['sampled_tokens_at_most']} sampled tokens in the first pass)" if "sampled_tokens_at_most" in b else ""
    model = "each seed's warm start (warm-start/seed<S>/)" if warm else b["model"]
    return (f"Budget per arm: {start} {b['steps']} {b['algorithm'].upper()} steps x {b['tasks_per_step']} tasks x "
            f"{b['group_size']} rollouts{tokens}, at most {b['max_turns']} turns of {b['max_new_tokens']} tokens; model "
            f"{model}; seeds {result['seeds']}. Evaluation: {result['eval']['configs']} ({result['eval']['held_out']} "
            f"held-out), {result['eval']['tasks']} tasks per harness, k={result['eval']['k']}, temperature "
            f"{result['eval']['temperature']}.")


def comparison_markdown(result: dict[str, Any]) -> str:
    """Returns the comparison table as Markdown, with the budget it was run under and the
    paired comparison against the reference arm."""
    headers, rows = comparison_rows(result)
    lines = [f"# Experiment `{result['name']}`", "", budget_line(result),
             "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    for heading, what, (headers, rows) in sections(result):
        if rows:
            lines += ["", f"## {heading}", "", what, "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if result["missing"]:
        lines += ["", f"Not finished yet: {', '.join(result['missing'])}."]
    return "\n".join(lines) + "\n"


def learning_series(out: Path, arms: list[dict[str, Any]]) -> tuple[dict[str, list[dict[str, Any]]],
                                                                   dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Returns, per RL arm, its training curves (each metric's mean over seeds per step), its
    held-out in-space curve on the curve subset (mean over seeds per point), and the SFT-only
    control's line on that subset: the RL arms' point before step 1, which is the shared warm
    start that the control is."""
    from harnessrl.eval.report import TRAINING_CURVES, eval_curve, read_jsonl_records

    series: dict[str, list[dict[str, Any]]] = {}
    held_out: dict[str, list[dict[str, Any]]] = {}
    starts: list[float] = []
    for arm in arms:
        if arm.get("control"):
            continue
        runs = [out / "arms" / f"{arm['arm']}-seed{s}" for s in arm["seeds"]]
        per_seed = [read_jsonl_records(run / "metrics.jsonl") for run in runs]
        steps = sorted({r["step"] for records in per_seed for r in records})
        series[arm["arm"]] = [
            {"step": step, **{key: _mean([r.get(key) for records in per_seed for r in records if r["step"] == step])
                              for key in (*TRAINING_CURVES, "pass_rate")}}
            for step in steps
        ]
        curves = [eval_curve(run, records).get("in_space", []) for run, records in zip(runs, per_seed, strict=True)]
        points = sorted({p["step"] for curve in curves for p in curve})
        if points:
            held_out[arm["arm"]] = [{"step": step, "pass_at_1": _mean([p["pass_at_1"] for c in curves for p in c
                                                                       if p["step"] == step])} for step in points]
            starts += [c[0]["pass_at_1"] for c in curves if c and c[0]["step"] == -1]
    control = {"SFT-only control": float(np.mean(starts))} if starts else {}
    return series, held_out, control


def report_tables(doc: Any, result: dict[str, Any]) -> None:
    """Adds the comparison's tables to the experiment report ``doc``: the main table, then
    ``sections``."""

    doc.heading("Comparison")
    headers, rows = comparison_rows(result)
    doc.table(headers, rows)
    for heading, what, (headers, rows) in sections(result):
        if rows:
            doc.heading(heading)
            doc.para(what)
            doc.table(headers, rows)
    if result["missing"]:
        doc.para(f"Not finished yet: {', '.join(result['missing'])}.")


def comparison_figure(arms: list[dict[str, Any]]) -> Any:
    """Returns the bar chart of Pass@1 per arm: in-space, out-of-space (with their pooled 95%
    intervals) and overall."""
    from harnessrl.eval.report import pyplot

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
    return fig


def write_experiment_report(out_dir: str | Path) -> Path:
    """(Re)builds DIR/report/ of an experiment: the comparison table, bars, learning curves,
    per-level heatmaps and distance curves per arm, behaviours, sample transcripts."""
    from harnessrl.eval.behaviour import BEHAVIOURS
    from harnessrl.eval.report import (
        Doc,
        curve_keys,
        eval_sections,
        make_decoder,
        pct,
        plot_distance,
        plot_learning_curves,
        plot_level_heatmap,
    )
    from harnessrl.trajectory import load_jsonl

    out = Path(out_dir)
    result = compare(out)
    spec = json.loads((out / "experiment.json").read_text(encoding="utf-8"))["spec"]
    doc = Doc(f"Experiment {result['name']}", out / "report")
    if spec.get("description"):
        doc.para(spec["description"])
    doc.para(budget_line(result))
    report_tables(doc, result)
    arms = result["arms"]
    if arms:
        doc.figure("comparison", comparison_figure(arms), "Pass@1 per arm (mean over seeds; bars: pooled 95% bootstrap interval)")
        series, held_out, control = learning_series(out, arms)
        keys = curve_keys([r for records in series.values() for r in records])
        if keys:  # none until an RL arm has run a step
            doc.heading("Learning curves")
            doc.figure("learning-curves", plot_learning_curves(series, keys),
                       "Training rollouts per step, mean over seeds: the first pass's mean reward (before dynamic "
                       "sampling), the trained groups' reward and valid-group ratio, the task frontier's size")
        if held_out:
            doc.figure("held-out-curve", plot_learning_curves(held_out, ["pass_at_1"], lines=control),
                       "Held-out in-space Pass@1 on the fixed curve subset (eval.curve_every), mean over seeds; "
                       "step 0 is the shared warm start, dashed: the SFT-only control (that warm start, no RL)")
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
