"""`harnessrl design` and `harnessrl pairing` print what they promise, with and without --json."""

import json

import pytest

from harnessrl.cli import main


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_design_json_has_configs_held_out_and_checks(capsys):
    out = run_json(capsys, ["design", "--json"])
    assert len(out["configs"]) == 18 and len(out["held_out"]) == 18
    assert not set(out["configs"]) & set(out["held_out"])
    assert out["checks"]["strength"] == 2
    assert out["checks"]["rao_bound"] == 11
    assert out["checks"]["min_hamming"] == 3
    assert out["checks"]["mean_hamming"] == pytest.approx(3.53, abs=0.005)


@pytest.mark.parametrize(("kind", "size"), [("first-order", 3), ("random", 18), ("full", 243), ("single", 1)])
def test_design_kinds(capsys, kind, size):
    out = run_json(capsys, ["design", "--kind", kind, "--seed", "2", "--json"])
    assert len(out["configs"]) == size


def test_design_text_shows_table_report_and_held_out(capsys):
    assert main(["design", "--held-out", "5"]) == 0
    text = capsys.readouterr().out
    assert "S0-T0-O0-C0-W0" in text and "min Hamming         3" in text
    assert "held-out in-space test set (5 configurations" in text


def test_pairing_json_is_a_list_of_steps(capsys):
    out = run_json(capsys, ["pairing", "--tasks", "8", "--steps", "4", "--k", "2", "--json"])
    assert len(out) == 4 and all(len(step) == 8 for step in out)
    assert {"task", "config"} <= set(out[0][0])
    assert [p["task"] for p in out[0]] == [p["task"] for p in out[1]]


def test_bad_arguments_give_a_clear_error(capsys):
    assert main(["design", "--kind", "single", "--base", "S9-T0-O0-C0-W0"]) == 2
    assert "out of range 0..2" in capsys.readouterr().err
    assert main(["pairing", "--k", "40"]) == 2
    assert "needs at least 40" in capsys.readouterr().err
