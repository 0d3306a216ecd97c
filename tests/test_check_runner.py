"""The isolated test runner of `PytestPasses` under an interpreter that has pytest (this one),
run on the host over a folder laid out like an episode's workspace: nothing the workspace
holds but the code under test is loaded (conftest.py, ini files, plugins, entry points,
shadowing modules, forged bytecode caches), and the real test still decides."""

from __future__ import annotations

import importlib.util
import marshal
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.tasks.runner import run_tests_command

pytest_version = pytest.__version__
EXIT_0 = "import os\nos._exit(0)\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"


def _forge_caches(root: Path) -> None:
    """Puts a passing module where the interpreter (unchecked-hash .pyc) and pytest's assertion
    rewriter (header matching the source's mtime and size) look for the test's bytecode."""
    forged = root / "forged_src.py"
    forged.write_text("def test_forged():\n    pass\n")
    test = root / "tests" / "test_calc.py"
    cache = Path(importlib.util.cache_from_source(str(test)))
    cache.parent.mkdir(exist_ok=True)
    py_compile.compile(str(forged), cfile=str(cache),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    stat = test.stat()
    header = (importlib.util.MAGIC_NUMBER + b"\x00\x00\x00\x00"
              + (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
              + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little"))
    code = compile(forged.read_text(), str(test), "exec")
    tag = sys.implementation.cache_tag
    (cache.parent / f"test_calc.{tag}-pytest-{pytest_version}.pyc").write_bytes(header + marshal.dumps(code))
    forged.unlink()


def workspace(root: Path, source: str, hostile: bool) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_calc.py").write_text(TEST)
    (root / "calc.py").write_text(source)
    if hostile:
        for name in ("traceback.py", "pytest.py", "pluggy.py", "conftest.py", "tests/conftest.py",
                     "importlib/__init__.py", "forgedplugin.py", "sitecustomize.py",
                     "usercustomize.py"):
            (root / name).parent.mkdir(exist_ok=True)
            (root / name).write_text(EXIT_0)
        (root / "forged.pth").write_text("import os; os._exit(0)\n")
        (root / "pytest.ini").write_text("[pytest]\naddopts = -p forgedplugin\n")
        (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p forgedplugin'\n")
        info = root / "forged-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: forged\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[pytest11]\nforged = forgedplugin\n")
        _forge_caches(root)
    return root


def run(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTEST_ADDOPTS": "-p forgedplugin", "PYTHONPATH": str(root),
           "PYTHONSTARTUP": str(root / "forgedplugin.py")}
    command = run_tests_command(str(root), "tests/test_calc.py", python=sys.executable)
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                          env=env, cwd=root)


@pytest.mark.parametrize("hostile", [False, True], ids=["plain", "hostile"])
def test_the_real_test_decides_under_pytest(tmp_path: Path, hostile: bool) -> None:
    failing = run(workspace(tmp_path / "buggy", BUGGY, hostile))
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "1 failed" in failing.stdout and "test_add" in failing.stdout, failing.stdout
    passing = run(workspace(tmp_path / "fixed", FIXED, hostile))
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "1 passed" in passing.stdout, passing.stdout
    assert not (tmp_path / "fixed" / "__pycache__").exists()  # nothing cached by the run
