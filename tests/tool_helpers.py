"""Helpers for the tool-interface tests: run the calls of a response, or one call, in a sandbox."""

from __future__ import annotations

from harnessrl.harness.base import ToolCall, ToolInterface, ToolOutput
from harnessrl.harness.tools.codex import CodexExecTools
from harnessrl.harness.tools.editor_json import ShellEditorJsonTools
from harnessrl.sandbox import Sandbox


def run_text(tools: ToolInterface, text: str, sandbox: Sandbox) -> list[ToolOutput]:
    parsed = tools.parse(text)
    assert parsed.error is None, parsed.error
    return [tools.execute(call, sandbox) for call in parsed.calls]


def call(tools: ToolInterface, sandbox: Sandbox, name: str, **arguments: object) -> ToolOutput:
    return tools.execute(ToolCall(name, dict(arguments)), sandbox)


def editor(sandbox: Sandbox, **arguments: object) -> ToolOutput:
    return call(ShellEditorJsonTools(), sandbox, "str_replace_editor", **arguments)


def patch(sandbox: Sandbox, text: str) -> ToolOutput:
    return call(CodexExecTools(), sandbox, "apply_patch", input=text)
