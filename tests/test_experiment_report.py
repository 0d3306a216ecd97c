"""Experiments and reports: experiment files fail with clear errors; a tiny two-arm experiment
trains, evaluates, skips finished arms on re-run, resumes a lost one, and writes the table,
the plots and an HTML report that opens in headless Chromium without errors."""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harnessrl.eval.report import Doc
from harnessrl.experiment import load_experiment

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
REQUIRE_CHROMIUM = bool(os.environ.get("CI")) or os.environ.get("HARNESSRL_REQUIRE_CHROMIUM") == "1"


# --- headless Chromium ------------------------------------------------------------------------


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser_check(page: Path) -> dict:
    """Opens ``page`` in headless Chromium and returns the page's own check (script errors,
    broken images) plus the console errors Chromium logged."""
    binary = chromium()
    if binary is None:
        if REQUIRE_CHROMIUM:
            pytest.fail("chromium is required here (CI or HARNESSRL_REQUIRE_CHROMIUM=1): apt-get install chromium")
        pytest.skip("chromium is not installed (apt-get install chromium; `make system-deps` does it as root)")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
             "--dump-dom", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    marker = 'data-report-check="'
    assert marker in done.stdout, "the page's load check did not run"
    raw = done.stdout.split(marker, 1)[1].split('"', 1)[0]
    check = json.loads(raw.replace("&quot;", '"').replace("&amp;", "&"))
    check["console_errors"] = [line for line in done.stderr.splitlines() if "CONSOLE" in line and "rror" in line]
    return check


def test_browser_check_catches_a_script_error_and_a_missing_image(tmp_path):
    doc = Doc("broken", tmp_path / "broken")
    doc.para("x")
    doc.blocks.append(("figure", ("img/missing.png", "not there")))
    page = doc.write()
    page.write_text(page.read_text().replace("</body>", "<script>undefinedFunction();</script></body>"))
    check = browser_check(page)
    assert check["broken_images"] == ["img/missing.png"]
    assert any("undefinedFunction" in e for e in check["errors"])


