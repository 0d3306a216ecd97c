"""The command line helps a newcomer: every `--help` shows defaults and one example that
parses, mistyped names get a "did you mean", `--print-config` carries each field's
description, and docs/config.md is the reference generated from the TrainConfig fields."""

import shlex
from pathlib import Path

import pytest
import yaml

from harnessrl.cli import build_parser, main
from harnessrl.cli.common import did_you_mean
from harnessrl.cli.train import config_reference
from harnessrl.rl.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def sub_commands(parser=None, path=()):
    """Yields (path, parser) for every sub-command and action, depth first."""
    parser = parser or build_parser()
    for action in parser._actions:
        if type(action).__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from sub_commands(sub, (*path, name))


COMMANDS = list(sub_commands())


def test_every_command_is_covered():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"train", "eval", "rollout", "tasks check", "external run", "pool evolve", "serve", "report"} <= names


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_shows_defaults_and_an_example_that_parses(path, parser):
    text = parser.format_help()
    assert "\nexample:\n  harnessrl " + " ".join(path) in text, text[-400:]
    with_defaults = [a for a in parser._actions if a.option_strings and a.default not in (None, False, [], "")
                     and a.default is not __import__("argparse").SUPPRESS and a.help]
    for action in with_defaults:
        assert f"{action.default}" in text, (action.option_strings, action.default)
    if with_defaults:
        assert "default:" in text
    example = text.split("\nexample:\n", 1)[1].splitlines()[0].strip()
    args = build_parser().parse_args(shlex.split(example)[1:])
    assert callable(getattr(args, "func", None))


def test_did_you_mean_names_the_closest_candidates():
    assert did_you_mean("trian", ["train", "eval", "tasks"]) == " (did you mean 'train'?)"
    assert did_you_mean("zzz", ["train", "eval"]) == ""


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["trian"], "did you mean 'train'?"),
    (["tasks", "lst"], "did you mean 'list'?"),
    (["train", "--preset", "quik", "--print-config"], "did you mean 'quick'?"),
    (["rollout", "--policy", "orcale", "--configs", "S0-T0-O0-C0-W0"], "did you mean 'oracle'?"),
    (["rollout", "--policy", "oracle", "--configs", "hel-out"], "did you mean 'held-out'?"),
    (["rollout", "--policy", "oracle", "--configs", "codex-lik"], "did you mean 'codex-like'"),
    (["rollout", "--policy", "oracle", "--configs", "S0-T0-O0-C0-W3"], "did you mean 'S0-T0-O0-C0-W"),
    (["eval", "--policy", "oracle", "--configs", "ext:codx", "--limit", "1"], "did you mean 'ext:codex'"),
    (["tasks", "list", "--suite", "workspce"], "did you mean 'workspace'?"),
    (["external", "check", "mini-swe-agnt"], "did you mean 'mini-swe-agent'?"),
    (["train", "--set", "learning_rat=1", "--print-config"], "did you mean learning_rate"),
])
def test_a_mistyped_name_gets_a_suggestion(argv, suggestion, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit 2
        code = exc.code
    assert code == 2
    assert suggestion in capsys.readouterr().err


def test_print_config_shows_each_fields_description_and_loads_back(capsys, tmp_path):
    assert main(["train", "--set", "learning_rate=2e-5", "--print-config"]) == 0
    printed = capsys.readouterr().out
    for name, info in TrainConfig.model_fields.items():
        assert f"# {info.description}\n{name}:" in printed, name
    path = tmp_path / "printed.yaml"
    path.write_text(printed)
    assert main(["train", "--config", str(path), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["learning_rate"] == 2e-5


def test_the_committed_config_reference_is_the_generated_one():
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == config_reference(), "regenerate: harnessrl train --config-reference > docs/config.md"
    for name in TrainConfig.model_fields:
        assert f"| `{name}` |" in page
