"""The wheel a user installs holds every file the package reads at run time, and nothing stale.

The attention kernels are compiled from ``.cpp`` and ``.h`` files at first use, the harness
templates and rescue prompts are read from text files: an installed package that lacks one of them
fails only on the user's machine, since the tests here run from the source tree. The wheel is built
from a copy of the tracked files, so a leftover ``build/`` folder cannot hide or add a file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from harnessrl.policy import decode_kernel

ROOT = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE")


def _tracked_package_files() -> list[str]:
    """Returns the package's files that git tracks, relative to ``src/``."""
    listing = subprocess.run(
        ["git", "ls-files", "src/harnessrl"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert listing, "git lists no file under src/harnessrl"
    return [name.removeprefix("src/") for name in listing]


def _build_wheel(tmp_path: Path, tracked: list[str]) -> zipfile.ZipFile:
    source = tmp_path / "source"
    for name in PROJECT_FILES:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    for name in tracked:
        target = source / "src" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / "src" / name, target)
    out = tmp_path / "wheel"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run(
        [*pip_wheel, "-w", str(out), str(source)], check=True, capture_output=True, text=True
    )
    (wheel,) = out.glob("harnessrl-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_holds_exactly_the_tracked_package_files(tmp_path: Path) -> None:
    tracked = _tracked_package_files()
    with _build_wheel(tmp_path, tracked) as wheel:
        top, rest = zip(*(name.split("/", 1) for name in wheel.namelist()), strict=True)
        info = next(t for t in top if t.endswith(".dist-info"))
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    package = {f"{t}/{r}" for t, r in zip(top, rest, strict=True) if t != info}
    metadata = {r for t, r in zip(top, rest, strict=True) if t == info}

    assert sorted(set(tracked) - package) == [], "tracked files the wheel lacks"
    assert sorted(package - set(tracked)) == [], "files in the wheel that git does not track"
    # what the kernel build reads, by the names decode_kernel.py gives them
    for path in decode_kernel.SOURCES + decode_kernel.HEADERS:
        assert f"harnessrl/policy/{path.name}" in package
    assert {"licenses/LICENSE", "licenses/NOTICE"} <= metadata
    assert "harnessrl = harnessrl.cli:main" in entry_points.splitlines()
