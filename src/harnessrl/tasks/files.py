"""The task file format: load and validate YAML / JSON / JSONL task files, and dump tasks back.

A YAML or JSON file holds a list of tasks, or a mapping ``{name, description, requires,
mounts, tasks: [...]}`` (``requires``: Python packages the tasks import in the sandbox;
``mounts``: ``[{source, target}]`` read-only host directories; see ``harnessrl.tasks.needs``);
a JSONL file holds one task object per line. Each task::

    id: unique-id                      # no whitespace
    instruction: what the agent is asked to do
    setup: {files: {path: text}, files_b64: {path: base64}, script: shell run in the sandbox}
    verifier: {kind: file_equals, path: out.txt, content: "42"}   # any check kind, nested
    gold: [{kind: write_file, path: out.txt, content: "42"}]      # actions that solve it
                                       # (write_file content or content_b64, edit_file, delete_file, run, submit)
    family: misc    tier: 1 (1..4)    split: train    tags: [..]
    protected_files: {path: text}      # laid in again before the verifier runs
    expects_answer: false              # the task is solved by a submitted answer
    metadata: {any: json}

Every error is a ``TaskFileError`` whose message names the file, the line, the task (index
and id), the field path and the fix.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import MISSING
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from harnessrl.sandbox import SandboxMount
from harnessrl.tasks.base import TASK_FILE_SUFFIXES, ListSuite
from harnessrl.tasks.model import ACTION_KINDS, Action, Task, TaskSetup
from harnessrl.tasks.needs import parse_mounts
from harnessrl.tasks.verify import Check, PythonCheck, check_from_dict

SUITE_KEYS: tuple[str, ...] = ("name", "description", "requires", "mounts", "tasks")


class TaskFileError(ValueError):
    """A task file that cannot be loaded; ``errors`` holds one located message per problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        shown = self.errors[:20]
        more = len(self.errors) - len(shown)
        super().__init__("\n".join(shown) + (f"\n... and {more} more error(s)" if more else ""))


# --- schema --------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SetupSpec(_Strict):
    """``setup``: starting files (text or base64 bytes) and a shell script run after them."""

    files: dict[str, str] = Field(default_factory=dict)
    files_b64: dict[str, str] = Field(default_factory=dict)
    script: str | None = None


# One gold action as written in a file: the fields of ``Action`` itself (one definition), checked
# strictly here; which of them a kind needs is checked by ``Action`` when it is built.
ActionSpec = create_model(
    "ActionSpec",
    __base__=_Strict,
    __doc__="One gold action; which fields are needed depends on ``kind``.",
    **{f.name: (hint, f.default if f.default is not MISSING else ...)
       for f, hint in ((f, get_type_hints(Action)[f.name]) for f in dataclass_fields(Action))},
    content_b64=(str | None, None),  # binary content of a write_file, base64
)


class TaskSpec(_Strict):
    """One task as written in a file (see the module docstring)."""

    id: str = Field(min_length=1, pattern=r"^\S+$")
    instruction: str
    setup: SetupSpec = Field(default_factory=SetupSpec)
    verifier: dict[str, Any]
    gold: list[ActionSpec] = Field(min_length=1)
    family: str = "misc"
    tier: int = Field(default=1, ge=1, le=4)
    split: str = "train"
    tags: list[str] = Field(default_factory=list)
    protected_files: dict[str, str] = Field(default_factory=dict)
    expects_answer: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("instruction")
    @classmethod
    def _instruction_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("instruction is empty; write what the agent is asked to do")
        return value


_TASK_FIELDS = tuple(TaskSpec.model_fields)
_MODEL_FIELDS: dict[str, tuple[str, ...]] = {
    "task": _TASK_FIELDS,
    "setup": tuple(SetupSpec.model_fields),
    "gold": tuple(ActionSpec.model_fields),
}


# --- locating errors -----------------------------------------------------------------------


