"""Running a Python-callable check inside the episode's sandbox: finding the callable by name,
mounting its module read-only, and the runner that calls it there.

A check callable written by a suite (``fn(ctx) -> bool | CheckResult``) usually runs what
the policy wrote (``python hello.py``, ``pytest``). On the host that code would run as the
trainer's user; here the sandbox's own ``python3`` imports the callable's module from a
read-only mount and calls it over the workspace, so everything it starts is sandboxed too.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.sandbox import SandboxMount, others_can_search

logger = logging.getLogger(__name__)

CHECK_MOUNTS_ROOT = "/opt/harnessrl-checks"
"""Where the import roots of sandboxed check modules appear inside the sandbox."""

# Runs inside the sandbox as `exec python3 -I -c RUNNER module qualname answer root...`, so it
# IS the command's process: the server waits for it and reports its exit status, and, made
# non-dumpable first, it cannot be traced by the programs it starts. Exit 0: passed, 1: failed,
# 3: the callable could not be imported or raised. The detail goes to stdout (shown only).
_RUNNER = """
import ctypes, importlib, json, os, sys, traceback
from pathlib import Path
try:
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
module_name, qualname, answer = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[:0] = sys.argv[4:]
class SandboxedCheckContext:
    sandbox = None
    workspace = Path(os.getcwd())
    def __init__(self, answer):
        self.answer = answer
try:
    target = importlib.import_module(module_name)
    for part in qualname.split('.'):
        target = getattr(target, part)
    outcome = target(SandboxedCheckContext(answer))
except BaseException as exc:
    traceback.print_exc()
    print(json.dumps({'detail': 'check raised ' + type(exc).__name__ + ': ' + str(exc)[:300]}))
    sys.stdout.flush()
    os._exit(3)
passed = bool(getattr(outcome, 'passed', outcome))
print(json.dumps({'detail': str(getattr(outcome, 'detail', '') or ('ok' if passed else 'returned false'))}))
sys.stdout.flush()
os._exit(0 if passed else 1)
"""


def import_name(fn: Callable[..., Any]) -> tuple[str, str] | None:
    """Returns ``(module, qualname)`` under which ``fn`` can be imported again, or None (a
    lambda, a closure, a method of a local class, something defined in ``__main__``)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    if module == "__main__":
        return None
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        return None
    return (module, qualname) if target is fn else None


