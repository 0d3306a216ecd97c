"""T0, T1 and T2: each in-space tool interface parses its syntax and runs its tools as the
harness it imitates does."""

from __future__ import annotations

from harnessrl.harness.base import ToolCall
from harnessrl.harness.tools.editor_json import ShellEditorJsonTools
from harnessrl.harness.tools.shell_block import SUBMIT_MARKER, ShellBlockTools
from harnessrl.harness.tools.tagged import FineGrainedTaggedTools
from tool_helpers import call, editor, run_text

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
    # 300 read as seconds would let the command finish and print; read as milliseconds it is cut.
    out = call(FineGrainedTaggedTools(), sandbox, "Bash", command="sleep 5; echo finished", timeout=300)
    assert out.timed_out and out.failed and "finished" not in out.output
    done = call(FineGrainedTaggedTools(), sandbox, "Bash", command="echo finished", timeout=60_000)
    assert not done.timed_out and done.output == "finished\n"
