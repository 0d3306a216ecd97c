"""Tool interfaces: the oracle's text replays every action exactly, and each tool keeps its promises."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harnessrl.harness.base import ToolCall, ToolInterface, ToolOutput
from harnessrl.harness.out_of_space import (
    OUT_OF_SPACE_OBSERVATIONS,
    OUT_OF_SPACE_TOOLS,
    AiderEditBlockTools,
    CodexExecTools,
    CodexHeaderObservation,
    PatchError,
    parse_patch,
)
from harnessrl.harness.registry import component_class, out_of_space_class
from harnessrl.harness.tools import (
    SUBMIT_MARKER,
    FineGrainedTaggedTools,
    ShellBlockTools,
    ShellEditorJsonTools,
)
from harnessrl.sandbox import Sandbox, open_sandbox
from harnessrl.tasks.model import Action, apply_action

INTERFACES: list[type[ToolInterface]] = [
    ShellBlockTools, ShellEditorJsonTools, FineGrainedTaggedTools, CodexExecTools, AiderEditBlockTools,
]

TRICKY_CONTENTS = {
    "plain": "hello\nworld\n",
    "no_final_newline": "first line\nlast line without newline",
    "shell_specials": "echo \"$HOME\" 'single' `date` $((1+1)) \\n \\\\ ${x:-y} !! *\n",
    "heredoc_words": "start\nEOF\nEOF_\nPYEOF\n'EOF'\nend\n",
    "unicode": "héllo — 世界 🚀\nζ = ∑ xᵢ\n",
    "empty": "",
    "fences": "```\ncode\n```\n```bash\nls\n```\n",
    "tags": "<tool_call>{\"name\": \"x\"}</tool_call>\n</function>\n<function=exec_command>\n",
    "edit_markers": "<<<<<<< SEARCH\n=======\n>>>>>>> REPLACE\n",
    "patch_markers": "*** Begin Patch\n*** End Patch\n+plus\n-minus\n@@ at\n *** End of File\n",
    "crlf": "a\r\nb\r\n",
    "whitespace": "\tindented  \n  \n\n",
    "json_like": '{"name": "bash", "arguments": {"command": "rm -rf /"}}\n',
    "marker": f"{SUBMIT_MARKER}\n/submit 1\n/run ls\n",
}

FENCE_COMMAND = "cat > fence.md <<'X'\n```\ninside\n```\nX"
SCENARIOS: dict[str, list[Action]] = {
    **{
        f"write_edit_{key}": [
            Action.write("pkg/sub/file.txt", "HEADER line\n" + content),
            Action.edit("pkg/sub/file.txt", "HEADER line\n", "new 'header' $x `y` \\ \"q\"\n"),
            Action.edit("pkg/sub/file.txt", "new 'header'", "NEW"),
        ]
        for key, content in TRICKY_CONTENTS.items()
    },
    "write_tricky_then_overwrite": [
        Action.write("a.txt", TRICKY_CONTENTS["shell_specials"] + TRICKY_CONTENTS["fences"]),
        Action.write("a.txt", "short"),
    ],
    "edit_tricky_old_and_new": [
        Action.write("code.py", "def f():\n    return 1\n\n\ndef g():\n    return '$HOME'\n"),
        Action.edit("code.py", "    return '$HOME'\n", "    return \"```\"\n    # EOF </tool_call>\n"),
        Action.edit("code.py", "def f():\n    return 1\n", ""),
        Action.edit("code.py", "return \"```\"", "return `x`\\n"),
    ],
    "edit_unicode_partial_line": [
        Action.write("u.txt", "naïve café\nline two\n"),
        Action.edit("u.txt", "café", "☕ \\ $"),
    ],
    "edit_without_final_newline": [
        Action.write("n.txt", "one\ntwo\nthree"),
        Action.edit("n.txt", "two\n", "TWO\n2\n"),
    ],
    "run_commands": [
        Action.run("mkdir -p out/deep && printf 'x' > out/deep/made && echo hi > 'out/with space.txt'"),
        Action.run(FENCE_COMMAND),
        Action.run("printf '%s' \"$((6*7))\" > answer.txt; cp answer.txt out/"),
    ],
    "submit_plain": [Action.submit("42")],
    "submit_tricky": [Action.submit("it's a \"quoted\" $HOME `x` \\ answer")],
    "submit_unicode": [Action.submit("héllo 世界")],
    "submit_empty": [Action.submit("")],
}


def tree(sandbox: Sandbox) -> dict[str, bytes | None]:
    """Every directory (None) and file (its bytes) of the workspace, by relative path."""
    root = str(sandbox.workspace.root)
    snapshot: dict[str, bytes | None] = {}
    for directory, _dirs, files in os.walk(root):
        snapshot[os.path.relpath(directory, root) + "/"] = None
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                snapshot[os.path.relpath(path, root)] = handle.read()
    return snapshot


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with open_sandbox() as box:
        yield box


@pytest.fixture
def sandbox_pair() -> Iterator[tuple[Sandbox, Sandbox]]:
    with open_sandbox() as reference, open_sandbox() as replay:
        yield reference, replay


def run_text(tools: ToolInterface, text: str, sandbox: Sandbox) -> list[ToolOutput]:
    parsed = tools.parse(text)
    assert parsed.error is None, parsed.error
    return [tools.execute(call, sandbox) for call in parsed.calls]


def call(tools: ToolInterface, sandbox: Sandbox, name: str, **arguments: object) -> ToolOutput:
    return tools.execute(ToolCall(name, dict(arguments)), sandbox)


# ---- the oracle ------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.name)
def test_rendered_actions_replay_exactly_like_apply_action(interface, scenario, sandbox_pair):
    reference, replay = sandbox_pair
    tools = interface()
    for action in SCENARIOS[scenario]:
        expected_answer = apply_action(action, reference)
        outputs = run_text(tools, tools.render(action, thought="Next step."), replay)
        assert outputs, action
        assert not any(o.failed for o in outputs), [o.output + o.stderr for o in outputs]
        submitted = [o.submitted for o in outputs if o.submitted is not None]
        if action.kind == "submit":
            assert submitted == [expected_answer]
        else:
            assert submitted == []
    assert tree(replay) == tree(reference)


@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.name)
def test_rendered_thought_is_parsed_back(interface):
    tools = interface()
    parsed = tools.parse(tools.render(Action.run("ls"), thought="I will list the files."))
    assert parsed.thought == "I will list the files." and len(parsed.calls) == 1


@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.name)
def test_every_interface_documents_its_tools_and_parses_its_own_example(interface):
    tools = interface()
    names = [spec.name for spec in tools.specs()]
    assert tools.submit_tool in names
    assert all(spec.parameters["type"] == "object" for spec in tools.specs())
    usage = tools.usage()
    assert all(name in usage for name in names if name not in ("edit", "run"))
    parsed = tools.parse(tools.example())
    assert parsed.error is None and parsed.calls
    assert tools.stop_sequences() == []


def test_interfaces_are_registered_with_distinct_names_and_syntax():
    in_space = [component_class("T", level) for level in range(3)]
    assert [cls.name for cls in in_space] == ["shell_block", "shell_editor_json", "fine_grained_tagged"]
    assert out_of_space_class("T", "codex_exec") is CodexExecTools
    assert out_of_space_class("T", "aider_editblock") is AiderEditBlockTools
    assert out_of_space_class("O", "codex_header") is CodexHeaderObservation
    assert set(OUT_OF_SPACE_TOOLS) == {"codex_exec", "aider_editblock"}
    assert set(OUT_OF_SPACE_OBSERVATIONS) == {"codex_header"}
    # The same action is written differently by every interface, and no interface accepts
    # another's syntax for a call it did not write.
    texts = {cls.name: cls().render(Action.run("ls -la")) for cls in INTERFACES}
    assert len(set(texts.values())) == len(INTERFACES)
    tool_sets = [{spec.name for spec in cls().specs()} for cls in INTERFACES]
    assert len({frozenset(s) for s in tool_sets}) == len(INTERFACES)
    for cls in INTERFACES:
        for other, text in texts.items():
            # Aider runs ```bash blocks like T0 by design; its edits and /run, /submit are its own.
            shared = {cls.name, other} == {"shell_block", "aider_editblock"}
            if other != cls.name and not shared:
                assert cls().parse(text).error is not None, (cls.name, other)


# ---- T0: shell_block ---------------------------------------------------------------------


def test_t0_two_blocks_or_none_is_a_format_error():
    tools = ShellBlockTools()
    two = tools.parse("THOUGHT: x\n```bash\nls\n```\nand\n```sh\npwd\n```")
    assert two.error_kind == "format" and not two.calls
    assert "EXACTLY ONE action in triple backticks, found 2 actions" in two.error
    none = tools.parse("I am done thinking.")
    assert "found 0 actions" in none.error and not none.calls
    unterminated = tools.parse("THOUGHT\n```bash\nls -la\n")
    assert "not closed" in unterminated.error


def test_t0_accepts_bash_sh_shell_and_bare_fences_but_not_other_languages():
    tools = ShellBlockTools()
    for lang in ("bash", "sh", "shell", ""):
        parsed = tools.parse(f"THOUGHT: look\n\n```{lang}\nls -la\n```")
        assert parsed.calls == (ToolCall("bash", {"command": "ls -la"}),) and parsed.thought == "look"
    with_python = tools.parse("```python\nprint(1)\n```\n```bash\nls\n```")
    assert with_python.calls == (ToolCall("bash", {"command": "ls"}),)
    assert tools.parse("```bash\n\n```").error is not None


def test_t0_submit_takes_the_output_after_the_marker(sandbox):
    tools = ShellBlockTools()
    sandbox.write_file("answer.txt", "  the answer\n\n")
    outputs = run_text(tools, f"```bash\necho {SUBMIT_MARKER} && cat answer.txt\n```", sandbox)
    assert outputs[0].submitted == "the answer" and outputs[0].tool == "submit"
    bare = run_text(tools, f"```bash\necho {SUBMIT_MARKER}\n```", sandbox)
    assert bare[0].submitted == ""
    plain = run_text(tools, "```bash\necho not yet\n```", sandbox)
    assert plain[0].submitted is None and plain[0].output == "not yet\n"


def test_t0_commands_share_one_shell_session(sandbox):
    tools = ShellBlockTools()
    run_text(tools, "```bash\nmkdir -p sub && cd sub\n```", sandbox)
    assert run_text(tools, "```bash\npwd\n```", sandbox)[0].output.strip().endswith("/sub")
    failed = run_text(tools, "```bash\nfalse\n```", sandbox)[0]
    assert failed.exit_code == 1 and failed.failed and not failed.is_error


# ---- T1: shell_editor_json ---------------------------------------------------------------


def editor(sandbox: Sandbox, **arguments: object) -> ToolOutput:
    return call(ShellEditorJsonTools(), sandbox, "str_replace_editor", **arguments)


def test_t1_view_numbers_lines_and_honours_view_range(sandbox):
    sandbox.write_file("f.py", "a\nb\nc\nd\n")
    whole = editor(sandbox, command="view", path="/workspace/f.py")
    assert whole.output.startswith("Here's the result of running `cat -n` on /workspace/f.py:\n")
    assert "     1\ta\n     2\tb\n     3\tc\n     4\td" in whole.output
    part = editor(sandbox, command="view", path="f.py", view_range=[2, 3]).output
    assert "     2\tb\n     3\tc" in part and "\ta" not in part and "\td" not in part
    tail = editor(sandbox, command="view", path="f.py", view_range=[3, -1]).output
    assert "     3\tc\n     4\td" in tail and "\tb" not in tail
    bad = editor(sandbox, command="view", path="f.py", view_range=[9, 10])
    assert bad.is_error and "view_range" in bad.output


def test_t1_view_of_a_directory_lists_two_levels_without_hidden_items(sandbox):
    for path in ("src/a.py", "src/pkg/b.py", "src/pkg/deep/c.py", ".git/config", "src/.hidden"):
        sandbox.write_file(path, "x\n")
    listing = editor(sandbox, command="view", path="/workspace").output
    assert "/workspace/src/a.py" in listing and "/workspace/src/pkg/" in listing
    assert "/workspace/src/pkg/b.py" not in listing
    view = editor(sandbox, command="view", path="src").output
    assert "/workspace/src/a.py" in view and "/workspace/src/pkg/b.py" in view
    assert "deep/c.py" not in view and ".hidden" not in view
    assert ".git" not in listing


def test_t1_str_replace_requires_a_unique_match_and_reports_the_count(sandbox):
    sandbox.write_file("f.txt", "x = 1\ny = 2\nx = 1\n")
    twice = editor(sandbox, command="str_replace", path="f.txt", old_str="x = 1", new_str="x = 3")
    assert twice.is_error and "Multiple occurrences (2)" in twice.output and "[1, 3]" in twice.output
    missing = editor(sandbox, command="str_replace", path="f.txt", old_str="z = 9", new_str="")
    assert missing.is_error and "did not appear verbatim" in missing.output
    assert sandbox.read_file("f.txt") == "x = 1\ny = 2\nx = 1\n"
    done = editor(sandbox, command="str_replace", path="f.txt", old_str="y = 2", new_str="y = 5")
    assert not done.is_error and done.changed_paths == ("f.txt",)
    assert "has been edited" in done.output and "     2\ty = 5" in done.output
    assert sandbox.read_file("f.txt") == "x = 1\ny = 5\nx = 1\n"


def test_t1_insert_goes_after_the_given_line(sandbox):
    sandbox.write_file("f.txt", "one\ntwo\n")
    editor(sandbox, command="insert", path="f.txt", insert_line=0, new_str="zero")
    editor(sandbox, command="insert", path="f.txt", insert_line=2, new_str="one and a half\n")
    editor(sandbox, command="insert", path="f.txt", insert_line=4, new_str="three")
    assert sandbox.read_file("f.txt") == "zero\none\none and a half\ntwo\nthree\n"
    bad = editor(sandbox, command="insert", path="f.txt", insert_line=9, new_str="x")
    assert bad.is_error and "[0, 5]" in bad.output
    needs = editor(sandbox, command="insert", path="f.txt", insert_line=1)
    assert needs.is_error and "new_str" in needs.output


def test_t1_schema_errors_name_the_argument_and_show_the_schema():
    tools = ShellEditorJsonTools()
    cases = {
        '{"name": "str_replace_editor", "arguments": {"command": "view"}}': "`path`",
        '{"name": "str_replace_editor", "arguments": {"command": "insert", "path": "f",'
        ' "insert_line": "3", "new_str": "x"}}': "`insert_line` must be of type integer",
        '{"name": "str_replace_editor", "arguments": {"command": "delete", "path": "f"}}': "`command` must be one of",
        '{"name": "bash", "arguments": {"command": "ls", "cwd": "/"}}': "unexpected argument `cwd`",
        '{"name": "submit", "arguments": {"answer": 42}}': "`answer` must be of type string",
    }
    for text, fragment in cases.items():
        parsed = tools.parse(text)
        assert parsed.error_kind == "tool" and not parsed.calls, text
        assert fragment in parsed.error and "Expected arguments (JSON schema)" in parsed.error


def test_t1_unknown_tool_lists_the_available_tools():
    parsed = ShellEditorJsonTools().parse('{"name": "python", "arguments": {"code": "1"}}')
    assert parsed.error_kind == "tool"
    assert "Unknown tool `python`" in parsed.error and "bash, str_replace_editor, submit" in parsed.error


def test_t1_accepts_fenced_or_bare_json_and_string_arguments():
    tools = ShellEditorJsonTools()
    expected = (ToolCall("bash", {"command": "ls"}),)
    assert tools.parse('Look.\n```json\n{"name": "bash", "arguments": {"command": "ls"}}\n```').calls == expected
    assert tools.parse('Look. {"name": "bash", "arguments": {"command": "ls"}} then I read it.').calls == expected
    assert tools.parse('{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}').calls == expected
    nested = tools.parse('{"name": "bash", "arguments": {"command": "echo \'{\\"a\\": {}}\'"}}')
    assert nested.calls[0].arguments["command"] == "echo '{\"a\": {}}'"


def test_t1_malformed_or_repeated_calls_are_format_errors_with_a_hint():
    tools = ShellEditorJsonTools()
    broken = tools.parse('{"name": "bash", "arguments": {"command": "ls"')
    assert broken.error_kind == "format" and "not valid JSON" in broken.error
    assert '"name": "str_replace_editor"' in broken.error  # the example
    two = tools.parse('{"name": "bash", "arguments": {"command": "ls"}}\n{"name": "bash", "arguments": {"command": "pwd"}}')
    assert two.error_kind == "format" and "exactly ONE" in two.error


# ---- T2: fine_grained_tagged -------------------------------------------------------------


def test_t2_read_numbers_lines_with_offset_and_limit(sandbox):
    tools = FineGrainedTaggedTools()
    sandbox.write_file("f.txt", "".join(f"line {i}\n" for i in range(1, 11)))
    whole = call(tools, sandbox, "Read", file_path="/workspace/f.txt").output
    assert whole.splitlines()[0] == "     1\tline 1" and whole.splitlines()[-1] == "    10\tline 10"
    part = call(tools, sandbox, "Read", file_path="f.txt", offset=4, limit=2).output
    assert part == "     4\tline 4\n     5\tline 5"
    beyond = call(tools, sandbox, "Read", file_path="f.txt", offset=50).output
    assert "shorter than the provided offset (50)" in beyond and "10 lines" in beyond
    sandbox.write_file("empty.txt", "")
    assert "contents are empty" in call(tools, sandbox, "Read", file_path="empty.txt").output
    missing = call(tools, sandbox, "Read", file_path="nope.txt")
    assert missing.is_error and "does not exist" in missing.output
    directory = call(tools, sandbox, "Read", file_path="/workspace")
    assert directory.is_error and "EISDIR" in directory.output


def test_t2_edit_requires_uniqueness_unless_replace_all(sandbox):
    tools = FineGrainedTaggedTools()
    sandbox.write_file("f.txt", "a b a b a\n")
    many = call(tools, sandbox, "Edit", file_path="f.txt", old_string="a", new_string="c")
    assert many.is_error and "Found 3 matches" in many.output and "replace_all" in many.output
    same = call(tools, sandbox, "Edit", file_path="f.txt", old_string="a", new_string="a")
    assert same.is_error and "No changes to make" in same.output
    absent = call(tools, sandbox, "Edit", file_path="f.txt", old_string="zz", new_string="y")
    assert absent.is_error and "not found" in absent.output
    every = call(tools, sandbox, "Edit", file_path="f.txt", old_string="a", new_string="c", replace_all=True)
    assert not every.is_error and sandbox.read_file("f.txt") == "c b c b c\n"
    created = call(tools, sandbox, "Edit", file_path="new/g.txt", old_string="", new_string="fresh\n")
    assert created.changed_paths == ("new/g.txt",) and sandbox.read_file("new/g.txt") == "fresh\n"
    again = call(tools, sandbox, "Edit", file_path="new/g.txt", old_string="", new_string="x")
    assert again.is_error and "already exists" in again.output


def test_t2_grep_searches_inside_the_sandbox(sandbox):
    tools = FineGrainedTaggedTools()
    sandbox.write_file("src/a.py", "import os\ndef main():\n    return os.getcwd()\n")
    sandbox.write_file("src/b.txt", "main street\nMAIN road\n")
    sandbox.write_file(".hidden/c.py", "def main(): pass\n")
    files = call(tools, sandbox, "Grep", pattern=r"main\b").output
    assert files == "Found 2 files\n/workspace/src/a.py\n/workspace/src/b.txt"
    content = call(tools, sandbox, "Grep", pattern="main", glob="*.py", output_mode="content").output
    assert content == "/workspace/src/a.py:2:def main():"
    counts = call(tools, sandbox, "Grep", pattern="main", path="src", output_mode="count", **{"-i": True}).output
    assert counts.splitlines() == ["/workspace/src/a.py:1", "/workspace/src/b.txt:2"]
    braces = call(tools, sandbox, "Grep", pattern="o", glob="*.{py,txt}").output
    assert braces.startswith("Found 2 files")
    assert call(tools, sandbox, "Grep", pattern="zebra").output == "No files found"
    bad = call(tools, sandbox, "Grep", pattern="(unclosed")
    assert bad.is_error and "invalid regular expression" in bad.output


def test_t2_glob_finds_files_sorted_and_confined(sandbox):
    tools = FineGrainedTaggedTools()
    for path in ("b.py", "src/a.py", "src/deep/c.py", "src/d.txt", ".hidden/e.py"):
        sandbox.write_file(path, "")
    found = call(tools, sandbox, "Glob", pattern="**/*.py").output.splitlines()
    assert found == ["/workspace/b.py", "/workspace/src/a.py", "/workspace/src/deep/c.py"]
    assert call(tools, sandbox, "Glob", pattern="*.txt", path="/workspace/src").output == "/workspace/src/d.txt"
    assert call(tools, sandbox, "Glob", pattern="/workspace/src/*.py").output == "/workspace/src/a.py"
    assert call(tools, sandbox, "Glob", pattern="../../etc/*").output == "No files found"
    assert call(tools, sandbox, "Glob", pattern="/etc/*").is_error


def test_t2_runs_several_calls_in_order_and_limits_them(sandbox):
    tools = FineGrainedTaggedTools()
    text = (
        'Writing then reading.\n<tool_call>\n{"name": "Write", "arguments": {"file_path": "/workspace/x.txt", "content": "hi\\n"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "cat x.txt"}}\n</tool_call>\n'
        '<tool_call>{"name": "Read", "arguments": {"file_path": "x.txt"}}'  # generation stopped early
    )
    parsed = tools.parse(text)
    assert [c.name for c in parsed.calls] == ["Write", "Bash", "Read"] and parsed.thought == "Writing then reading."
    outputs = [tools.execute(c, sandbox) for c in parsed.calls]
    assert outputs[1].output == "hi\n" and outputs[2].output == "     1\thi"
    six = "".join('<tool_call>{"name": "Bash", "arguments": {"command": "ls"}}</tool_call>' for _ in range(6))
    assert tools.parse(six).error_kind == "format"
    assert tools.parse("<tool_call>ls -la</tool_call>").error_kind == "format"
    assert tools.parse('{"name": "Bash", "arguments": {"command": "ls"}}').error_kind == "format"
    unknown = tools.parse('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>')
    assert unknown.error_kind == "tool" and "Read, Write, Edit, Bash, Grep, Glob, Finish" in unknown.error


def test_t2_bash_timeout_is_in_milliseconds(sandbox):
    out = call(FineGrainedTaggedTools(), sandbox, "Bash", command="sleep 5", timeout=300)
    assert out.timed_out and out.failed and out.duration_s < 4


# ---- path confinement, all file tools ------------------------------------------------------

ESCAPES = ["../x", "/etc/passwd", "link/passwd", "linkfile", "/workspace/../etc/passwd"]
FILE_CALLS = [
    (ShellEditorJsonTools, "str_replace_editor", lambda p: {"command": "view", "path": p}),
    (ShellEditorJsonTools, "str_replace_editor", lambda p: {"command": "create", "path": p, "file_text": "x"}),
    (FineGrainedTaggedTools, "Read", lambda p: {"file_path": p}),
    (FineGrainedTaggedTools, "Write", lambda p: {"file_path": p, "content": "x"}),
    (FineGrainedTaggedTools, "Edit", lambda p: {"file_path": p, "old_string": "root", "new_string": "x"}),
    (FineGrainedTaggedTools, "Grep", lambda p: {"pattern": "root", "path": p}),
    (FineGrainedTaggedTools, "Glob", lambda p: {"pattern": "*", "path": p}),
    (CodexExecTools, "exec_command", lambda p: {"cmd": ["ls"], "workdir": p}),
    (CodexExecTools, "apply_patch", lambda p: {"input": f"*** Begin Patch\n*** Add File: {p}\n+x\n*** End Patch"}),
    (CodexExecTools, "apply_patch", lambda p: {"input": f"*** Begin Patch\n*** Delete File: {p}\n*** End Patch"}),
    (AiderEditBlockTools, "edit", lambda p: {"path": p, "search": "", "replace": "x\n"}),
    (AiderEditBlockTools, "edit", lambda p: {"path": p, "search": "root", "replace": "x"}),
]


def test_paths_outside_the_workspace_are_error_outputs(sandbox):
    sandbox.exec("ln -s /etc link && ln -s /etc/passwd linkfile")
    before = Path("/etc/passwd").read_bytes()
    for interface, name, make in FILE_CALLS:
        for path in ESCAPES:
            output = interface().execute(ToolCall(name, make(path)), sandbox)
            assert output.is_error, (interface.name, name, path, output.output)
            assert output.output and "Traceback" not in output.output
    assert Path("/etc/passwd").read_bytes() == before
    assert os.path.islink(os.path.join(sandbox.workspace.root, "linkfile"))


# ---- codex_exec ------------------------------------------------------------------------------


def patch(sandbox: Sandbox, text: str) -> ToolOutput:
    return call(CodexExecTools(), sandbox, "apply_patch", input=text)


def test_codex_apply_patch_adds_updates_moves_and_deletes(sandbox):
    sandbox.write_file("app.py", "import os\n\ndef greet():\n    print('Hi')\n    return 1\n\n\ndef other():\n    return 2\n")
    sandbox.write_file("old.txt", "bye\n")
    out = patch(sandbox, """*** Begin Patch