def import_root(module_name: str) -> Path | None:
    """Returns the ``sys.path`` folder ``module_name`` is imported from; None for a module
    built into the interpreter (nothing to mount)."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    folder = Path(file).resolve().parent
    depth = module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    for _ in range(depth):
        folder = folder.parent
    return folder


_COPY_FILE_BYTES = 1 << 20
_COPY_TOTAL_BYTES = 16 << 20
_COPY_FILES = 2000
_SKIPPED_FOLDERS = {"__pycache__", "node_modules"}
_STAGED: dict[tuple[Path, str | None], Path] = {}
_STAGED_LOCK = threading.Lock()


def _readable_by_others(root: Path) -> bool:
    try:
        mode = os.stat(root).st_mode
    except OSError:
        return False
    return others_can_search(str(root / "_")) is None and mode & 0o005 == 0o005


def _copy_sources(root: Path, into: Path) -> bool:
    """Copies ``root``'s files (not hidden ones, caches, virtual environments or symbolic
    links; none over 1 MiB) into ``into``, readable by all; False if they are more than
    2,000 files or 16 MiB."""
    total = count = 0
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(
            name for name in subfolders if not name.startswith(".") and name not in _SKIPPED_FOLDERS
            and not (Path(folder) / name / "pyvenv.cfg").exists())
        target = into / Path(folder).relative_to(root)
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        target.chmod(0o755)
        for name in files:
            source = Path(folder) / name
            if name.startswith(".") or source.is_symlink() or not source.is_file():
                continue
            size = source.stat().st_size
            if size > _COPY_FILE_BYTES:
                continue
            total, count = total + size, count + 1
            if total > _COPY_TOTAL_BYTES or count > _COPY_FILES:
                return False
            copy = target / name
            copy.write_bytes(source.read_bytes())
            copy.chmod(0o644)
    return True


def reachable_root(root: Path, package: str | None = None) -> Path:
    """Returns ``root``, or, when the sandbox's user could not read it (a checkout in a mode-700
    home folder while harnessrl runs as root and the sandbox as nobody), a copy of its files
    (of its folder ``package`` only, if given) in a world-readable folder under the temporary
    directory, made once per process and removed at exit. A root too large to copy (more than
    2,000 files or 16 MiB) is returned as it is: the sandbox then says which folder blocks it."""
    if _readable_by_others(root):
        return root
    with _STAGED_LOCK:
        if (root, package) not in _STAGED:
            staged = Path(tempfile.mkdtemp(prefix="harnessrl-check-root-"))
            staged.chmod(0o755)
            copied = _readable_by_others(staged) and (
                _copy_sources(root / package, staged / "root" / package) if package
                else _copy_sources(root, staged / "root"))
            if copied:
                (staged / "root").chmod(0o755)
                atexit.register(shutil.rmtree, staged, True)
                _STAGED[(root, package)] = staged / "root"
            else:
                logger.warning("cannot copy the check import root %s where the sandbox can read it", root)
                shutil.rmtree(staged, ignore_errors=True)
                _STAGED[(root, package)] = root
        return _STAGED[(root, package)]


def mount_target(root: Path) -> str:
    """Where import root ``root`` appears inside the sandbox."""
    return f"{CHECK_MOUNTS_ROOT}/{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"


def mount_for(root: Path) -> SandboxMount:
    """Returns the read-only mount that shows import root ``root`` inside the sandbox (a copy
    where the sandbox's user could not read it: `reachable_root`; of harnessrl's root, the
    harnessrl package only)."""
    package = "harnessrl" if root == import_root("harnessrl") else None
    return SandboxMount(str(reachable_root(root, package)), mount_target(root))


def roots_for(module_name: str) -> list[Path]:
    """Returns the import roots a sandboxed call of a function in ``module_name`` needs: the
    module's own, and harnessrl's when the sandbox user can read it (a suite module often
    imports harnessrl)."""
    roots = [root] if (root := import_root(module_name)) is not None else []
    harnessrl_root = import_root("harnessrl")
    if (harnessrl_root is not None and harnessrl_root not in roots
            and _readable_by_others(reachable_root(harnessrl_root, "harnessrl"))):
        roots.append(harnessrl_root)
    return roots


def runner_command(module_name: str, qualname: str, answer: str | None) -> str:
    """Returns the shell command that calls ``module_name.qualname`` in the sandbox."""
    paths = [mount_target(root) for root in roots_for(module_name)]
    words = [module_name, qualname, json.dumps(answer), *paths]
    return "exec python3 -I -c " + shlex.quote(_RUNNER) + " " + " ".join(shlex.quote(w) for w in words)


def runner_detail(stdout: str) -> str | None:
    """Returns the detail the runner printed last, or None if it printed none."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and isinstance(message.get("detail"), str):
            return message["detail"]
    return None


def call_with_timeout(fn: Callable[[Any], Any], argument: Any, timeout_s: float) -> tuple[bool, Any]:
    """Returns ``(True, fn(argument))``, or ``(False, None)`` when it has not returned within
    ``timeout_s``; an exception it raises is raised here."""
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def call() -> None:
        try:
            outcome.append(fn(argument))
        except BaseException as exc:  # raised again in the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=call, name="harnessrl-host-check", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if failure:
        raise failure[0]
    return (True, outcome[0]) if outcome else (False, None)


_HOST_CHECKS_WARNED: set[tuple[str, str]] = set()


def warn_host_check(name: str, fn: Callable[..., Any]) -> None:
    """Says once per process and check, loudly, that a check runs outside the sandbox."""
    key = (name, getattr(fn, "__qualname__", repr(fn)))
    if key in _HOST_CHECKS_WARNED:
        return
    _HOST_CHECKS_WARNED.add(key)
    message = (
        f"PythonCheck {name!r} runs ON THE HOST (on_host=True), as user {os.getuid()}, outside"
        " the sandbox: whatever it runs of the policy's work runs unsandboxed")
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    logger.warning(message)
