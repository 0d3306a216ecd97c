"""docs/tasks.md runs as printed: its example suite is examples/my_suite.py, and each
`$ harnessrl ...` command in it exits 0 and prints the lines shown under it."""

import re
import shlex
from pathlib import Path

import pytest

from harnessrl.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "tasks.md").read_text(encoding="utf-8")


def console_commands() -> list[tuple[str, list[str]]]:
    """Returns each `$ harnessrl ...` line of the page's console blocks with the lines shown under it."""
    commands: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", PAGE, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif line.strip():
                commands[-1][1].append(line)
    return commands


def test_the_page_shows_the_example_suite_file_verbatim():
    example = (ROOT / "examples" / "my_suite.py").read_text(encoding="utf-8")
    assert f"```python\n{example}```" in PAGE


@pytest.mark.parametrize("command,shown", console_commands(), ids=[c for c, _ in console_commands()])
def test_each_command_of_the_page_runs_as_printed(command, shown, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    words = shlex.split(command)
    assert words[0] == "harnessrl"
    assert main(words[1:]) == 0
    printed = capsys.readouterr().out.splitlines()
    for line in shown:
        assert line in printed, (command, line, printed)
