"""An experiment's record (``harnessrl experiment --record``): the folder without weights, which a
later sitting runs into to add arms; the warm start is trained again and must match its
fingerprint bit for bit, or the finished arms would not pair with the new ones."""

import json

import pytest

from harnessrl.experiment import load_experiment

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")


def learning_experiment(tmp_path, model):
    """test_experiment_report.py's tiny file with a shared warm start, the SFT-only control and one RL arm."""
    from test_experiment_report import tiny_experiment

    text = tiny_experiment(tmp_path, model).read_text().replace("  sft_warm_start_steps: 1\n", "")
    text = text.replace("seeds: [5]", "warm_start: {design: orthogonal, sft_warm_start_steps: 1}\nseeds: [5]")
    text = text.replace('eval: {configs: "held-out,codex-like", held_out: 2, tasks: 1}',
                        'eval: {configs: "held-out", held_out: 2, tasks: 1}')
    text = text.replace("  - {name: single, design: single, pairing: repeat, k: 2}\n", "  - {name: sft-only, control: sft-only}\n")
    path = tmp_path / "exp.yaml"
    path.write_text(text.replace("reference: single", "reference: sft-only"))
    return load_experiment(path)


@pytest.fixture(scope="module")
def finished_control(tmp_path_factory, tiny_model):
    """The tiny file and a folder where its warm start and SFT-only control have finished."""
    from harnessrl.experiment import run_experiment

    root = tmp_path_factory.mktemp("experiment")
    spec = learning_experiment(root, tiny_model)
    run_experiment(spec, root / "first", log=lambda m: None, arms=["sft-only"])
    return spec, root / "first"


def test_weights_fingerprint_sees_one_changed_value_and_not_the_files_layout(tmp_path):
    from safetensors.torch import save_file

    from harnessrl.rl.checkpoint import weights_fingerprint

    tensors = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16)}
    for name, order in (("one", ["a", "b"]), ("two", ["b", "a"])):
        (tmp_path / name).mkdir()
        save_file({key: tensors[key] for key in order}, str(tmp_path / name / "model.safetensors"))
    assert weights_fingerprint(tmp_path / "one") == weights_fingerprint(tmp_path / "two")
    changed = {**tensors, "b": tensors["b"].clone()}
    changed["b"][1, 2] = torch.nextafter(changed["b"][1, 2], torch.tensor(100.0))
    (tmp_path / "three").mkdir()
    save_file(changed, str(tmp_path / "three" / "model.safetensors"))
    assert weights_fingerprint(tmp_path / "three") != weights_fingerprint(tmp_path / "one")
    with pytest.raises(FileNotFoundError, match="no safetensors"):
        weights_fingerprint(tmp_path)


def test_a_record_holds_no_weights_and_a_later_sitting_adds_an_arm_to_it(tmp_path, finished_control):
    from harnessrl.experiment import compare, run_experiment, warm_start_model, write_record

    spec, out = finished_control
    record = tmp_path / "record"
    marker = out / "warm-start" / "seed5" / "warm_start.json"
    recorded = json.loads(marker.read_text())["fingerprint"]
    from harnessrl.cli import main

    assert main(["experiment", str(out.parent / "exp.yaml"), "--out", str(out), "--record", str(record)]) == 0
    kept = {p.relative_to(record).as_posix() for p in record.rglob("*") if p.is_file()}
    assert "arms/sft-only-seed5/arm_result.json" in kept and "warm-start/seed5/warm_start.json" in kept
    assert not any(name.endswith((".safetensors", "optim.pt")) or "/model/" in name for name in kept), kept
    assert not warm_start_model(record, 5).exists()
    with pytest.raises(ValueError, match="not empty"):
        write_record(out, record)
    with pytest.raises(SystemExit, match=r"--record: .*not an experiment folder"):
        main(["experiment", str(out.parent / "exp.yaml"), "--out", str(tmp_path / "none"), "--record", str(tmp_path / "r")])

    # the later sitting: the control is skipped, the warm start trained again and checked, the arm run
    lines: list[str] = []
    result = run_experiment(spec, record, log=lines.append)
    assert "[sft-only-seed5] finished earlier: skipped" in lines
    assert any("weights are not here: training it again" in line for line in lines)
    assert json.loads((record / "warm-start" / "seed5" / "warm_start.json").read_text())["fingerprint"] == recorded
    assert {row["arm"] for row in result["arms"]} == {"sft-only", "oa"} and result["missing"] == []
    first = json.loads((out / "comparison.json").read_text())["arms"]
    assert next(row for row in result["arms"] if row["arm"] == "sft-only")["in_space"] == first[0]["in_space"]
    assert compare(record)["arms"] == result["arms"]