*** Add File: docs/new.md
+# Title
+
+body
*** Update File: app.py
@@ def greet():
-    print('Hi')
+    print('Hello, world!')
     return 1
@@
 def other():
-    return 2
+    return 3
*** Delete File: old.txt
*** End Patch""")
    assert not out.is_error, out.output
    assert out.output.splitlines()[1:] == ["A docs/new.md", "M app.py", "D old.txt"]
    assert set(out.changed_paths) == {"docs/new.md", "app.py", "old.txt"}
    assert sandbox.read_file("docs/new.md") == "# Title\n\nbody\n"
    assert sandbox.read_file("app.py") == (
        "import os\n\ndef greet():\n    print('Hello, world!')\n    return 1\n\n\ndef other():\n    return 3\n"
    )
    assert not sandbox.exists("old.txt")
    moved = patch(sandbox, "*** Begin Patch\n*** Update File: docs/new.md\n*** Move to: docs/renamed.md\n@@\n-body\n+text\n*** End Patch")
    assert not moved.is_error and not sandbox.exists("docs/new.md")
    assert sandbox.read_file("docs/renamed.md") == "# Title\n\ntext\n"


def test_codex_hunk_that_does_not_match_is_an_error_and_changes_nothing(sandbox):
    sandbox.write_file("a.txt", "one\ntwo\n")
    out = patch(sandbox, "*** Begin Patch\n*** Add File: b.txt\n+new\n*** Update File: a.txt\n@@\n-three\n+3\n*** End Patch")
    assert out.is_error and "Failed to find expected lines in a.txt" in out.output and "three" in out.output
    assert sandbox.read_file("a.txt") == "one\ntwo\n" and not sandbox.exists("b.txt")
    missing = patch(sandbox, "*** Begin Patch\n*** Update File: nope.txt\n@@\n-a\n+b\n*** End Patch")
    assert missing.is_error and "does not exist" in missing.output
    context = patch(sandbox, "*** Begin Patch\n*** Update File: a.txt\n@@ def nowhere():\n-one\n+1\n*** End Patch")
    assert context.is_error and "Failed to find context" in context.output


def test_codex_patch_grammar_errors_are_reported():
    with pytest.raises(PatchError, match="first line"):
        parse_patch("*** Update File: a\n@@\n-a\n+b\n*** End Patch")
    with pytest.raises(PatchError, match="last line"):
        parse_patch("*** Begin Patch\n*** Add File: a\n+x")
    with pytest.raises(PatchError, match="not a valid hunk header"):
        parse_patch("*** Begin Patch\n*** Rename File: a\n*** End Patch")
    with pytest.raises(PatchError, match="Unexpected line"):
        parse_patch("*** Begin Patch\n*** Update File: a\n@@\n-a\nb\n*** End Patch")
    with pytest.raises(PatchError, match="is empty"):
        parse_patch("*** Begin Patch\n*** Update File: a\n*** End Patch")
    ops = parse_patch("*** Begin Patch\n*** Update File: a\n@@ ctx\n x\n-y\n+z\n*** End of File\n*** End Patch")
    assert ops[0].chunks[0].context == "ctx" and ops[0].chunks[0].end_of_file
    assert ops[0].chunks[0].old_lines == ("x", "y") and ops[0].chunks[0].new_lines == ("x", "z")


def test_codex_patch_end_of_file_and_whitespace_tolerant_matching(sandbox):
    sandbox.write_file("f.txt", "x\nend\nx\nend\n")
    out = patch(sandbox, "*** Begin Patch\n*** Update File: f.txt\n@@\n x\n-end\n+END\n*** End of File\n*** End Patch")
    assert not out.is_error and sandbox.read_file("f.txt") == "x\nend\nx\nEND\n"
    sandbox.write_file("g.py", "def f():   \n    pass\n")
    out = patch(sandbox, "*** Begin Patch\n*** Update File: g.py\n@@\n-def f():\n+def g():\n*** End Patch")
    assert not out.is_error and sandbox.read_file("g.py") == "def g():\n    pass\n"


def test_codex_exec_command_runs_argv_in_workdir_with_a_timeout(sandbox):
    tools = CodexExecTools()
    sandbox.write_file("sub/dir/f.txt", "x")
    argv = call(tools, sandbox, "exec_command", cmd=["printf", "%s|", "two words", "it's", "$HOME"])
    assert argv.output == "two words|it's|$HOME|"
    where = call(tools, sandbox, "exec_command", cmd="pwd && ls", workdir="sub/dir")
    assert where.output.splitlines()[-1] == "f.txt" and where.output.splitlines()[0].endswith("/sub/dir")
    # Every command starts at the workspace root (or workdir), like a fresh Codex process.
    assert call(tools, sandbox, "exec_command", cmd="ls").output.split() == ["sub"]
    slow = call(tools, sandbox, "exec_command", cmd=["sleep", "5"], timeout_ms=300)
    assert slow.timed_out
    empty = call(tools, sandbox, "exec_command", cmd=[])
    assert empty.is_error and "`cmd`" in empty.output


def test_codex_parses_raw_and_json_patch_bodies_and_rejects_unknown_functions():
    tools = CodexExecTools()
    patch_text = "*** Begin Patch\n*** Add File: a\n+x\n*** End Patch"
    raw = tools.parse(f"Adding.\n<function=apply_patch>\n{patch_text}\n</function>")
    assert raw.calls == (ToolCall("apply_patch", {"input": patch_text}),) and raw.thought == "Adding."
    as_json = tools.parse('<function=apply_patch>{"input": "*** Begin Patch\\n*** Add File: a\\n+x\\n*** End Patch"}</function>')
    assert as_json.calls == raw.calls
    several = tools.parse('<function=exec_command>{"cmd": "ls"}</function><function=final_answer>{"answer": "x"}</function>')
    assert [c.name for c in several.calls] == ["exec_command", "final_answer"]
    unknown = tools.parse('<function=shell>{"command": ["ls"]}</function>')
    assert unknown.error_kind == "tool" and "exec_command, apply_patch, final_answer" in unknown.error
    bad = tools.parse("<function=exec_command>ls -la</function>")
    assert bad.error_kind == "format" and "<function=exec_command>" in bad.error
    wrong_type = tools.parse('<function=exec_command>{"cmd": 5}</function>')
    assert wrong_type.error_kind == "tool" and "`cmd` must be of type array or string" in wrong_type.error


def test_codex_header_observation_shows_exit_code_time_and_cut_output():
    obs = CodexHeaderObservation()
    text = obs.format(ToolOutput(tool="exec_command", output="hello\n", stderr="warn\n", exit_code=2, duration_s=0.123))
    assert text == "Exit code: 2\nWall time: 0.1 seconds\nOutput:\nhello\nwarn\n"
    long = obs.format(ToolOutput(tool="x", output="".join(f"l{i}\n" for i in range(1000)), exit_code=0))
    assert "Total output lines: 1001" in long and "[... omitted 745 of 1001 lines ...]" in long
    assert "l0\n" in long and "l999" in long and "l500\n" not in long
    assert obs.format(ToolOutput(tool="x", output="no such file", is_error=True)).startswith("Exit code: 1\n")
    assert obs.format_error("bad call", "tool") == "tool error: bad call"


# ---- aider_editblock -----------------------------------------------------------------------


def test_aider_runs_blocks_commands_and_submit_in_order(sandbox):
    tools = AiderEditBlockTools()
    sandbox.write_file("app.py", "def f():\n    return 1\n\ndef g():\n    return 2\n")
    text = """I'll change both functions, then test.

