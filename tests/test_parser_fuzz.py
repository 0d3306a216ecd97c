"""Fuzzing every tool interface: parse never raises, execute never lets an exception escape."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from harnessrl.harness.base import ParsedOutput, ToolCall, ToolOutput
from harnessrl.harness.tools.aider import AiderEditBlockTools
from harnessrl.harness.tools.codex import CodexExecTools
from harnessrl.harness.tools.editor_json import ShellEditorJsonTools
from harnessrl.harness.tools.schema import INTERNAL_ERROR, SchemaToolInterface
from harnessrl.harness.tools.shell_block import SUBMIT_MARKER, ShellBlockTools
from harnessrl.harness.tools.tagged import FineGrainedTaggedTools
from harnessrl.sandbox import Sandbox, SandboxLimits, open_sandbox

INTERFACES: list[type[SchemaToolInterface]] = [
    ShellBlockTools, ShellEditorJsonTools, FineGrainedTaggedTools, CodexExecTools, AiderEditBlockTools,
]
TOOL_NAMES = sorted({spec.name for cls in INTERFACES for spec in cls().specs()})
ARGUMENT_NAMES = sorted({
    name for cls in INTERFACES for spec in cls().specs() for name in spec.parameters["properties"]
})
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FRAGMENTS = [
    "```", "```bash\n", "```sh\n", "```shell\n", "```json\n", "```python\n", "\n```\n", "\n", " ",
    "THOUGHT: ", "<tool_call>", "</tool_call>", "<tool_call>\n", "<function=", "<function=exec_command>",
    "<function=apply_patch>", "<function=final_answer>", "<function=5>", "</function>", "{", "}", "[",
    "]", '"name"', '"arguments"', ": ", ", ", '"', "\\", "\x00", "null", "5", "true", "1e999",
    "<<<<<<< SEARCH\n", "=======\n", ">>>>>>> REPLACE\n", "/run ", "/submit ", "a.py\n",
    "*** Begin Patch\n", "*** End Patch\n", "*** Add File: x\n", "*** Update File: x\n", "@@\n", "+", "-",
    f"echo {SUBMIT_MARKER}", '{"name": "bash", "arguments": {"command": "ls"}}',
    '{"name": "Read", "arguments": {"file_path": "a"}}', '{"cmd": ["ls"]}', '{"answer": "x"}',
    '{"name": "str_replace_editor", "arguments": {"command": "view", "path": 5}}',
    '{"name": "\\ud800", "arguments": {"\\udc80": 1}}', '<tool_call>{"name": "Read", "x\\ud800": 1}</tool_call>',
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
CALL_OBJECTS = st.fixed_dictionaries({
    "name": st.sampled_from(TOOL_NAMES) | st.text(max_size=10) | st.integers() | st.none(),
    "arguments": st.dictionaries(st.sampled_from(ARGUMENT_NAMES) | st.text(max_size=6), JSON_VALUES, max_size=4)
    | JSON_VALUES,
})
WRAPPERS = [
    "@", "```json\n@\n```", "<tool_call>@</tool_call>", "<tool_call>\n@\n</tool_call><tool_call>@",
    "<function=exec_command>@</function>", "<function=final_answer>@</function>",
    "<function=apply_patch>@</function>", "Text before @ and after.", "```bash\n@\n```", "[@, @]",
]

RANDOM_TEXT = st.text(max_size=300)
FRAGMENT_TEXT = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=30).map("".join)
WRAPPED_JSON = st.tuples(CALL_OBJECTS | JSON_VALUES, st.sampled_from(WRAPPERS)).map(
    lambda pair: pair[1].replace("@", json.dumps(pair[0]))
)
# Text with none of the characters any call syntax needs: no action can be in it.
INERT_TEXT = st.text(max_size=300).filter(lambda t: not any(c in t for c in "`{<=/*@"))

ADVERSARIAL = [
    "",
    "x" * 1_000_000,
    "{" * 100_000,
    "[" * 100_000,
    '{"a":' * 50_000,
    "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "<tool_call>" + '{"name": "Read", "arguments": ' * 20_000 + "</tool_call>",
    "<function=exec_command>" + "{" * 100_000 + "</function>",
    "```bash\n" + "a" * 1_000_000 + "\n```",
    "\x00" * 1000,
    "```bash\nls\x00 -la\n```",
    "<tool_call><tool_call>{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}</tool_call></tool_call>",
    '[{"name": "bash", "arguments": {"command": "ls"}}]',
    '<tool_call>[{"name": "Bash", "arguments": {"command": "ls"}}]</tool_call>',
    '{"name": 5, "arguments": {}}',
    '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
    '{"name": "bash", "arguments": []}',
    '<function=exec_command>{"cmd": {"a": 1}}</function>',
    '<function=exec_command>{"cmd": 1e999}</function>',
    '{"name": "bash", "arguments": {"command": "' + "9" * 10_000 + '"}}',
    '{"name": "str_replace_editor", "arguments": {"command": "insert", "path": "a", "insert_line": ' + "9" * 5000 + "}}",
    "<<<<<<< SEARCH\n" * 1000,
    "a.py\n<<<<<<< SEARCH\n" + "=======\n" * 1000,
    "```\n" * 10_000,
    "<function=apply_patch>" + "*** Begin Patch\n" * 1000 + "</function>",
    "/submit\n" * 100,
    "<function=>{}</function>",
    "<function=exec_command>{}</function>" * 100,
]


def check_parsed(tools: SchemaToolInterface, text: str) -> ParsedOutput:
    parsed = tools.parse(text)
    assert isinstance(parsed, ParsedOutput)
    assert bool(parsed.calls) != (parsed.error is not None), parsed
    if parsed.error is not None:
        assert parsed.error_kind in ("format", "tool") and parsed.error.strip()
        parsed.error.encode("utf-8")  # an error observation can always be tokenized
    for call in parsed.calls:
        assert tools.check_call(call) is None, call
    return parsed


@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.name)
@FUZZ
@given(text=RANDOM_TEXT | FRAGMENT_TEXT | WRAPPED_JSON)
def test_parse_never_raises_and_gives_either_calls_or_an_error(interface, text):
    check_parsed(interface(), text)


@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.name)
@FUZZ
@given(text=INERT_TEXT)
def test_text_without_any_call_syntax_is_an_error(interface, text):
    parsed = check_parsed(interface(), text)
    assert parsed.error is not None and parsed.calls == ()


@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_never_raise(text):
    for interface in INTERFACES:
        check_parsed(interface(), text)


@pytest.mark.parametrize("text", [
    '[{"name": "bash", "arguments": {"command": "ls"}}]',
    '<tool_call>[{"name": "Bash", "arguments": {"command": "ls"}}]</tool_call>',
    '{"name": 5, "arguments": {}}',
    '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
    "<tool_call>not json</tool_call>",
    '<function=exec_command>{"cmd": {"a": 1}}</function>',
    "a.py\n<<<<<<< SEARCH\nx\n",
])
def test_malformed_calls_are_errors_for_every_interface(text):
    for interface in INTERFACES:
        parsed = check_parsed(interface(), text)
        assert parsed.error is not None, (interface.name, text)


# ---- execute -------------------------------------------------------------------------------

SAFE_COMMANDS = ["true", "echo hi", "ls -la", "pwd", "false", "cat missing.txt", "printf x > made.txt", "exit 3", ""]
PATHS = st.sampled_from([
    "a.txt", "dir/b.txt", "../x", "/etc/passwd", "/workspace/a.txt", "", ".", "/workspace", "x\x00y", "link",
    "link/passwd", "dir",
]) | st.text(max_size=12)


def argument_values(name: str) -> st.SearchStrategy:
    if name in ("command", "cmd"):
        argv = st.lists(st.sampled_from(["echo", "ls", "two words", "-la", "true"]), max_size=3)
        return st.sampled_from(SAFE_COMMANDS) | argv | JSON_VALUES
    if name in ("path", "file_path", "workdir"):
        return PATHS | JSON_VALUES
    if name in ("timeout", "timeout_ms"):
        return st.integers(min_value=-5, max_value=3000) | JSON_VALUES
    return st.text(max_size=40) | JSON_VALUES


ARGUMENTS = st.lists(
    st.sampled_from(ARGUMENT_NAMES).flatmap(lambda n: st.tuples(st.just(n), argument_values(n)))
    | st.tuples(st.text(max_size=6), JSON_VALUES),
    max_size=5,
).map(dict)
CALLS = st.builds(
    ToolCall,
    name=st.sampled_from(TOOL_NAMES) | st.text(max_size=10) | st.integers(),
    arguments=ARGUMENTS | JSON_VALUES,
)


PATCH_LINES = [
    "*** Add File: a.txt\n", "*** Add File: new/c.txt\n", "+x\n", "+\n", "*** Update File: a.txt\n", "@@\n",
    "@@ root\n", "-root\n", "+ROOT\n", " line\n", "-\n", "\n", "*** Delete File: dir/b.txt\n",
    "*** Delete File: a.txt\n", "*** Move to: ../x\n", "*** Move to: moved.txt\n", "*** End of File\n",
    "*** Add File: /etc/x\n", "*** Update File: link/passwd\n", "garbage\n",
]
PATCH_TEXT = st.lists(st.sampled_from(PATCH_LINES), max_size=10).map(
    lambda lines: "*** Begin Patch\n" + "".join(lines) + "*** End Patch"
) | FRAGMENT_TEXT
PATTERNS = st.sampled_from(["root", "(a*)*b", "[", "^l", "\\d+", "*.txt", "**/*", "../*", "/workspace/*", ""]) | st.text(max_size=8)


def shaped_value(name: str, schema: dict) -> st.SearchStrategy:
    """Values of the right JSON type (and enum) for one argument, chosen to reach the handlers."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if name in ("command", "cmd"):
        argv = st.lists(st.sampled_from(["echo", "ls", "two words", "-la", "true"]), min_size=1, max_size=3)
        return st.sampled_from(SAFE_COMMANDS) | (argv if "array" in schema["type"] else st.nothing())
    if name in ("path", "file_path", "workdir"):
        return PATHS
    if name == "pattern":
        return PATTERNS
    if name == "input":
        return PATCH_TEXT
    if name in ("search", "old_str", "old_string"):
        return st.sampled_from(["", "root\n", "root", "line", "zzz"]) | st.text(max_size=10)
    kind = schema["type"]
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum", -3), max_value=min(schema.get("maximum", 3000), 3000))
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(st.integers(min_value=-3, max_value=12), min_size=2, max_size=2)
    return st.text(max_size=40)