def _format_loc(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out and ("." in part or "/" in part or " " in part):
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _parse_loc(field: str) -> list[str | int]:
    """Returns the path of a dotted field such as ``verifier.checks[0].kind``."""
    loc: list[str | int] = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", field):
        loc.append(int(part[1:-1]) if part.startswith("[") else part)
    return loc


def _yaml_line(node: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    """Returns the 1-based line of the deepest node on ``loc`` under ``node``."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child = value
                    line = key.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


def _fix_for(error: dict[str, Any]) -> str:
    """Returns a message for one pydantic error that says how to fix it."""
    loc = [p for p in error["loc"] if isinstance(p, str | int)]
    kind = error["type"]
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        parent = "task"
        if len(loc) >= 2 and loc[0] == "setup":
            parent = "setup"
        elif len(loc) >= 3 and loc[0] == "gold":
            parent = "gold"
        allowed = _MODEL_FIELDS[parent]
        close = difflib.get_close_matches(name, allowed, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"unknown field '{name}'; {hint}allowed: {', '.join(allowed)}"
    if kind == "missing":
        return "required field is missing; add it"
    if kind == "literal_error" and loc and loc[0] == "gold":
        return f"unknown action kind {error.get('input')!r}; use one of {', '.join(ACTION_KINDS)}"
    if kind == "string_pattern_mismatch" and loc == ["id"]:
        return f"id {error.get('input')!r} must be non-empty and contain no whitespace"
    if kind == "too_short" and loc == ["gold"]:
        return "no gold actions; give at least one action that solves the task"
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = error.get("input")
    if not isinstance(got, dict | list):
        message += f" (got {type(got).__name__} {got!r})"
    return message


class _Where:
    """Where a task sits in its file, for messages: file, line, index and id."""

    def __init__(self, file: Path, index: int, task_id: Any, line: int | None, node: Any) -> None:
        self.file, self.index, self.task_id, self.line, self.node = file, index, task_id, line, node

    def prefix(self, loc: Sequence[str | int] = ()) -> str:
        line = _yaml_line(self.node, loc) if self.node is not None else self.line
        parts = [self.file.name + (f" line {line}" if line else "")]
        task = f"task {self.index}"
        if isinstance(self.task_id, str) and self.task_id:
            task += f" (id '{self.task_id}')"
        parts.append(task)
        return ", ".join(parts)

    def field_error(self, loc: Sequence[str | int], message: str) -> str:
        field = f", field {_format_loc(loc)}" if loc else ""
        return f"{self.prefix(loc)}{field}: {message}"


# --- conversion ----------------------------------------------------------------------------


def _check_rel_path(path: str) -> str | None:
    """Returns why ``path`` is not a workspace-relative path, or None when it is.

    Files are placed only in the workspace, by design: it is the one directory of the sandbox
    the agent may write, the one harnessrl lays out, restores protected files into and
    verifies, and what the agent starts in (``/workspace``); the rest of the sandbox is the
    host's read-only system. A task written for another root (``/testbed``) names its paths
    relative to the workspace instead; read-only host files can appear elsewhere through the
    suite's ``mounts``.
    """
    if not path or path.startswith("/") or path.startswith("~"):
        shown = path.lstrip("/~") or "name"
        return (f"must be a relative path inside the workspace (files are placed only there, the "
                f"agent's writable working directory /workspace): write {shown!r} instead; "
                "read-only host files elsewhere come from the suite's mounts")
    if ".." in posixpath.normpath(path).split("/"):
        return "must not leave the workspace ('..')"
    return None


def _verifier_error(exc: ValueError, where: _Where) -> str:
    """Returns a located message for an error raised by ``check_from_dict``."""
    text = str(exc)
    field, sep, rest = text.partition(": ")
    if sep and field.startswith("verifier") and " " not in field:
        return f"{where.prefix(_parse_loc(field))}, field {field}: {rest}"
    return where.field_error(["verifier"], text)


def _task_from_spec(spec: TaskSpec, where: _Where) -> tuple[Task | None, list[str]]:
    """Builds a Task from a validated spec; returns it or the located errors."""
    errors: list[str] = []
    files: dict[str, str | bytes] = {}
    for group, entries in (("files", spec.setup.files), ("files_b64", spec.setup.files_b64)):
        for path, content in entries.items():
            loc: list[str | int] = ["setup", group, path]
            problem = _check_rel_path(path)
            if problem:
                errors.append(where.field_error(loc, f"path {path!r} {problem}"))
                continue
            if path in files:
                errors.append(where.field_error(loc, "path given in both files and files_b64; keep one"))
                continue
            if group == "files_b64":
                try:
                    files[path] = base64.b64decode(content.encode("ascii"), validate=True)
                except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
                    errors.append(where.field_error(loc, f"not valid base64 ({exc}); encode with base64.b64encode"))
                    continue
            else:
                files[path] = content
    for path in spec.protected_files:
        problem = _check_rel_path(path)
        if problem:
            errors.append(where.field_error(["protected_files", path], f"path {path!r} {problem}"))
    verifier: Check | None = None
    try:
        verifier = check_from_dict(spec.verifier, "verifier")
    except ValueError as exc:
        errors.append(_verifier_error(exc, where))
    gold: list[Action] = []
    for i, action in enumerate(spec.gold):
        try:
            gold.append(Action.from_dict(action.model_dump(exclude_none=True)))
        except ValueError as exc:
            errors.append(where.field_error(["gold", i], str(exc)))
    if errors or verifier is None:
        return None, errors
    try:
        task = Task(
            id=spec.id,
            instruction=spec.instruction,
            verifier=verifier,
            gold=gold,
            setup=TaskSetup(files=files, script=spec.setup.script),
            family=spec.family,
            tier=spec.tier,
            split=spec.split,
            tags=tuple(spec.tags),
            protected_files=dict(spec.protected_files),
            expects_answer=spec.expects_answer,
            metadata=dict(spec.metadata),
        )
    except (TypeError, ValueError) as exc:
        return None, [where.field_error([], str(exc))]
    return task, []


class _BadLine(str):
    """A JSONL line that is not valid JSON; its text is the message."""


def _validate(raw: Any, where: _Where) -> tuple[Task | None, list[str]]:
    if isinstance(raw, _BadLine):
        return None, [f"{where.prefix()}: {raw}"]
    if not isinstance(raw, dict):
        return None, [where.field_error([], f"a task must be a mapping of fields, got {type(raw).__name__}")]
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        errors = [
            where.field_error([p for p in e["loc"] if isinstance(p, str | int)], _fix_for(e))
            for e in exc.errors()
        ]
        verifier = raw.get("verifier")
        if isinstance(verifier, dict) and not any(e["loc"][:1] == ("verifier",) for e in exc.errors()):
            # Report a bad verifier in the same pass as the other fields.
            try:
                check_from_dict(verifier, "verifier")
            except ValueError as check_exc:
                errors.append(_verifier_error(check_exc, where))
        return None, errors
    return _task_from_spec(spec, where)


# --- loading -------------------------------------------------------------------------------


def _read_entries(path: Path) -> tuple[list[tuple[Any, _Where]], dict[str, Any]]:
    """Returns the raw task entries with their locations, and the suite-level fields."""
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    entries: list[tuple[Any, _Where]] = []
    if suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = _Where(path, len(entries), None, number, None)
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                # Kept as an entry so that every bad line is reported, not just the first.
                raw = _BadLine(f"invalid JSON ({exc.msg} at column {exc.colno}); write one JSON object per line")
            where.task_id = raw.get("id") if isinstance(raw, dict) else None
            entries.append((raw, where))
        return entries, {}
    root_node: yaml.Node | None = None
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskFileError(
                [f"{path.name} line {exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno})"]
            ) from None
    else:
        try:
            data = yaml.safe_load(text)
            root_node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise TaskFileError([f"{path.name}{line}: invalid YAML ({problem})"]) from None
    suite_fields: dict[str, Any] = {}
    tasks_node: yaml.Node | None = root_node
    if isinstance(data, dict):
        unknown = [k for k in data if k not in SUITE_KEYS]
        if unknown or "tasks" not in data:
            line = _yaml_line(root_node, [unknown[0]]) if unknown and root_node else None
            where = f"{path.name}" + (f" line {line}" if line else "")
            problem = (
                f"unknown top-level key '{unknown[0]}'" if unknown else "no 'tasks' key"
            )
            raise TaskFileError(
                [f"{where}: {problem}; a task file is a list of tasks or a mapping with keys "
                 f"{', '.join(SUITE_KEYS)}"]
            )
        for key in ("name", "description"):
            if key in data and not isinstance(data[key], str):
                raise TaskFileError([f"{path.name}: top-level '{key}' must be a string"])
            if key in data:
                suite_fields[key] = data[key]
        requires = data.get("requires", [])
        if not isinstance(requires, list) or not all(isinstance(n, str) and n for n in requires):
            raise TaskFileError([f"{path.name}: top-level 'requires' must be a list of package names"])
        suite_fields["requires"] = requires
        try:
            suite_fields["mounts"] = parse_mounts(data.get("mounts") or [], "mounts")
        except (TypeError, ValueError) as exc:
            raise TaskFileError([f"{path.name}: {exc}"]) from None
        data = data["tasks"]
        tasks_node = _child(root_node, "tasks")
    if data is None:
        data = []
    if not isinstance(data, list):
        raise TaskFileError(
            [f"{path.name}: expected a list of tasks, got {type(data).__name__}; "
             "write `tasks:` followed by a list of task mappings"]
        )
    for index, raw in enumerate(data):
        node = tasks_node.value[index] if isinstance(tasks_node, yaml.SequenceNode) else None
        task_id = raw.get("id") if isinstance(raw, dict) else None
        entries.append((raw, _Where(path, index, task_id, None, node)))
    return entries, suite_fields


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
    return None


def _load(path: Path) -> tuple[list[Task], dict[str, Any], list[str], list[_Where]]:
    entries, suite_fields = _read_entries(path)
    tasks: list[Task] = []
    wheres: list[_Where] = []
    errors: list[str] = []
    for raw, where in entries:
        task, task_errors = _validate(raw, where)
        errors.extend(task_errors)
        if task is not None:
            tasks.append(task)
            wheres.append(where)
    return tasks, suite_fields, errors, wheres


def _task_files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TASK_FILE_SUFFIXES)
        if not found:
            raise TaskFileError([f"{path}: no task files ({', '.join(TASK_FILE_SUFFIXES)}) in this directory"])
        return found
    if not path.exists():
        raise FileNotFoundError(f"task file {path} does not exist")
    if path.suffix.lower() not in TASK_FILE_SUFFIXES:
        raise TaskFileError([f"{path.name}: unknown task file type; use {', '.join(TASK_FILE_SUFFIXES)}"])
    return [path]


def load_task_suite(path: str | Path) -> ListSuite:
    """Returns the suite in a task file, or in every task file under a directory.

    Raises ``TaskFileError`` listing every problem found (file, line, task, field, fix),
    including duplicate ids within or across files.
    """
    path = Path(path)
    all_tasks: list[Task] = []
    errors: list[str] = []
    first_seen: dict[str, str] = {}
    suite_fields: dict[str, Any] = {}
    files = _task_files(path)
    for file in files:
        tasks, fields, file_errors, wheres = _load(file)
        errors.extend(file_errors)
        if len(files) == 1:
            suite_fields = fields
        for task, where in zip(tasks, wheres, strict=True):
            if task.id in first_seen:
                errors.append(
                    f"{where.prefix(['id'])}, field id: duplicate id '{task.id}' (first at "
                    f"{first_seen[task.id]}); give each task a unique id"
                )
                continue
            first_seen[task.id] = where.prefix(["id"])
            all_tasks.append(task)
    if errors:
        raise TaskFileError(errors)
    name = suite_fields.get("name") or (path.name if path.is_dir() else path.stem)
    return ListSuite.from_tasks(name, all_tasks, description=suite_fields.get("description", ""),
                                requires=suite_fields.get("requires", ()), mounts=suite_fields.get("mounts", ()))


def load_tasks(path: str | Path) -> list[Task]:
    """Returns every task in a task file (or directory of them), in file order."""
    return load_task_suite(path).all_tasks()


# --- dumping -------------------------------------------------------------------------------


def _uses_python(check_dict: Any) -> bool:
    if isinstance(check_dict, dict):
        return check_dict.get("kind") == PythonCheck.kind or any(
            _uses_python(v) for v in check_dict.values()
        )
    if isinstance(check_dict, list):
        return any(_uses_python(v) for v in check_dict)
    return False


def task_to_dict(task: Task) -> dict[str, Any]:
    """Returns the task in file form; raises ``ValueError`` if it holds code (a builder or a
    PythonCheck), which a task file cannot express."""
    if task.setup.builder is not None:
        raise ValueError(
            f"task {task.id}: its setup uses a Python builder "
            f"({getattr(task.setup.builder, '__qualname__', task.setup.builder)!r}), which a task "
            "file cannot hold; lay its files into setup.files / setup.files_b64 instead"
        )
    verifier = task.verifier.to_dict()
    if _uses_python(verifier):
        raise ValueError(
            f"task {task.id}: its verifier uses a PythonCheck (Python code), which a task file "
            "cannot hold; express it with declarative checks (e.g. command_exit) instead"
        )
    setup: dict[str, Any] = {}
    text_files = {p: c for p, c in task.setup.files.items() if isinstance(c, str)}
    binary_files = {
        p: base64.b64encode(c).decode("ascii") for p, c in task.setup.files.items() if isinstance(c, bytes)
    }
    if text_files:
        setup["files"] = text_files
    if binary_files:
        setup["files_b64"] = binary_files
    if task.setup.script:
        setup["script"] = task.setup.script
    out: dict[str, Any] = {"id": task.id, "instruction": task.instruction}
    if setup:
        out["setup"] = setup
    out["verifier"] = verifier
    out["gold"] = [a.to_dict() for a in task.gold]
    out["family"] = task.family
    out["tier"] = int(task.tier)
    out["split"] = task.split
    if task.tags:
        out["tags"] = list(task.tags)
    if task.protected_files:
        out["protected_files"] = dict(task.protected_files)
    if task.expects_answer:
        out["expects_answer"] = True
    if task.metadata:
        out["metadata"] = task.metadata
    return out


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings as ``|`` blocks so scripts and files stay readable."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    block = "\n" in value and not any(line != line.rstrip() for line in value.splitlines())
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_BlockDumper.add_representer(str, _str_representer)


def dump_tasks(
    tasks: Iterable[Task], path: str | Path, name: str | None = None, description: str | None = None,
    requires: Sequence[str] = (), mounts: Sequence[SandboxMount] = (),
) -> Path:
    """Writes tasks to ``path`` (format from the suffix: .yaml/.yml, .json or .jsonl); returns it.

    Raises ``ValueError`` naming the task when one holds code (a builder or a PythonCheck).
    A JSONL file has no suite-level fields: ``requires`` and ``mounts`` need YAML or JSON.
    """
    path = Path(path)
    records = [task_to_dict(t) for t in tasks]
    suffix = path.suffix.lower()
    if suffix not in TASK_FILE_SUFFIXES:
        raise ValueError(f"{path.name}: unknown task file type; use {', '.join(TASK_FILE_SUFFIXES)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        if requires or mounts:
            raise ValueError(f"{path.name}: a JSONL task file cannot hold requires or mounts; use .yaml or .json")
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    else:
        document: dict[str, Any] = {}
        if name:
            document["name"] = name
        if description:
            document["description"] = description
        if requires:
            document["requires"] = list(requires)
        if mounts:
            document["mounts"] = [{"source": m.source, "target": m.target} for m in mounts]
        document["tasks"] = records
        if suffix == ".json":
            text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        else:
            text = yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100)
    path.write_text(text, encoding="utf-8")
    return path
