"""The policy as an attacker on the test runner: files left in the workspace that would take over
the interpreter a check starts (a module shadowing the runner or the standard library, a
forged bytecode cache of the protected test), played end to end through the rollout path
(`RolloutEngine` -> `Episode` -> `verify_task`) on the built-in code tasks, on both real
backends. Each forgery must earn nothing; a correct solution must still earn reward 1.

docs/security.md ("What a check may load") states the rule these tests hold the checks to.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

import pytest

from conftest import required_backend
from harnessrl.harness import Harness, HarnessLimits
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.sandbox import SandboxLimits, open_sandbox
from harnessrl.tasks import (
    Action,
    AnyOf,
    CommandExit,
    IsExecutable,
    PytestPasses,
    SqliteQuery,
    Task,
    prepare_workspace,
    verify_task,
)
from harnessrl.tasks.builtin.workspace import WorkspaceSuite

LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)
HARNESS = "S0-T0-O0-C0-W0"
EXIT_0 = "import os\nos._exit(0)\n"


@pytest.fixture(params=("bwrap", "unshare"))
def backend(request: pytest.FixtureRequest) -> str:
    return required_backend(request.param)


def code_tasks() -> list[Task]:
    """Six built-in code tasks, every tier among them (each verified by `PytestPasses`)."""
    return list(WorkspaceSuite(families=["code"]).tasks("test", limit=6))


def _forged_pyc(test_path: str) -> Action:
    """Compiles a test module that passes into the unchecked-hash cache of the protected test,
    where the interpreter looks for it: ``tests/__pycache__/test_x.cpython-3XY.pyc``."""
    script = (
        "import importlib.util, os, py_compile\n"
        "open('/tmp/forged.py', 'w').write('def test_forged():\\n    pass\\n')\n"
        f"cache = importlib.util.cache_from_source({test_path!r})\n"
        "os.makedirs(os.path.dirname(cache), exist_ok=True)\n"
        "py_compile.compile('/tmp/forged.py', cfile=cache,\n"
        "                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
    )
    return Action.run(f"python3 -c {shlex.quote(script)} && ls {shlex.quote(test_path.rsplit('/', 1)[0])}/__pycache__")


def forgery(kind: str, task: Task) -> list[Action]:
    """The actions of a policy that forges instead of coding: one file, then submit."""
    if kind == "pyc":
        (test_path,) = task.protected_files
        return [_forged_pyc(test_path), Action.submit("")]
    path = {"traceback": "traceback.py", "pytest": "pytest.py",
            "importlib": "importlib/__init__.py"}[kind]
    return [Action.write(path, EXIT_0), Action.submit("")]


def _run(jobs_tasks: list[Task], backend: str):
    jobs = [RolloutJob(task, Harness.named(HARNESS, LIMITS), seed=1) for task in jobs_tasks]
    engine = RolloutEngine(OraclePolicy(), max_concurrent=3, env_workers=2, backend=backend,
                           sandbox_limits=SandboxLimits(timeout_s=60.0))
    trajectories, _stats = engine.run(jobs)
    return trajectories


@pytest.mark.parametrize("kind", ["traceback", "pytest", "importlib", "pyc"])
def test_a_forged_runner_or_test_cache_earns_nothing(backend: str, kind: str) -> None:
    tasks = [dataclasses.replace(task, gold=forgery(kind, task)) for task in code_tasks()]
    trajectories = _run(tasks, backend)
    assert all(t.status != "error" for t in trajectories), [(t.task_id, t.status) for t in trajectories]
    forged = [(t.task_id, t.verdict) for t in trajectories if t.reward != 0.0]
    assert not forged, forged
    # the test really ran, and failed on the unfinished code (not on a broken runner)
    for t in trajectories:
        detail = " ".join(str(v["detail"]) for v in t.verdict)
        assert "failed" in detail or "Error" in detail, (t.task_id, detail)


def test_a_correct_solution_still_earns_reward_1(backend: str) -> None:
    trajectories = _run(code_tasks(), backend)
    assert [t.reward for t in trajectories] == [1.0] * 6, [(t.task_id, t.status, t.verdict) for t in trajectories]


def test_a_correct_solution_beside_the_forgeries_still_earns_reward_1(backend: str) -> None:
    """Shadowing files and a stale cache next to real work change nothing either way."""
    tasks = []
    for task in code_tasks():
        noise = [a for kind in ("traceback", "pytest", "importlib", "pyc") for a in forgery(kind, task)[:-1]]
        tasks.append(dataclasses.replace(task, gold=[*noise, *task.gold]))
    trajectories = _run(tasks, backend)
    assert [t.reward for t in trajectories] == [1.0] * 6, [(t.task_id, t.status, t.verdict) for t in trajectories]


# --- the other checks that start an interpreter in the workspace ----------------------------

@pytest.fixture
def sandbox(backend: str):
    with open_sandbox(backend=backend, limits=SandboxLimits(timeout_s=30.0)) as box:
        yield box


def _task(verifier, protected: dict[str, str] | None = None) -> Task:
    return Task(id="forge", instruction="forge", verifier=verifier, gold=[Action.submit()],
                protected_files=protected or {})


def _verdict(sandbox, verifier, protected: dict[str, str] | None = None, setup: str = ""):
    task = _task(verifier, protected)
    prepare_workspace(task, sandbox)
    if setup:
        assert sandbox.exec(setup).ok
    return verify_task(task, sandbox)


def test_a_forged_cache_of_a_protected_helper_does_not_pass_a_command_check(sandbox) -> None:
    """`python3 check.py` imports the protected `helper`; the policy left a passing bytecode
    of it (unchecked hash) in `__pycache__/`."""
    protected = {"check.py": "import helper\nhelper.check()\n",
                 "helper.py": "def check():\n    raise SystemExit(open('answer.txt').read() != '42')\n"}
    forge = ("python3 -c " + shlex.quote(
        "import importlib.util, py_compile\n"
        "open('/tmp/h.py', 'w').write('def check():\\n    pass\\n')\n"
        "py_compile.compile('/tmp/h.py', cfile=importlib.util.cache_from_source('helper.py'),"
        " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"))
    verdict = _verdict(sandbox, CommandExit("python3 check.py"), protected, forge)
    assert not verdict.passed, verdict.explain()
    sandbox.write_file("answer.txt", "42")
    assert verify_task(_task(CommandExit("python3 check.py"), protected), sandbox).passed


def test_a_shadowing_json_module_does_not_forge_sqlite_or_file_kind_checks(sandbox) -> None:
    forged_json = ("import builtins\n"
                   "def dumps(value):\n"
                   "    return '[[42]]' if isinstance(value, list) else "
                   "'{\"link\": false, \"target\": null, \"file\": true, \"mode\": 493}'\n")
    setup = ("python3 -c \"import sqlite3; c = sqlite3.connect('db.sqlite');"
             " c.execute('create table t (x)'); c.execute('insert into t values (1)'); c.commit()\"")
    verifier = AnyOf(checks=(SqliteQuery("db.sqlite", "select x from t", [[42]]),
                             IsExecutable("missing.sh")))
    sandbox.write_file("json.py", forged_json)
    verdict = _verdict(sandbox, verifier, setup=setup)
    assert not verdict.passed, verdict.explain()
    assert [r.detail for r in verdict.results] == ["got [[1]]", "missing"], verdict.explain()


# --- workspace shapes on the way to a protected file ----------------------------------------

CALC_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
SHAPES = {
    "symlink-out": "rm -rf tests && ln -s /tmp tests",
    "symlink-in": "rm -rf tests && mkdir elsewhere && ln -s elsewhere tests",
    "dangling-symlink": "rm -rf tests && ln -s nowhere tests",
    "file": "rm -rf tests && echo hi > tests",
    "fifo": "rm -rf tests && mkfifo tests",
    "folder-at-the-file": "rm -rf tests && mkdir -p tests/test_calc.py && chmod 000 tests/test_calc.py",
    "unreadable-folder": "rm -rf tests && mkdir tests && chmod 000 tests",
    "unwritable-root": "chmod 555 .",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_any_shape_of_the_tests_path_leaves_the_decision_to_the_real_test(sandbox, shape: str) -> None:
    task = _task(PytestPasses("tests/test_calc.py"), {"tests/test_calc.py": CALC_TEST})
    for source, solved in (("def add(a, b):\n    return a - b\n", False),
                           ("def add(a, b):\n    return a + b\n", True)):
        sandbox.restart()
        sandbox.exec("chmod -R u+rwx . 2>/dev/null; rm -rf -- * 2>/dev/null; true")
        prepare_workspace(task, sandbox)
        sandbox.write_file("calc.py", source)
        assert sandbox.exec(SHAPES[shape]).ok
        verdict = verify_task(task, sandbox)  # never raises
        assert verdict.passed == solved, (shape, verdict.explain())
        assert verdict.results[0].name == "pytest_passes(tests/test_calc.py)", verdict.explain()
        assert sandbox.read_file("tests/test_calc.py") == CALC_TEST


def test_a_protected_path_that_cannot_be_cleared_is_a_failed_check_with_a_reason(sandbox) -> None:
    """A file where a folder of the protected path should be, inside a folder the sandbox user
    cannot write (here made by the host as another owner; as a normal user the sandbox's
    root owns everything and clears it, so the real test decides)."""
    task = _task(PytestPasses("locked/tests/test_calc.py"), {"locked/tests/test_calc.py": CALC_TEST})
    prepare_workspace(task, sandbox)
    sandbox.write_file("calc.py", "def add(a, b):\n    return a + b\n")
    locked = Path(sandbox.workspace.root) / "locked"
    locked.mkdir()
    (locked / "tests").write_text("not a folder\n")
    os.chmod(locked, 0o755)
    verdict = verify_task(task, sandbox)  # never raises
    if os.geteuid() == 0:  # the sandbox user (nobody) cannot remove root's locked/tests
        assert not verdict.passed
        assert verdict.results[0].name == "verification", verdict.explain()
        assert "protected file 'locked/tests/test_calc.py' could not be laid in" in verdict.results[0].detail
    else:
        assert verdict.passed, verdict.explain()