def shaped_calls(interface: type[SchemaToolInterface]) -> st.SearchStrategy:
    """Calls that pass the schema of one of the interface's tools."""
    options = []
    for spec in interface().specs():
        properties, required = spec.parameters["properties"], spec.parameters["required"]
        options.append(st.fixed_dictionaries(
            {name: shaped_value(name, properties[name]) for name in required},
            optional={name: shaped_value(name, prop) for name, prop in properties.items() if name not in required},
        ).map(lambda arguments, tool=spec.name: ToolCall(tool, arguments)))
    return st.one_of(options)


@pytest.fixture(scope="module")
def fuzz_sandbox() -> Iterator[Sandbox]:
    with open_sandbox(limits=SandboxLimits(timeout_s=5.0)) as box:
        box.write_file("a.txt", "root\nline\n")
        box.write_file("dir/b.txt", "b\n")
        box.exec("ln -s /etc link")
        yield box


@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.name)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_execute_never_raises_and_bad_calls_are_errors(interface, data, fuzz_sandbox):
    tools = interface()
    call = data.draw(CALLS | shaped_calls(interface), label="call")
    output = tools.execute(call, fuzz_sandbox)
    assert isinstance(output, ToolOutput)
    assert INTERNAL_ERROR not in output.output, output.output  # every failure is anticipated
    (output.output + output.stderr).encode("utf-8")  # observations can always be tokenized
    problem = tools.check_call(call)
    event("bad call" if problem else "valid call")
    if problem is not None:
        assert output.is_error and output.output
