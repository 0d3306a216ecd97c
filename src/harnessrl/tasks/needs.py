"""What a suite's tasks need inside the sandbox: Python packages its ``python3`` must import
(``requires``) and read-only host directories it must show (``mounts``), checked on the host
when the suite is loaded, so that a missing one is one clear error, not a failed episode.

The sandbox sees the host's ``/usr`` read-only and runs the first ``python3`` on its fixed
``PATH``; a required package must be installed for that interpreter (``apt install
python3-pytest``, or ``pip install`` into it), not only in harnessrl's virtual environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from harnessrl.sandbox import SandboxMount, sandbox_env

# Prints the required names the interpreter cannot find, as a JSON list.
_FIND_SCRIPT = (
    "import importlib.util, json, sys\n"
    "print(json.dumps([n for n in sys.argv[1:] if importlib.util.find_spec(n) is None]))\n"
)


class SuiteNeedsError(RuntimeError):
    """A suite needs a package or host directory this host cannot give its sandbox."""


def sandbox_python() -> str | None:
    """Returns the host path of the ``python3`` sandboxed commands run, or None."""
    return shutil.which("python3", path=sandbox_env(home="/tmp")["PATH"])


def missing_packages(names: Sequence[str]) -> list[str]:
    """Returns the top-level modules in ``names`` the sandbox's ``python3`` cannot import."""
    if not names:
        return []
    python = sandbox_python()
    if python is None:
        return list(names)
    result = subprocess.run([python, "-I", "-c", _FIND_SCRIPT, *names], capture_output=True,
                            text=True, timeout=60, check=False)
    try:
        return list(json.loads(result.stdout))
    except ValueError:
        return list(names)


def parse_mounts(entries: Iterable[Any], where: str = "mounts") -> tuple[SandboxMount, ...]:
    """Returns read-only mounts from ``{source, target}`` mappings (or `SandboxMount`s)."""
    mounts: list[SandboxMount] = []
    for index, entry in enumerate(entries):
        if isinstance(entry, SandboxMount):
            mounts.append(entry)
            continue
        if not isinstance(entry, Mapping) or set(entry) != {"source", "target"}:
            raise ValueError(f"{where}[{index}]: a mount is {{source: host directory, target: "
                             f"absolute path inside the sandbox}}, got {entry!r}")
        try:
            mounts.append(SandboxMount(str(entry["source"]), str(entry["target"])))
        except ValueError as exc:
            raise ValueError(f"{where}[{index}]: {exc}") from None
    return tuple(mounts)


def check_suite_needs(name: str, requires: Sequence[str], mounts: Sequence[SandboxMount]) -> None:
    """Raises ``SuiteNeedsError`` naming every required package the sandbox's ``python3``
    lacks and every mount source missing on this host, with the fix."""
    problems = []
    for mount in mounts:
        if not os.path.isdir(mount.source):
            problems.append(f"mount source {mount.source} (shown at {mount.target}) is not a "
                            "directory on this host; create it or drop the mount")
    missing = missing_packages(list(requires))
    if missing:
        python = sandbox_python() or "python3 (none found on the sandbox's PATH)"
        problems.append(f"package(s) {', '.join(missing)} cannot be imported by {python}, the "
                        "interpreter sandboxed commands run; install them for it (apt or its pip)")
    if problems:
        raise SuiteNeedsError(f"suite {name!r} needs what this host lacks: " + "; ".join(problems))
