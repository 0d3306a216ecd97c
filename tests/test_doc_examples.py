"""Every code example in README.md and docs/*.md runs exactly as printed.

Python blocks are executed; each line of a bash block that is safe and fast runs through the
command line (``harnessrl`` is ``python -m harnessrl.cli``); YAML blocks are experiment files
and must pass ``harnessrl experiment FILE --dry-run``. The few commands that need a server, an
external agent, a trained run, a cluster or a long job are listed in ``NOT_RUN`` and
``NOT_EXECUTED`` with the reason; a
command in the docs that is neither run nor listed fails the test, so a new example cannot
slip through untested.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)

# Command prefixes that are not run here, and why. Everything else in a bash block runs.
NOT_RUN = {
    "make run": "trains the embedded model for about 14 minutes (the whole quick pipeline)",
    "make test": "runs the whole test suite (this test is part of it)",
    "harnessrl serve": "starts a long-running server (tests/test_serve_*.py drive it)",
    "harnessrl external": "needs an agent program installed from a registry (tests/test_external_agents.py)",
    "harnessrl eval --checkpoint": "needs a trained run folder (tests/test_train_loop.py makes one)",
    "harnessrl report runs/": "needs a trained run folder (tests/test_experiment_report.py builds reports)",
    "harnessrl experiment": "trains every arm: tens of minutes on a CPU, a GPU job for the paper's",
}
# Pages whose examples their own test runs as printed (from the repository root, with the files
# the page builds on); this test leaves them to it rather than run them twice.
OWN_TEST = {
    "docs/tasks.md": "tests/test_docs_tasks.py",
    # its block builds .venv-vllm, starts the vLLM server and trains through it: the fixture of
    # tests/test_vllm_server.py runs the same (`make vllm-env`, `vllm_server_command`).
    "docs/policy_server.md": "tests/test_vllm_server.py",
}
# Python blocks that need what a test machine does not have, by a marker in their text, and why.
NOT_EXECUTED = {
    "base_url=": "talks to `harnessrl serve` (tests/test_serve_*.py drive the server with these SDKs)",
    'ray_address="HEAD_HOST': "needs a Ray cluster and a model folder (tests/test_rollout_ray.py runs the engine locally)",
}


def code_blocks(lang: str) -> list[tuple[str, str]]:
    """Returns (where, code) for every fenced block of ``lang`` in the docs."""
    blocks = []
    for doc in DOCS:
        if str(doc.relative_to(ROOT)) in OWN_TEST:
            continue
        text = doc.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == lang:
                line = text[: match.start()].count("\n") + 1
                blocks.append((f"{doc.relative_to(ROOT)}:{line}", match.group(2)))
    return blocks


def commands() -> list[tuple[str, str]]:
    """Returns (where, command) for every command line of every bash block, comments cut."""
    out = []
    for where, code in code_blocks("bash"):
        for line in code.splitlines():
            command = line.split("  #")[0].strip()
            if command:
                out.append((where, command))
    return out


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def test_the_docs_have_examples_of_every_kind():
    assert code_blocks("python") and commands() and code_blocks("yaml")


def test_pages_left_to_their_own_test_have_one():
    for page, test in OWN_TEST.items():
        assert (ROOT / page).exists() and page in (ROOT / test).read_text()


@pytest.mark.parametrize(("where", "code"), code_blocks("python"), ids=lambda v: v if ":" in v else "")
def test_python_example_runs_as_printed(where, code, tmp_path, capsys, monkeypatch):
    reason = next((why for marker, why in NOT_EXECUTED.items() if marker in code), None)
    if reason is not None:
        pytest.skip(f"{where} is not executed here: it {reason}")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out
    if "run_episode" in code:
        # The README's promise: the oracle passes through the harness it names.
        assert printed.startswith("True "), printed[:200]


@pytest.mark.parametrize(("where", "command"), commands(), ids=lambda v: v if ":" in v else "")
def test_bash_example_runs_as_printed(where, command, tmp_path, request):
    reason = next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)
    if reason is not None:
        pytest.skip(f"{where}: `{command}` is not run here: {reason}")
    if "ext:mini-swe-agent" in command:  # the agent program the example runs, installed as the page says
        request.getfixturevalue("mini_swe_agent")
    argv = shlex.split(command)
    assert argv[0] == "harnessrl", f"{where}: `{command}` is neither run nor listed in NOT_RUN"
    result = subprocess.run(
        [sys.executable, "-m", "harnessrl.cli", *argv[1:]], cwd=tmp_path, env=cli_env(),
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, f"{where}: `{command}` failed:\n{result.stderr[-2000:]}"


@pytest.mark.parametrize(("where", "code"), code_blocks("yaml"), ids=lambda v: v if ":" in v else "")
def test_yaml_example_is_a_valid_experiment(where, code, tmp_path):
    path = tmp_path / "example.yaml"
    path.write_text(code)
    result = subprocess.run(
        [sys.executable, "-m", "harnessrl.cli", "experiment", str(path), "--dry-run"], cwd=tmp_path,
        env=cli_env(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"{where}: the experiment file is refused:\n{result.stderr[-2000:]}"
