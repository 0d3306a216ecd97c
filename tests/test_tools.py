"""Tool interfaces: the oracle's text replays every action exactly, and every file tool keeps
the workspace's bounds. Each interface's own behaviour is in ``test_tools_in_space.py`` and
``test_tools_out_of_space.py``."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from harnessrl.harness.base import ToolCall, ToolInterface
from harnessrl.harness.observation import CodexHeaderObservation
from harnessrl.harness.registry import component_class, out_of_space_class
from harnessrl.harness.tools.aider import AiderEditBlockTools
from harnessrl.harness.tools.codex import CodexExecTools
from harnessrl.harness.tools.editor_json import ShellEditorJsonTools
from harnessrl.harness.tools.shell_block import SUBMIT_MARKER, ShellBlockTools
from harnessrl.harness.tools.tagged import FineGrainedTaggedTools
from harnessrl.sandbox import Sandbox, open_sandbox
from harnessrl.tasks.model import Action, apply_action
from tool_helpers import call, editor, patch, run_text

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
def sandbox_pair() -> Iterator[tuple[Sandbox, Sandbox]]:
    with open_sandbox() as reference, open_sandbox() as replay:
        yield reference, replay


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


def test_interfaces_are_registered_with_distinct_names_and_syntax():
    in_space = [component_class("T", level) for level in range(3)]
    assert [cls.name for cls in in_space] == ["shell_block", "shell_editor_json", "fine_grained_tagged"]
    assert out_of_space_class("T", "codex_exec") is CodexExecTools
    assert out_of_space_class("T", "aider_editblock") is AiderEditBlockTools
    assert out_of_space_class("O", "codex_header") is CodexHeaderObservation
    # The registry is the one lookup of out-of-space components, and it knows exactly these.
    with pytest.raises(KeyError, match=re.escape("known: ['aider_editblock', 'codex_exec']")):
        out_of_space_class("T", "claude_code")
    with pytest.raises(KeyError, match=re.escape("known: ['codex_header']")):
        out_of_space_class("O", "json_lines")
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
