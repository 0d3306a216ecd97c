"""The interpreter a check starts over the workspace: ``python3`` in isolated mode with the
standard library (and the sandbox's site-packages) ahead of the workspace, no bytecode cache
read or written, a clean environment; and the test-file runner `PytestPasses` runs in it.

The workspace is the policy's: any module, package, ``.pth``, ``conftest.py``, ini file or
``__pycache__`` it holds would otherwise be loaded by the check's interpreter before (or
instead of) what the check means to run. docs/security.md ("What a check may load") states
the rule; these commands are how the checks keep it.
"""

from __future__ import annotations

import shlex

from harnessrl.sandbox import NO_PYCACHE

CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"

CLEAN_ENV = {
    "PATH": CLEAN_PATH,
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # entry points would be found on the workspace too
}
"""The whole environment of an isolated check interpreter (``env -i``: no ``PYTHON*``,
``PYTEST_ADDOPTS``, ``PYTEST_PLUGINS``, ``BASH_ENV`` or anything else set earlier)."""


def isolated_python(script: str, *args: str, cwd: str | None = None, python: str = "python3") -> str:
    """Returns the shell command that runs ``script`` (Python source) with ``args`` in an
    isolated interpreter: ``-I`` (no ``PYTHON*`` variables, no user site, nothing of the
    working directory on ``sys.path``), ``-B`` and `NO_PYCACHE` (no bytecode read from or
    written to ``__pycache__``), the environment `CLEAN_ENV` only, in ``cwd`` when given.

    The script runs as the command's process (``exec``), so its status is the command's."""
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in CLEAN_ENV.items())
    words = " ".join(shlex.quote(arg) for arg in args)
    prefix = f"cd {shlex.quote(cwd)} && " if cwd else ""
    return (f"{prefix}exec env -i {env} {shlex.quote(python)} -I -B -X pycache_prefix={NO_PYCACHE}"
            f" -c {shlex.quote(script)} {words}").rstrip()


# Runs `python3 -I` in the workspace root with argv ``root test_path``. The standard library,
# the sandbox's site-packages and pytest (if installed there) are found before the workspace
# is put at the END of sys.path, so no file of the workspace shadows them, while the code
# under test stays importable. Under pytest: no conftest.py, no ini file of the workspace
# (``-c /dev/null``), no plugins but pytest's own, test directories appended, not prepended.
# Without pytest a small runner calls every top-level ``test_*`` function of the file.
TEST_RUNNER = """
import importlib.util, os, sys, traceback
root, path = sys.argv[1], sys.argv[2]
try:
    found = importlib.util.find_spec('pytest')
except (ImportError, ValueError):
    found = None
sys.path.append(root)
if found is not None:
    import pytest
    sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', '--noconftest',
                          '--import-mode=append', '-c', os.devnull, '--rootdir', root, path]))
sys.path.append(os.path.dirname(os.path.abspath(path)))
spec = importlib.util.spec_from_file_location('harnessrl_test_module', path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
tests = [v for k, v in vars(module).items() if k.startswith('test_') and callable(v)]
failed = 0
for test in tests:
    try:
        test()
    except Exception:
        failed += 1
        traceback.print_exc()
print(f'{len(tests) - failed} passed, {failed} failed')
sys.exit(1 if failed or not tests else 0)
"""


def run_tests_command(root: str, test_path: str, python: str = "python3") -> str:
    """Returns the command that runs the test file ``test_path`` (relative to the workspace
    root ``root``, as the sandbox sees it) under pytest or the built-in runner."""
    return isolated_python(TEST_RUNNER, root, test_path, cwd=root, python=python)