def test_run_report_is_built_from_the_files_of_a_run(tmp_path):
    from harnessrl.eval.report import write_run_report
    from harnessrl.harness.harness import Harness, HarnessLimits
    from harnessrl.policy.scripted import OraclePolicy, RandomPolicy
    from harnessrl.rl.config import load_config
    from harnessrl.rollout.engine import RolloutEngine, RolloutJob
    from harnessrl.tasks.suite import load_suite
    from harnessrl.trajectory import save_jsonl

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    cfg = load_config(preset="quick", overrides={"run_dir": str(run)})
    (run / "config.json").write_text(cfg.model_dump_json())
    limits = HarnessLimits(max_turns=6, max_new_tokens=16_384, context_tokens=262_144)
    tasks = list(load_suite("workspace").tasks("test", limit=2, seed=1))
    jobs = [RolloutJob(t, Harness.named(code, limits)) for code in ("S1-T2-O1-C1-W0", "S0-T0-O0-C0-W1", "codex-like") for t in tasks]
    for name, policy in (("final", OraclePolicy()), ("base", RandomPolicy(seed=0))):
        trajectories, _ = RolloutEngine(policy).run(jobs)
        save_jsonl(trajectories, run / "eval" / f"{name}.jsonl")
    records = [{"step": s, "reward_mean": 0.25 * s, "pass_rate": 0.25 * s, "no_signal_fraction": 0.5, "trained_samples": 4,
                "format_errors": 1, "pairs": [["t1", "S0-T0-O0-C0-W0"]], "eval": {"in_space": {"pass_at_1": 0.1 * s}}}
               for s in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_run_report(run)
    html = page.read_text()
    for name in ("learning-curves", "eval-curve", "final-per-config", "final-levels", "final-distance"):
        assert (run / "report" / "img" / f"{name}.png").stat().st_size > 1000, name
    assert "before (overall)" in html  # base vs final behaviours
    assert "[system]" in html and "[task]" in html and "[policy]" in html and "[observation]" in html
    markdown = (run / "report" / "report.md").read_text()
    assert "| in-space (held-out) | 100.0 |" in markdown and "![Pass@1 per harness" in markdown
    check = browser_check(page)
    assert check["errors"] == [] and check["broken_images"] == [] and check["images"] >= 5


# --- experiment files -------------------------------------------------------------------------


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
name: t
base: {preset: quick}
arms:
  - {name: single, design: single, pairing: repeat, k: 2}
  - {name: oa, design: orthogonal}
"""


def test_the_paper_and_cpu_experiments_load_with_the_papers_arms():
    paper = load_experiment(CONFIGS / "paper_ablation.yaml")
    arms = {a.name: a for a in paper.arms}
    assert {a.design for a in paper.arms} == {"single", "first-order", "orthogonal", "random", "full"}
    assert sorted(a.k for a in paper.arms if a.design == "orthogonal" and a.pairing == "neighbour") == [1, 2, 4]
    assert arms["orthogonal-repeat2"].pairing == "repeat" and arms["orthogonal-random-pairing"].pairing == "random"
    assert arms["random-18"].design_n == 18 and len(paper.seeds) >= 3 and paper.reference == "single-H0"
    assert paper.base["preset"] == "paper" and paper.eval.held_out == 18
    cpu = load_experiment(CONFIGS / "cpu_ablation.yaml")
    arms = {a.name: a for a in cpu.arms}
    assert {a.design for a in cpu.arms if a.design} == {"single", "first-order", "random", "orthogonal"}
    assert sorted(a.k for a in cpu.arms if a.design == "orthogonal") == [1, 2]
    assert arms["sft-only"].control == "sft-only" and all(a.rescue in (None, "none") for a in cpu.arms)
    assert cpu.warm_start["sft_warm_start_steps"] > 0 and len(cpu.seeds) == 2 and cpu.reference == "single-H0"
    assert cpu.eval.held_out * cpu.eval.tasks >= 96 and 2 * cpu.eval.tasks >= 24  # episodes per arm and seed
    # the directions beside the reference: RL over the control, the design, the pairing
    assert ("orthogonal-18", "sft-only") in cpu.contrasts and ("orthogonal-18", "random-18") in cpu.contrasts
    assert ("orthogonal-18", "orthogonal-18-k1") in cpu.contrasts and ("orthogonal-18", "orthogonal-K1") in paper.contrasts
    assert ("harness-s-space", "grpo-h0-rescue") in load_experiment(CONFIGS / "harness_s_cpu.yaml").contrasts
    # the papers' directions re-measured on RL that learns: cpu_learn.yaml's setting, unchanged
    learn = load_experiment(CONFIGS / "cpu_learn.yaml")
    assert cpu.base == learn.base and cpu.warm_start == learn.warm_start
    # the same evaluation, with one real agent program added to the out-of-space targets
    assert cpu.eval.model_copy(update={"configs": learn.eval.configs}) == learn.eval
    assert cpu.eval.configs == learn.eval.configs + ",ext:mini-swe-agent"
    rl = {a.name: a for a in learn.arms}["rl-frontier"]
    assert (arms["orthogonal-18"].design, arms["orthogonal-18"].pairing, arms["orthogonal-18"].k) == (rl.design, rl.pairing, rl.k)


def test_the_learning_experiment_runs_the_frontier_against_the_sft_only_control(tmp_path):
    from harnessrl.experiment.spec import arm_config, executor_rollouts_bound, warm_start_config

    learn = load_experiment(CONFIGS / "cpu_learn.yaml")
    arms = {a.name: a for a in learn.arms}
    assert arms["sft-only"].control == "sft-only" and learn.reference == "sft-only" and len(learn.seeds) == 2
    cfg = arm_config(learn, arms["rl-frontier"], learn.seeds[0], tmp_path)
    assert cfg.frontier and cfg.dynamic_sampling_rounds >= 1 and cfg.steps >= 30 and cfg.k == 2
    # The sweep's choice: LoRA adapters under RL over a fully fine-tuned shared warm start.
    assert cfg.lora_rank == 16 and warm_start_config(learn, learn.seeds[0], tmp_path).lora_rank == 0
    # the same numbers with less memory: the warm start and the RL arm recompute their layers
    assert cfg.activation_checkpointing and warm_start_config(learn, learn.seeds[0], tmp_path).activation_checkpointing
    # the recorded warm starts and controls ran under the padding mask (the quick preset's causal
    # mask rounds the attention backward otherwise), so a rerun of the file reuses them
    assert not cfg.causal_mask_only and not warm_start_config(learn, learn.seeds[0], tmp_path).causal_mask_only
    assert cfg.model == str(tmp_path / "warm-start" / "seed0" / "checkpoints" / "step-000000" / "model")
    assert learn.eval.held_out * learn.eval.tasks >= 96  # paired in-space units per seed
    assert cfg.eval_every == learn.eval.curve_every > 0 and cfg.eval_base  # the learning curve's points
    bound = executor_rollouts_bound(cfg)
    assert bound["first_pass"] == cfg.steps * cfg.tasks_per_step * cfg.group_size
    assert bound["sampling_at_most"] == bound["first_pass"] * cfg.dynamic_sampling_rounds and bound["rescue_at_most"] == 0
    # the rescue arm: the same RL setting, and what stays all-fail after dynamic sampling goes to random space siblings
    rescued = arm_config(learn, arms["rl-frontier-rescue"], learn.seeds[0], tmp_path)
    assert rescued.model_dump(exclude={"rescue", "siblings", "router", "rescue_k", "run_dir"}) == cfg.model_dump(
        exclude={"rescue", "siblings", "router", "rescue_k", "run_dir"})
    assert (rescued.rescue, rescued.siblings, rescued.router, rescued.rescue_k) == ("siblings", "space", "random", 4)
    assert executor_rollouts_bound(rescued)["validation"] == 0  # random routing runs no paired validation
    # cpu_learn_wide.yaml: that rescue arm with 6 tasks per step, on the same warm starts, controls and units
    wide = load_experiment(CONFIGS / "cpu_learn_wide.yaml")
    assert {**wide.base, "tasks_per_step": 4} == learn.base and wide.base["tasks_per_step"] == 6
    assert wide.warm_start == learn.warm_start and wide.eval == learn.eval and wide.seeds == learn.seeds
    widened = arm_config(wide, {a.name: a for a in wide.arms}["rl-frontier-rescue-6"], learn.seeds[0], tmp_path)
    assert widened.model_dump(exclude={"tasks_per_step", "run_dir"}) == rescued.model_dump(
        exclude={"tasks_per_step", "run_dir"})


@pytest.mark.parametrize(("text", "message"), [
    ("name: t\narms: [ {name: a, design: single", "not valid YAML"),
    (GOOD.replace("k: 2}", "k: 2, steps: 5}"), r"(?s)arms\.0\.steps: unknown arm field.*budget fields go in base"),
    (GOOD.replace("base: {preset: quick}", "base: {preset: quick, seed: 3}"), r"base\.seed: set by the experiment"),
    (GOOD.replace("base: {preset: quick}", "base: {preset: quick, stepz: 3}"), r"(?s)arm 'single'.*field base\.stepz: unknown field; valid fields are"),
    (GOOD + "reference: nope\n", r"field reference: 'nope' is not an arm"),
    (GOOD + "contrasts: [[oa, nope]]\n", r"field contrasts\.0: 'nope' is not an arm; name two of single, oa"),
    (GOOD + "contrasts: [[oa, single], [oa, oa]]\n", r"field contrasts\.1: an arm against itself"),
    (GOOD.replace("pairing: repeat, k: 2", "k: 2"), r"field k: K=2 with neighbour pairing needs 2.*pairing: repeat"),
    (GOOD.replace("name: oa", "name: single"), "arm names repeat"),
    (GOOD + "colour: red\n", r"field colour: unknown field"),
    (GOOD + "warm_start: {learning_rate: 0.1}\n", r"field warm_start\.learning_rate: a shared warm start may set only"),
    (GOOD + "warm_start: {design: orthogonal, sft_warm_start_steps: 0}\n", r"warm_start\.sft_warm_start_steps: .*at least"),
    (GOOD.replace("- {name: single, design: single, pairing: repeat, k: 2}", "- {name: single, control: sft-only}")
     .replace("- {name: oa, design: orthogonal}", "- {name: oa, control: sft-only}"), "every arm is a control"),
])
def test_bad_experiment_files_name_file_field_and_fix(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as info:
        load_experiment(path)
    assert str(path) in str(info.value)


# --- a tiny experiment end to end ---------------------------------------------------------------

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")


def tiny_experiment(tmp_path, model):
    return write(tmp_path, f"""
name: tiny
base:
  preset: quick
  model: {model}
  steps: 1
  tasks_per_step: 1
  group_size: 2
  max_turns: 1
  max_new_tokens: 8
  max_train_tasks: 4
  sft_warm_start_steps: 1
  sft_tasks: 1
  learning_rate: 0.001
  save_every: 1
seeds: [5]
reference: single
eval: {{configs: "held-out,codex-like", held_out: 2, tasks: 1}}
arms:
  - {{name: single, design: single, pairing: repeat, k: 2}}
  - {{name: oa, design: orthogonal, pairing: neighbour, k: 2}}
""")


def test_tiny_experiment_produces_table_plots_and_a_report_and_resumes(tmp_path, tiny_model):
    from harnessrl.experiment import run_experiment

    spec = load_experiment(tiny_experiment(tmp_path, tiny_model))
    out = tmp_path / "out"
    lines = []
    result = run_experiment(spec, out, log=lines.append)
    arms = {row["arm"]: row for row in result["arms"]}
    assert set(arms) == {"single", "oa"} and result["missing"] == []
    assert arms["single"]["design"] == "single" and arms["single"]["train_configs"] == 1
    assert arms["oa"]["train_configs"] == 18 and arms["single"]["gain_in_space"] == 0.0
    for row in arms.values():
        assert 0.0 <= row["in_space"] <= 1.0 and 0.0 <= row["out_of_space"] <= 1.0
        assert row["overall"] == pytest.approx((row["in_space"] + row["out_of_space"]) / 2)
        assert row["overall_ci"][0] <= row["overall"] <= row["overall_ci"][1]
    # the same evaluation for both arms: the same harnesses and tasks
    evaluated = []
    for arm in ("single", "oa"):
        marker = json.loads((out / "arms" / f"{arm}-seed5" / "arm_result.json").read_text())
        evaluated.append(sorted(marker["results"]["per_config"]))
        assert marker["config"]["steps"] == 1 and marker["config"]["group_size"] == 2  # matched budget
    assert evaluated[0] == evaluated[1] and len(evaluated[0]) == 3
    table = (out / "comparison.md").read_text()
    assert "| single |" in table and "| oa |" in table and "gain in-space vs single" in table
    images = sorted(p.name for p in (out / "report" / "img").glob("*.png"))
    assert {"comparison.png", "learning-curves.png", "distance.png"} <= set(images)
    assert (out / "arms" / "oa-seed5" / "report" / "index.html").exists()  # every run has its report
    check = browser_check(out / "report" / "index.html")
    assert check["errors"] == [] and check["broken_images"] == [] and check["console_errors"] == []
    assert check["images"] >= 4
    # re-running skips both arms; losing one arm's marker redoes only that arm's evaluation
    lines.clear()
    run_experiment(spec, out, log=lines.append)
    assert sum("skipped" in line for line in lines) == 2
    (out / "arms" / "oa-seed5" / "arm_result.json").unlink()
    lines.clear()
    again = run_experiment(spec, out, log=lines.append)
    assert any("[single-seed5] finished earlier: skipped" in line for line in lines)
    assert any("[oa-seed5] resumed from" in line for line in lines)  # trained weights reloaded, not retrained
    assert {row["arm"]: row["in_space"] for row in again["arms"]} == {r["arm"]: r["in_space"] for r in result["arms"]}


def test_shared_warm_start_sft_only_control_and_paired_tests(tmp_path, tiny_model):
    """Every arm continues one warm start per seed (trained once); the SFT-only control is that
    warm start evaluated with no RL step; each arm is paired with the reference on the same units."""
    from harnessrl.experiment import run_experiment, warm_start_model
    from harnessrl.rl.checkpoint import latest_checkpoint

    text = tiny_experiment(tmp_path, tiny_model).read_text().replace("  sft_warm_start_steps: 1\n", "")
    text = text.replace("seeds: [5]", "seeds: [5, 6]\nwarm_start: {design: orthogonal, sft_warm_start_steps: 1}")
    text += "  - {name: sft-only, control: sft-only}\n"
    text = text.replace("arms:\n", "contrasts: [[oa, sft-only]]\narms:\n")
    spec = load_experiment(write(tmp_path, text))
    out = tmp_path / "out"
    lines = []
    # the control alone: a table and a report with no learning curve yet
    alone = run_experiment(spec, tmp_path / "control-only", log=lambda m: None, seeds=[5], arms=["sft-only"])
    assert [row["arm"] for row in alone["arms"]] == ["sft-only"]
    assert "Learning curves" not in (tmp_path / "control-only" / "report" / "index.html").read_text()
    # one arm of one seed first (--seeds 6 --arms oa): only its warm start and its run
    first = run_experiment(spec, out, log=lines.append, seeds=[6], arms=["oa"])
    assert [line.split("]")[0] for line in lines if "training:" in line or "SFT warm start" in line] == [
        "[warm-start-seed6", "[oa-seed6"]
    assert [row["arm"] for row in first["arms"]] == ["oa"] and len(first["missing"]) == 5
    with pytest.raises(ValueError, match="no seed or arm 7, nope"):
        run_experiment(spec, out, seeds=[7], arms=["nope"])
    lines.clear()
    result = run_experiment(spec, out, log=lines.append)
    assert result["missing"] == [] and [line for line in lines if "SFT warm start" in line] == [
        "[warm-start-seed5] SFT warm start: 1 steps on 1 demonstrations under the orthogonal design, shared by "
        "every arm of seed 5"]
    order = [line.split("]")[0] for line in lines if "training:" in line]  # seed by seed
    assert order == [f"[{a}-seed{s}" for s in (5, 6) for a in ("single", "oa", "sft-only") if (a, s) != ("oa", 6)]
    assert "[oa-seed6] finished earlier: skipped" in lines
    for seed in (5, 6):
        warm = warm_start_model(out, seed)
        assert (warm / "config.json").exists()
        for arm in ("single", "oa", "sft-only"):
            marker = json.loads((out / "arms" / f"{arm}-seed{seed}" / "arm_result.json").read_text())
            assert marker["config"]["model"] == str(warm) and marker["config"]["sft_warm_start_steps"] == 0
        # the control ran no RL step: its weights are the warm start's, bit for bit
        control = latest_checkpoint(out / "arms" / f"sft-only-seed{seed}")
        trained = transformers.AutoModelForCausalLM.from_pretrained(control / "model").state_dict()
        start = transformers.AutoModelForCausalLM.from_pretrained(warm).state_dict()
        assert all(torch.equal(trained[name], start[name]) for name in start)
        assert not (out / "arms" / f"sft-only-seed{seed}" / "metrics.jsonl").exists()
    arms = {row["arm"]: row for row in result["arms"]}
    assert arms["sft-only"]["control"] == "sft-only" and arms["single"]["paired"] is None
    for name in ("oa", "sft-only"):
        paired = arms[name]["paired"]
        # 2 seeds x 1 task x (2 held-out + codex-like) units, each scored by both arms
        assert paired["in_space"]["units"] == 4 and paired["out_of_space"]["units"] == 2 and paired["all"]["units"] == 6
        for cell in paired.values():
            assert cell["wins"] + cell["losses"] + cell["ties"] == cell["units"]
            assert 0.0 <= cell["sign_test_p"] <= 1.0
            assert cell["resolvable"] is None or cell["resolvable"] > 0
        assert paired["in_space"]["difference"] == pytest.approx(arms[name]["in_space"] - arms["single"]["in_space"])
        # the same pairs split by task family add up to the whole
        families = arms[name]["paired_by_family"]
        for side in ("in_space", "out_of_space"):
            for count in ("units", "wins", "losses"):
                assert sum(c[side][count] for c in families.values() if side in c) == paired[side][count]
        # and split by seed: one part per seed, each with its own half of the units
        seeds = arms[name]["paired_by_seed"]
        assert sorted(seeds) == ["seed 5", "seed 6"]
        assert [seeds[s]["in_space"]["units"] for s in sorted(seeds)] == [2, 2]
        for side in ("in_space", "out_of_space"):
            for count in ("wins", "losses"):
                assert sum(c[side][count] for c in seeds.values()) == paired[side][count]
    def movement(model_dir, start_dir):  # over the parameters (the tied embedding once), in float64
        moved = dict(transformers.AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
        start = dict(transformers.AutoModelForCausalLM.from_pretrained(start_dir).named_parameters())
        diff = sum(float(((moved[n].double() - p.double()) ** 2).sum()) for n, p in start.items())
        return (diff / sum(float((p.double() ** 2).sum()) for p in start.values())) ** 0.5

    assert arms["sft-only"]["learning"] is None
    for name in ("single", "oa"):
        for entry in arms[name]["learning"]:
            warm = warm_start_model(out, entry["seed"])
            final = latest_checkpoint(out / "arms" / f"{name}-seed{entry['seed']}") / "model"
            assert entry["moved"] == pytest.approx(movement(final, warm), rel=1e-4, abs=1e-12)  # 0 for a dead step
            assert entry["warm_start_moved"] == pytest.approx(movement(warm, tiny_model), rel=1e-4)
            assert entry["warm_start_moved"] > 0
            assert entry["reward"] is None and entry["same_tasks"] is None  # one RL step: no first and last part
    # the contrast beside the reference: oa against the control on the same units
    (contrast,) = result["contrasts"]
    assert (contrast["arm"], contrast["against"]) == ("oa", "sft-only")
    assert contrast["paired"]["in_space"]["units"] == 4 and contrast["paired"]["all"]["units"] == 6
    assert contrast["paired"]["in_space"]["difference"] == pytest.approx(arms["oa"]["in_space"] - arms["sft-only"]["in_space"])
    assert sum(c["in_space"]["units"] for c in contrast["paired_by_seed"].values()) == 4
    table = (out / "comparison.md").read_text()
    assert "## Contrasts" in table and "| oa - sft-only | " in table and "| oa - sft-only | seed 6 |" in table
    assert "What RL taught each run" in table
    assert "Paired against single" in table and "| sft-only | SFT-only control |" in table
    assert "The same pairs per task family" in table
    assert "Paired against single, per task family" in (out / "report" / "index.html").read_text()
    assert "## Paired against single, per seed" in table and "| oa | seed 6 |" in table
    assert "shared SFT warm start per seed (1 steps on 1 demonstrations under the orthogonal design)" in table
    assert "model each seed's warm start (warm-start/seed<S>/)" in table and "seed5/checkpoints" not in table
    # a second run finds the warm starts and every arm done
    lines.clear()
    run_experiment(spec, out, log=lines.append)
    assert sum("skipped" in line for line in lines) == 6 and not any("SFT warm start" in line for line in lines)
    # finished arms carried to a folder without the warm starts (their checkpoints left behind):
    # nothing is pending, so no warm start is trained again, and the table is the same
    shutil.rmtree(out / "warm-start")
    for run in (out / "arms").iterdir():
        shutil.rmtree(run / "checkpoints", ignore_errors=True)
    lines.clear()
    again = run_experiment(spec, out, log=lines.append)
    assert sum("skipped" in line for line in lines) == 6 and not any("SFT warm start" in line for line in lines)
    assert not (out / "warm-start").exists()
    assert {r["arm"]: r["paired"] for r in again["arms"]} == {r["arm"]: r["paired"] for r in result["arms"]}


def test_paired_comparison_per_task_family_shows_a_trade_the_overall_difference_hides():
    """An arm that wins every search unit and loses as many text units ties overall; per family
    the trade shows, and each family's pairs keep their own counts."""
    from harnessrl.eval.metrics import paired_comparison
    from harnessrl.eval.report import pct_ci
    from harnessrl.experiment.compare import (
        paired_by_family,
        paired_rows,
        split_rows,
        task_families,
    )

    search, text = "ws-test-search-2-0", "ws-test-text-4-0"
    families = task_families("workspace", {search, text, "ws-test-nosuchfamily-1-0"})
    assert families[search] == "search" and families[text] == "text"
    assert families["ws-test-nosuchfamily-1-0"] == "?"  # an id the suite does not have
    assert task_families("no-such-suite", {search}) == {}
    harnesses = [f"S{i}-T0-O0-C0-W0" for i in range(3)]
    control = {(0, task, h): 0.5 for task in (search, text) for h in harnesses}
    arm = {**{(0, search, h): 1.0 for h in harnesses}, **{(0, text, h): 0.0 for h in harnesses}}
    split = paired_by_family({"in_space": arm}, {"in_space": control}, families)
    assert set(split) == {"search", "text"}  # no units, no row
    assert split["search"]["in_space"]["wins"] == 3 and split["search"]["in_space"]["losses"] == 0
    assert split["text"]["in_space"]["losses"] == 3 and split["text"]["in_space"]["difference"] == pytest.approx(-0.5)
    assert "out_of_space" not in split["search"]
    headers, rows = split_rows({"arms": [{"arm": "rl", "paired_by_family": split}]})
    assert [row[:2] for row in rows] == [["rl", "search"], ["rl", "text"]]
    assert rows[0][headers.index("won/lost")] == "3/0" and rows[1][headers.index("won/lost")] == "0/3"
    # The overall table: 3 won and 3 lost of 6 tie at 0.0, with the difference these units resolve.
    whole = paired_comparison(arm, control)
    assert whole["difference"] == 0.0 and whole["resolvable"] == pytest.approx(2.8016 * 0.5477 / 6**0.5, rel=1e-3)
    headers, rows = paired_rows({"arms": [{"arm": "rl", "paired": {"in_space": whole}}]})
    assert headers[1:6] == ["in-space diff", "paired 95% CI", "won/lost", "sign p", "resolvable"]
    assert rows[0][1:6] == ["+0.0", pct_ci(whole["difference_ci"]), "3/3", "1.000", "±62.6"]
    assert rows[0][6:11] == ["-"] * 5  # no out-of-space units


def test_report_command_rebuilds_an_experiment_report(tmp_path, tiny_model):
    from harnessrl.cli import main

    out = tmp_path / "out"
    assert main(["experiment", str(tiny_experiment(tmp_path, tiny_model)), "--out", str(out)]) == 0
    (out / "report" / "index.html").unlink()
    assert main(["report", str(out)]) == 0
    assert "Comparison" in (out / "report" / "index.html").read_text()
    assert main(["report", str(out / "arms" / "single-seed5")]) == 0
    run_page = (out / "arms" / "single-seed5" / "report" / "index.html").read_text()
    assert "Learning curves" in run_page and "[policy]" in run_page  # transcripts carry span labels


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_eval_loads_full_and_lora_checkpoints_of_a_run(tmp_path, tiny_model, lora_rank):
    from harnessrl.cli import main
    from harnessrl.rl.checkpoint import load_checkpoint_policy
    from harnessrl.rl.config import load_config
    from harnessrl.rl.loop import train

    if lora_rank:
        pytest.importorskip("peft", reason="peft is installed by `make test`")
    run = tmp_path / "run"
    overrides = {"model": str(tiny_model), "run_dir": str(run), "steps": 1, "tasks_per_step": 1, "group_size": 2,
                 "max_turns": 1, "max_new_tokens": 8, "max_train_tasks": 4, "sft_warm_start_steps": 1, "sft_tasks": 1,
                 "learning_rate": 1e-3, "sft_learning_rate": 1e-2, "eval_base": False, "eval_held_out": 0,
                 "eval_out_of_space": False, "design": "first-order", "lora_rank": lora_rank}
    train(load_config(preset="quick", overrides=overrides), log=lambda m: None)
    policy, config = load_checkpoint_policy(run)
    assert config["design"] == "first-order" and policy.name.endswith("step-000001")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    loaded = policy.model.state_dict()
    assert set(loaded) == set(base)  # a LoRA adapter is merged into plain weights
    assert any(not torch.equal(base[k], loaded[k]) for k in base)  # the trained weights, not the base model
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(run), "--configs", "train,codex-like", "--limit", "1", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["design"] == "first-order" and len(results["per_group"]["train"]) > 0
    assert sorted(results["per_config"]) == sorted([*config_codes(config), "codex-like"])


def config_codes(config):
    from harnessrl.design import make_design
    from harnessrl.harness.registry import default_space

    return make_design(default_space(), config["design"], seed=config["seed"]).codes


def test_jobs_split_seeds_over_workers_and_a_failed_worker_keeps_the_rest(tmp_path, tiny_model, capsys):
    """`--jobs 2` runs each seed in its own worker process (one log each, the cores shared out),
    writes one table of both; a worker that fails names its log, the other's arms are kept, and
    a re-run resumes only what is missing."""
    from harnessrl.cli import main

    path = write(tmp_path, tiny_experiment(tmp_path, tiny_model).read_text().replace("seeds: [5]", "seeds: [5, 6]"))
    out = tmp_path / "out"
    # a file where seed 6's oa run folder goes: that worker fails on its second arm
    bad = out / "arms" / "oa-seed6"
    bad.parent.mkdir(parents=True)
    bad.write_text("not a folder")
    assert main(["experiment", str(path), "--out", str(out), "--jobs", "2"]) == 1
    err = capsys.readouterr().err
    assert "worker seed-6 exited with 1" in err and str(out / "logs" / "seed-6.log") in err
    assert "FileExistsError" in err  # the worker's own last line
    seed5 = (out / "logs" / "seed-5.log").read_text()
    seed6 = (out / "logs" / "seed-6.log").read_text()
    assert "[single-seed5] training" in seed5 and "[oa-seed5] training" in seed5 and "seed6" not in seed5
    assert "[single-seed6] training" in seed6 and "seed5" not in seed6
    table = json.loads((out / "comparison.json").read_text())
    assert table["missing"] == ["oa-seed6"]  # the table of what finished is written anyway
    bad.unlink()
    assert main(["experiment", str(path), "--out", str(out), "--jobs", "2"]) == 0
    assert "[single-seed5] finished earlier: skipped" in (out / "logs" / "seed-5.log").read_text()
    assert "[oa-seed6] training" in (out / "logs" / "seed-6.log").read_text()
    table = json.loads((out / "comparison.json").read_text())
    assert table["missing"] == [] and {row["arm"]: row["seeds"] for row in table["arms"]} == {"single": [5, 6], "oa": [5, 6]}
    with pytest.raises(SystemExit, match="--jobs: at least 1"):
        main(["experiment", str(path), "--out", str(out), "--jobs", "0"])



# A valid value other than the default for each field that only RL steps read.
RL_STEP_VALUES = {
    "tasks_per_step": 2, "group_size": 3,
    "learning_rate": 0.05, "warmup_steps": 3, "lr_schedule": "cosine", "weight_decay": 0.1, "ppo_epochs": 2,
    "mini_batches": 2, "clip_low": 0.1, "clip_high": 0.3, "aggregation": "token_sum_norm", "loss_norm_tokens": 64,
    "policy_loss": "gspo", "advantage": "rloo", "scale_std": False, "importance_cap": 3.0, "kl_coef": 0.1,
    "kl_estimator": "k1", "entropy_coef": 0.01, "skip_no_signal_groups": False, "dynamic_sampling_rounds": 1,
    "temperature": 0.5, "top_p": 0.9, "frontier": True, "frontier_decay": 0.5, "frontier_prior": 2.0,
    "frontier_low": 0.2, "frontier_high": 0.8, "frontier_explore": 0.5,
    # a Harness-S file sets these in its base (harness_s_cpu.yaml), its arms the rescue itself
    "rescue_k": 3, "rescue_validation_tasks": 2, "reanchor_every": 5, "mixture_fraction": 0.25, "router_per_family": True,
}


def test_a_finished_run_is_the_same_run_in_a_moved_or_copied_experiment_folder():
    from harnessrl.experiment.spec import changed_fields
    from harnessrl.rl.config import TrainConfig

    warm = "warm-start/seed0/checkpoints/step-000000/model"
    cfg = TrainConfig(run_dir="experiments/wide/arms/oa-seed0", model=f"experiments/wide/{warm}")
    recorded = {**cfg.model_dump(), "run_dir": "/old/learn/arms/oa-seed0", "model": f"/old/learn/{warm}"}
    assert changed_fields(recorded, cfg) == []
    assert changed_fields({**recorded, "model": "/old/another-model"}, cfg) == ["model"]
    assert changed_fields({**recorded, "model": f"/old/other/{warm}"}, cfg) == ["model"]  # another folder's
    assert changed_fields({**recorded, "run_dir": "/old/learn/arms/other-seed0"}, cfg) == ["run_dir"]


def test_a_warm_start_reads_no_rl_setting_so_an_rl_sweep_reuses_it(tmp_path, tiny_model):
    """Trained with every RL_STEP_FIELDS field changed, a seed's warm start has the same weights
    bit for bit; so a file whose RL settings changed reuses the warm start and the SFT-only
    control it finds, while a field the warm start reads makes it another run, named in the error."""
    from harnessrl.experiment import run_experiment, warm_start_model
    from harnessrl.experiment.run import shared_warm_start
    from harnessrl.experiment.spec import RL_STEP_FIELDS
    from harnessrl.rl.config import TrainConfig

    assert set(RL_STEP_VALUES) == set(RL_STEP_FIELDS)
    defaults = TrainConfig()
    assert all(getattr(defaults, name) != value for name, value in RL_STEP_VALUES.items())
    text = tiny_experiment(tmp_path, tiny_model).read_text().replace("  sft_warm_start_steps: 1\n", "")
    text = text.replace("seeds: [5]", "warm_start: {design: orthogonal, sft_warm_start_steps: 1}\nseeds: [5]")
    text = text.replace("  - {name: single, design: single, pairing: repeat, k: 2}\n", "")
    text = text.replace("reference: single", "reference: sft-only") + "  - {name: sft-only, control: sft-only}\n"
    spec = load_experiment(write(tmp_path, text))
    batch = "  tasks_per_step: 1\n  group_size: 2\n"
    assert batch in text
    swept = load_experiment(write(tmp_path, text.replace(batch, "").replace("  learning_rate: 0.001\n", "  " + "\n  ".join(
        f"{name}: {json.dumps(value)}" for name, value in RL_STEP_VALUES.items()) + "\n")))
    assert swept.base["frontier"] is True and swept.base["learning_rate"] == 0.05
    first, second = tmp_path / "first", tmp_path / "second"
    for one, out in ((spec, first), (swept, second)):
        shared_warm_start(one, 5, out, log=lambda m: None)
    a = transformers.AutoModelForCausalLM.from_pretrained(warm_start_model(first, 5)).state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(warm_start_model(second, 5)).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    # the original file's control, then the swept file finds the warm start and the control done
    run_experiment(spec, first, log=lambda m: None, arms=["sft-only"])
    lines = []
    run_experiment(swept, first, log=lines.append, arms=["sft-only"])
    assert "[sft-only-seed5] finished earlier: skipped" in lines
    assert not any("SFT warm start" in line for line in lines)
    # the trained arm is another run with the swept settings: its marker does not match the file
    run_experiment(spec, first, log=lambda m: None, arms=["oa"])
    with pytest.raises(ValueError, match=r"oa-seed5: finished with another .*learning_rate.* than"):
        run_experiment(swept, first, log=lambda m: None, arms=["oa"])
    relearned = load_experiment(write(tmp_path, text.replace(
        "sft_warm_start_steps: 1}", "sft_warm_start_steps: 1, sft_learning_rate: 0.01}")))
    with pytest.raises(ValueError, match=r"seed5: a warm start with another sft_learning_rate is there"):
        shared_warm_start(relearned, 5, first, log=lambda m: None)


def test_a_setting_that_keeps_the_numbers_does_not_make_another_run():
    """``activation_checkpointing`` gives the same numbers bit for bit (test_activation_checkpointing.py),
    so a warm start or an arm finished without it is reused with it; a field that changes rounding
    (the micro-batch budget) still makes another run, and so does an RL field only when the run
    has RL steps; a field added after a run was recorded counts as its default there."""
    from harnessrl.experiment.spec import SAME_NUMBERS_FIELDS, changed_fields
    from harnessrl.rl.config import TrainConfig

    assert SAME_NUMBERS_FIELDS == ("activation_checkpointing",)
    for steps in (0, 3):
        recorded = TrainConfig(steps=steps).model_dump()
        assert changed_fields(recorded, TrainConfig(steps=steps, activation_checkpointing=True)) == []
        assert changed_fields(recorded, TrainConfig(steps=steps, micro_batch_tokens=1024)) == ["micro_batch_tokens"]
    assert changed_fields(TrainConfig(steps=0).model_dump(), TrainConfig(steps=0, learning_rate=0.5)) == []
    # a run recorded before a field existed had its default's behaviour; a run with another value did not
    older = {name: value for name, value in TrainConfig(steps=3).model_dump().items() if name != "cascade_attention"}
    assert changed_fields(older, TrainConfig(steps=3)) == []
    assert changed_fields(older, TrainConfig(steps=3, cascade_attention=True)) == ["cascade_attention"]
    assert changed_fields({**older, "retired_field": 1}, TrainConfig(steps=3)) == ["retired_field"]
    assert changed_fields(TrainConfig(steps=3).model_dump(), TrainConfig(steps=3, learning_rate=0.5)) == ["learning_rate"]


def test_the_harness_s_file_runs_on_the_learning_setting_and_dry_runs_before_its_pool_exists(
        tmp_path, monkeypatch, capsys):
    from harnessrl.cli import main

    hs = load_experiment(CONFIGS / "harness_s_cpu.yaml")
    learn = load_experiment(CONFIGS / "cpu_learn.yaml")
    rescue_settings = ("rescue_k", "rescue_validation_tasks", "reanchor_every")
    assert {k: v for k, v in hs.base.items() if k not in rescue_settings} == learn.base
    assert hs.warm_start == learn.warm_start and len(hs.seeds) == 2 and hs.reference == "grpo"
    arms = {a.name: a for a in hs.arms}
    h0 = arms["grpo"].base_harness
    assert all(a.base_harness == h0 and a.pairing == "repeat" for a in hs.arms if a.design == "single")
    assert hs.eval.configs == h0 and hs.eval.k == 3  # Pass@3 under H0
    assert arms["sft-only"].control == "sft-only" and arms["grpo"].rescue is None
    assert arms["grpo-h0-rescue"].rescue == "h0"
    assert (arms["harness-s-space"].siblings, arms["harness-s-space"].router) == ("space", "validation")
    for name in ("harness-s-design", "harness-s-evolved"):  # pools the file's own steps build
        assert arms[name].siblings.startswith("pool:") and arms[name].router == "validation"
    assert (arms["scaling-rescue"].design, arms["scaling-rescue"].k, arms["scaling-rescue"].siblings) == ("orthogonal", 2, "space")
    # The evolved pool is built from the file's own warm start, so the dry run comes first, without it.
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", str(CONFIGS / "harness_s_cpu.yaml"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("paired validation not known yet") == 2
    assert "132 paired validation" in printed  # H0's 10 space neighbours and H0, 3 tasks, 4 anchors
    # every tier-1 test task of its families, each 3 times (the split has fewer than the file asks)
    assert "evaluation per arm and seed: 90 in-space episodes (the test split has 30 of the 32 tasks asked)" in printed


def test_the_dry_run_counts_agent_programs_on_their_own_tasks(tmp_path, capsys):
    from harnessrl.cli import main

    text = GOOD + 'eval: {configs: "held-out,codex-like,ext:mini-swe-agent", held_out: 2, tasks: 5, k: 2, external_tasks: 3}\n'
    assert main(["experiment", str(write(tmp_path, text)), "--dry-run"]) == 0
    # 2 held-out x 5 tasks x 2 runs in-space; codex-like 5 x 2 and the agent program 3 x 2 out-of-space
    assert "evaluation per arm and seed: 20 in-space episodes, 16 out-of-space episodes" in capsys.readouterr().out
    with pytest.raises(ValueError, match="external_tasks"):
        load_experiment(write(tmp_path, GOOD + "eval: {external_tasks: 0}\n"))
