"""`harnessrl train --set FIELD=VALUE`: any TrainConfig field from the command line."""


import pytest
import yaml

from harnessrl.cli import main
from harnessrl.rl.config import PRESETS, TrainConfig, load_config, parse_set_overrides


def print_config(capsys, *argv: str) -> dict:
    """Runs `harnessrl train ARGV --print-config` and returns the printed config (YAML)."""
    assert main(["train", *argv, "--print-config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def train_error(capsys, *argv: str) -> str:
    """Runs `harnessrl train ARGV --print-config`, expects a clean error, returns its text."""
    assert main(["train", *argv, "--print-config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("harnessrl train: error: ")
    assert "Traceback" not in captured.err
    return captured.err


def test_set_values_land_with_the_field_types(capsys):
    cfg = print_config(
        capsys, "--set", "tiers=[1,2]", "--set", "families=null", "--set", "eval_base=false",
        "--set", "learning_rate=1e-5", "--set", "steps=1e3", "--set", "clip_high=0.3",
        "--set", "design=random", "--set", "design_n=5",
    )
    assert cfg["tiers"] == [1, 2]
    assert cfg["families"] is None  # null clears the quick preset's list, it is not "not given"
    assert PRESETS["quick"]["families"]
    assert cfg["eval_base"] is False
    assert cfg["learning_rate"] == 1e-5 and isinstance(cfg["learning_rate"], float)
    assert cfg["steps"] == 1000 and isinstance(cfg["steps"], int)
    assert cfg["clip_high"] == 0.3
    assert (cfg["design"], cfg["design_n"]) == ("random", 5)


def test_load_config_types_not_just_the_json():
    cfg = load_config(preset="quick", sets=["learning_rate=1e-5", "tiers=[2, 3]", "scale_std=no"])
    assert type(cfg.learning_rate) is float and cfg.learning_rate == 1e-5
    assert cfg.tiers == [2, 3] and all(type(t) is int for t in cfg.tiers)
    assert cfg.scale_std is False


def test_short_alias_and_last_item_wins(capsys):
    cfg = print_config(capsys, "-o", "group_size=3", "-o", "group_size=5", "-o", "families=[text]")
    assert cfg["group_size"] == 5
    assert cfg["families"] == ["text"]


def test_string_fields_keep_the_text_yaml_would_retype():
    values = parse_set_overrides(["model=2024", "device=cpu", "base_harness=null", "run_dir=runs/a=b"])
    assert values == {"model": "2024", "device": "cpu", "base_harness": None, "run_dir": "runs/a=b"}
    numbers = parse_set_overrides(["learning_rate=1e-5", "steps=2e2"])  # YAML reads both as strings
    assert numbers == {"learning_rate": 1e-5, "steps": 200}
    assert type(numbers["learning_rate"]) is float and type(numbers["steps"]) is int


def test_precedence_preset_file_set_flag(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("preset: quick\ntiers: [1, 2]\nlearning_rate: 3.0e-6\nsteps: 7\nseed: 11\n")
    cfg = print_config(
        capsys, "--config", str(config),
        "--set", "learning_rate=1e-5", "--set", "steps=5", "--set", "max_turns=4", "--steps", "3",
    )
    assert cfg["group_size"] == PRESETS["quick"]["group_size"]  # the preset, untouched
    assert cfg["tiers"] == [1, 2]  # the file over the preset
    assert cfg["seed"] == 11  # the file, no --set
    assert cfg["learning_rate"] == 1e-5  # --set over the file
    assert cfg["max_turns"] == 4  # --set over the preset
    assert cfg["steps"] == 3  # the flag over --set and the file


def test_set_run_dir_names_the_run_and_run_dir_flag_wins(tmp_path, capsys):
    assert print_config(capsys, "--set", f"run_dir={tmp_path / 'a'}")["run_dir"] == str(tmp_path / "a")
    cfg = print_config(capsys, "--set", f"run_dir={tmp_path / 'a'}", "--run-dir", str(tmp_path / "b"))
    assert cfg["run_dir"] == str(tmp_path / "b")
    assert print_config(capsys)["run_dir"].startswith("runs/quick-")


def test_missing_equals_names_the_item_and_the_form(capsys):
    err = train_error(capsys, "--set", "learning_rate")
    assert "--set 'learning_rate': expected FIELD=VALUE" in err
    assert "--set learning_rate=VALUE" in err
    assert "expected FIELD=VALUE" in train_error(capsys, "--set", "=3")


def test_unknown_field_lists_close_matches_and_print_config(capsys):
    err = train_error(capsys, "--set", "lerning_rate=1e-5")
    assert "unknown field 'lerning_rate'" in err
    assert "did you mean learning_rate" in err
    assert "--print-config" in err
    err = train_error(capsys, "--set", "zzz=1")
    assert "unknown field 'zzz'" in err and "did you mean" not in err and "--print-config" in err
    assert "use --preset paper" in train_error(capsys, "--set", "preset=paper")


def test_bad_value_names_the_field_and_the_item(capsys):
    err = train_error(capsys, "--set", "learning_rate=abc")
    assert "field learning_rate: Input should be a valid number" in err
    assert "(given as --set learning_rate=abc)" in err
    err = train_error(capsys, "--set", "tiers=[1,2", "--set", "steps=2")
    assert "--set tiers=[1,2: field tiers: value is not valid YAML" in err
    err = train_error(capsys, "--set", "group_size=0")
    assert "field group_size: Input should be greater than or equal to 1" in err
    assert "steps" in train_error(capsys, "--set", "steps=1.5")


def test_errors_are_value_errors_for_the_api():
    with pytest.raises(ValueError, match="expected FIELD=VALUE"):
        load_config(sets=["steps"])
    with pytest.raises(ValueError, match="did you mean steps"):
        load_config(sets=["stepz=3"])
    with pytest.raises(ValueError, match=r"field eval_base: .*given as --set eval_base=maybe"):
        load_config(sets=["eval_base=maybe"])


def test_every_field_can_be_set():
    """Each field's current value, written back as YAML text, round-trips through --set."""
    import yaml

    base = TrainConfig(**PRESETS["quick"])
    for name, value in base.model_dump().items():
        text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        assert parse_set_overrides([f"{name}={text}"]) == {name: value}, name


def test_update_fields_default_to_the_on_policy_update_and_land_from_set():
    cfg = load_config(preset="quick")
    assert (cfg.ppo_epochs, cfg.mini_batches, cfg.advantage) == (1, 1, "grpo")
    for preset in PRESETS.values():  # no preset changes the default update
        assert {"ppo_epochs", "mini_batches", "advantage"}.isdisjoint(preset)
    cfg = load_config(preset="quick", sets=["ppo_epochs=4", "mini_batches=2", "advantage=rloo"])
    assert (cfg.ppo_epochs, cfg.mini_batches, cfg.advantage) == (4, 2, "rloo")


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["ppo_epochs=0"], "ppo_epochs must be at least 1"),
        (["mini_batches=0"], "mini_batches must be at least 1"),
        (["mini_batches=9"], r"mini_batches 9 exceeds the rollouts per step \(tasks_per_step x group_size = 2 x 4 = 8\)"
                             ".*lower mini_batches or raise tasks_per_step or group_size"),
        (["advantage=rloo", "algorithm=ppo"], "advantage rloo is a group baseline for algorithm grpo.*set algorithm: grpo"),
        (["advantage=rloo", "group_size=1"], "advantage rloo needs group_size of at least 2.*raise group_size"),
        (["advantage=loo"], "field advantage: Input should be 'grpo' or 'rloo'"),
    ],
)
def test_update_field_errors_name_the_fix(sets, expected):
    with pytest.raises(ValueError, match=expected):
        load_config(preset="quick", sets=sets)


def test_update_field_error_reaches_the_command_line(capsys):
    err = train_error(capsys, "--set", "mini_batches=100")
    assert "mini_batches 100 exceeds the rollouts per step" in err


def test_an_unknown_sandbox_backend_is_refused_naming_the_choices_and_the_fix(capsys):
    err = train_error(capsys, "--set", "sandbox_backend=docker")
    assert "field sandbox_backend" in err and "'docker'" in err
    assert "auto, bwrap, unshare, none" in err
    assert "auto" in err.split("'docker'")[1]  # the fix: a backend that exists
    with pytest.raises(ValueError, match="sandbox_backend"):
        load_config(overrides={"sandbox_backend": "docker"})
    for backend in ("auto", "bwrap", "unshare", "none"):
        assert load_config(overrides={"sandbox_backend": backend}).sandbox_backend == backend


def test_device_and_dtype_are_checked_against_what_torch_takes(capsys):
    err = train_error(capsys, "--set", "device=gpu")
    assert "field device" in err and "'gpu'" in err and "cuda" in err
    err = train_error(capsys, "--set", "dtype=float8")
    assert "field dtype" in err and "bfloat16" in err
    for device in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        assert load_config(overrides={"device": device}).device == device
    for dtype in ("auto", "float32", "bf16", "float16"):
        assert load_config(overrides={"dtype": dtype}).dtype == dtype


def test_a_missing_binary_or_folder_config_file_is_named_in_the_error(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    err = train_error(capsys, "--config", str(missing))
    assert str(missing) in err and "does not exist" in err
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    err = train_error(capsys, "--config", str(binary))
    assert str(binary) in err and "not UTF-8 text" in err
    err = train_error(capsys, "--config", str(tmp_path))
    assert str(tmp_path) in err and "not a file" in err


def test_resume_of_a_missing_run_directory_says_so_and_fails(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    assert main(["train", "--run-dir", str(missing), "--resume"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "nothing to resume" in err
    assert not missing.exists()