app.py
```python
<<<<<<< SEARCH
    return 1
=======
    return 10
>>>>>>> REPLACE
```

```python
<<<<<<< SEARCH
    return 2
=======
    return 20
>>>>>>> REPLACE
```

notes/todo.md
```
<<<<<<< SEARCH
=======
- done
>>>>>>> REPLACE
```

```bash
cat app.py notes/todo.md | wc -l
```
/run echo ran
/submit 30
"""
    parsed = tools.parse(text)
    assert parsed.error is None and parsed.thought == "I'll change both functions, then test."
    assert [c.name for c in parsed.calls] == ["edit", "edit", "edit", "run", "run", "submit"]
    assert parsed.calls[1].arguments["path"] == "app.py"  # the previous block's file name
    outputs = [tools.execute(c, sandbox) for c in parsed.calls]
    assert sandbox.read_file("app.py") == "def f():\n    return 10\n\ndef g():\n    return 20\n"
    assert sandbox.read_file("notes/todo.md") == "- done\n"
    assert outputs[3].output.strip() == "6" and outputs[4].output == "ran\n"
    assert outputs[5].submitted == "30"


def test_aider_search_that_does_not_match_is_reported(sandbox):
    tools = AiderEditBlockTools()
    sandbox.write_file("a.py", "x = 1\ny = 2   \n")
    miss = call(tools, sandbox, "edit", path="a.py", search="x = 2\n", replace="x = 3\n")
    assert miss.is_error and "SearchReplaceNoExactMatch" in miss.output and "x = 2" in miss.output
    flexible = call(tools, sandbox, "edit", path="a.py", search="y = 2\n", replace="y = 5\n")
    assert not flexible.is_error and sandbox.read_file("a.py") == "x = 1\ny = 5\n"
    absent = call(tools, sandbox, "edit", path="none.py", search="a\n", replace="b\n")
    assert absent.is_error and "does not exist" in absent.output


def test_aider_malformed_blocks_are_format_errors():
    tools = AiderEditBlockTools()
    no_name = tools.parse("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n")
    assert no_name.error_kind == "format" and "filename" in no_name.error
    unfinished = tools.parse("a.py\n<<<<<<< SEARCH\na\n=======\nb\n")
    assert unfinished.error_kind == "format" and ">>>>>>> REPLACE" in unfinished.error
    no_divider = tools.parse("a.py\n<<<<<<< SEARCH\na\n>>>>>>> REPLACE\n")
    assert no_divider.error_kind == "format" and "=======" in no_divider.error
    nothing = tools.parse("I think the answer is 4.")
    assert nothing.error_kind == "format" and "No SEARCH/REPLACE blocks" in nothing.error
    open_bash = tools.parse("```bash\nls\n")
    assert open_bash.error_kind == "format"


def test_aider_bash_fence_around_an_edit_block_is_an_edit():
    parsed = AiderEditBlockTools().parse("run.sh\n```bash\n<<<<<<< SEARCH\n=======\necho hi\n>>>>>>> REPLACE\n```")
    assert parsed.calls == (ToolCall("edit", {"path": "run.sh", "search": "", "replace": "echo hi\n"}),)


def test_undecodable_bytes_survive_edits_and_are_shown_replaced(sandbox):
    sandbox.write_file("latin.txt", b"caf\xe9\nline\n")
    edited = call(FineGrainedTaggedTools(), sandbox, "Edit", file_path="latin.txt", old_string="line", new_string="LINE")
    assert not edited.is_error and sandbox.read_bytes("latin.txt") == b"caf\xe9\nLINE\n"
    replaced = editor(sandbox, command="str_replace", path="latin.txt", old_str="LINE", new_str="l2")
    assert not replaced.is_error and sandbox.read_bytes("latin.txt") == b"caf\xe9\nl2\n"
    shown = call(FineGrainedTaggedTools(), sandbox, "Read", file_path="latin.txt").output
    assert shown == "     1\tcaf\ufffd\n     2\tl2"
    patched = patch(sandbox, "*** Begin Patch\n*** Update File: latin.txt\n@@\n-l2\n+l3\n*** End Patch")
    assert not patched.is_error and sandbox.read_bytes("latin.txt") == b"caf\xe9\nl3\n"