def test_a_warm_start_that_comes_out_otherwise_than_recorded_is_refused(tmp_path, finished_control):
    from harnessrl.experiment import run_experiment, write_record

    spec, out = finished_control
    for name, fingerprint, message in (("other", "0" * 64, "differs from the recorded one"),
                                       ("old", None, "has no fingerprint")):
        record = write_record(out, tmp_path / name)
        marker = record / "warm-start" / "seed5" / "warm_start.json"
        done = json.loads(marker.read_text())
        done.pop("fingerprint")
        marker.write_text(json.dumps(done if fingerprint is None else {**done, "fingerprint": fingerprint}))
        with pytest.raises(ValueError, match=message):
            run_experiment(spec, record, log=lambda m: None, arms=["oa"])
        assert not (record / "arms" / "oa-seed5" / "arm_result.json").exists()


def test_a_target_added_to_the_evaluation_is_evaluated_on_the_finished_weights_and_merged(tmp_path, finished_control):
    """An evaluation that only adds a target (an agent program, another out-of-space harness) to a
    finished file evaluates the finished runs through it and merges the results, which come out
    as those of a run asked for it from the start; any other change of the evaluation is refused."""
    import shutil

    from harnessrl.experiment import run_experiment
    from harnessrl.trajectory import load_jsonl

    spec, out = finished_control
    wider = spec.model_copy(update={"eval": spec.eval.model_copy(update={"configs": "held-out,codex-like"})})
    folder = tmp_path / "first"
    shutil.copytree(out, folder)
    marker = folder / "arms" / "sft-only-seed5" / "arm_result.json"
    before = json.loads(marker.read_text())
    lines: list[str] = []
    run_experiment(wider, folder, log=lines.append, arms=["sft-only"])
    assert any("[sft-only-seed5] finished earlier; evaluating it through what the evaluation added since: codex-like"
               in line for line in lines), lines
    assert not any("training:" in line for line in lines)
    after = json.loads(marker.read_text())
    assert set(after["results"]["per_config"]) == set(before["results"]["per_config"]) | {"codex-like"}
    assert all(after["results"]["per_config"][code] == score for code, score in before["results"]["per_config"].items())
    assert after["eval"] == wider.eval.model_dump() and [a["targets"] for a in after["added"]] == [["codex-like"]]
    assert after["wall_time_s"] >= before["wall_time_s"] and after["finished"] == before["finished"]
    # the same numbers as a folder that asked for codex-like from the start (its warm start trained again)
    fresh = tmp_path / "fresh"
    run_experiment(wider, fresh, log=lambda m: None, arms=["sft-only"])
    scratch = json.loads((fresh / "arms" / "sft-only-seed5" / "arm_result.json").read_text())
    for key in ("per_config", "per_group"):
        assert after["results"][key] == scratch["results"][key]
    assert [t.config for t in load_jsonl(marker.parent / "eval" / "experiment.jsonl")] == \
        [t.config for t in load_jsonl(fresh / "arms" / "sft-only-seed5" / "eval" / "experiment.jsonl")]
    lines.clear()
    run_experiment(wider, folder, log=lines.append, arms=["sft-only"])
    assert "[sft-only-seed5] finished earlier: skipped" in lines
    # fewer targets, or other tasks, is another evaluation: refused, nothing rewritten
    for other in (spec, wider.model_copy(update={"eval": wider.eval.model_copy(update={"tasks": 2})})):
        with pytest.raises(ValueError, match="finished with another eval"):
            run_experiment(other, folder, log=lambda m: None, arms=["sft-only"])
    assert json.loads(marker.read_text()) == after
