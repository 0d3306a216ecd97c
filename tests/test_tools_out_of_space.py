"""codex_exec (with Codex's patch grammar) and aider_editblock: the out-of-space tool interfaces
parse their syntax and run their tools as Codex CLI and Aider do."""

from __future__ import annotations

import pytest

from harnessrl.harness.base import ToolCall
from harnessrl.harness.tools.aider import AiderEditBlockTools
from harnessrl.harness.tools.codex import CodexExecTools
from harnessrl.harness.tools.codex_patch import PatchError, parse_patch
from tool_helpers import call, patch

# ---- codex_exec ------------------------------------------------------------------------------


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


def test_aider_submits_a_multi_line_answer_in_a_fenced_block_after_a_bare_submit_line():
    from harnessrl.harness.tools.aider import AiderEditBlockTools
    from harnessrl.tasks import Action

    tools = AiderEditBlockTools()
    for answer in ("a.txt\nb.txt", "```\ninside\n````", "  indented\n\nlast\n"):
        parsed = tools.parse(tools.render(Action.submit(answer), thought="done"))
        assert [call.arguments for call in parsed.calls] == [{"answer": answer}], answer
    written = tools.parse("Found them.\n/submit\n```\nx/one.log\nx/two.md\n```")
    assert written.calls[0].arguments == {"answer": "x/one.log\nx/two.md"}
    assert tools.parse("/submit\n```\nnever closed").error_kind == "format"
    # a ```bash block after a bare /submit stays a command
    assert [c.name for c in tools.parse("/submit\n```bash\nls\n```").calls] == ["submit", "run"]
