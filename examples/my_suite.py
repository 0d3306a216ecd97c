"""An example task suite written as a plain Python list of tasks (docs/tasks.md walks through it).

Run `harnessrl tasks check --suite examples/my_suite.py` to prove every verifier: the gold
solution must pass it and an untouched workspace must fail it.
"""

import subprocess

from harnessrl.tasks import (
    Action,
    AllOf,
    AnswerEquals,
    FileAbsent,
    FileEquals,
    IsExecutable,
    PythonCheck,
    Task,
    TaskSetup,
)

# Python packages the tasks import inside the sandbox (checked when the suite loads).
requires = ["sqlite3"]


def greeting_is_printed(ctx):
    """Runs inside the sandbox: `ctx.workspace` is the workspace, what it starts is sandboxed."""
    run = subprocess.run(["python3", "greet.py"], cwd=ctx.workspace, capture_output=True, text=True, timeout=10)
    return run.returncode == 0 and run.stdout.strip() == "hello, world"


tasks = [
    Task(
        id="greet",
        instruction="Write greet.py, a Python script that prints `hello, world`, and make it executable.",
        verifier=AllOf(checks=(PythonCheck(greeting_is_printed, name="greet.py prints the greeting"),
                               IsExecutable("greet.py"))),
        gold=[Action.write("greet.py", 'print("hello, world")\n'), Action.run("chmod +x greet.py")],
        split="test",
    ),
    Task(
        id="fix-config",
        instruction="In config.ini turn debug off (`debug = false`) and delete the stale old.log.",
        setup=TaskSetup(files={"config.ini": "debug = true\n", "old.log": "stale\n"}),
        verifier=AllOf(checks=(FileEquals("config.ini", "debug = false"), FileAbsent("old.log"))),
        gold=[Action.edit("config.ini", "debug = true", "debug = false"), Action.delete("old.log")],
        split="test",
    ),
    Task(
        id="list-logs",
        instruction="Submit the names of the .log files in logs/, one per line.",
        setup=TaskSetup(files={"logs/a.log": "a\n", "logs/b.log": "b\n", "logs/notes.txt": "n\n"}),
        verifier=AnswerEquals("a.log\nb.log", mode="lines"),
        gold=[Action.run("ls logs | grep '[.]log$'"), Action.submit("a.log\nb.log")],
        expects_answer=True,
        split="test",
    ),
]
