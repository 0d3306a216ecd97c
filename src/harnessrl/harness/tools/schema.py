"""SchemaToolInterface: the base of every tool interface whose tools have JSON schemas (all
five built-in ones): the tool list, argument checks and dispatch to one handler per tool."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from harnessrl.harness.base import ToolCall, ToolInterface, ToolOutput, ToolSpec
from harnessrl.harness.tools.arguments import validate_arguments
from harnessrl.harness.tools.common import ToolError, encodable, error_output
from harnessrl.sandbox import SandboxError

if TYPE_CHECKING:
    from harnessrl.sandbox import Sandbox

INTERNAL_ERROR = "internal error"  # marks a failure no handler anticipated (a bug to fix)


def tool_list(specs: list[ToolSpec]) -> str:
    """Returns the names of ``specs`` as a comma-separated list."""
    return ", ".join(spec.name for spec in specs)


class SchemaToolInterface(ToolInterface):
    """A tool interface whose tools have JSON schemas: validation and dispatch are shared.

    Subclasses set ``tool_specs`` and ``handlers`` (tool name -> method name); each handler
    takes ``(arguments, sandbox)`` and returns a ToolOutput or raises ToolError/SandboxError.
    """

    tool_specs: ClassVar[tuple[ToolSpec, ...]] = ()
    handlers: ClassVar[dict[str, str]] = {}

    def specs(self) -> list[ToolSpec]:
        """Returns the tools this interface offers (submit included)."""
        return list(self.tool_specs)

    def check_call(self, call: ToolCall) -> str | None:
        """Returns why ``call`` cannot run (unknown tool, arguments against the schema), or None."""
        spec = next((s for s in self.tool_specs if s.name == call.name), None)
        if spec is None:
            shown = call.name if isinstance(call.name, str) else repr(call.name)
            return encodable(f"Unknown tool `{shown[:100]}`. Available tools: {tool_list(self.specs())}.")
        problem = validate_arguments(spec, call.arguments)
        return None if problem is None else encodable(problem)

    def execute(self, call: ToolCall, sandbox: Sandbox) -> ToolOutput:
        """Runs one call in the sandbox; every failure becomes an ``is_error`` output."""
        name = call.name if isinstance(call.name, str) else str(call.name)
        problem = self.check_call(call)
        if problem is not None:
            return error_output(name, encodable(problem))
        handler = getattr(self, self.handlers[name])
        try:
            output = handler(call.arguments, sandbox)
            return replace(output, output=encodable(output.output), stderr=encodable(output.stderr))
        except (ToolError, SandboxError) as exc:
            return error_output(name, encodable(str(exc)))
        except Exception as exc:  # bad input must never crash an episode (bad input is an observation: docs/architecture.md)
            message = f"{name} failed ({INTERNAL_ERROR} {type(exc).__name__}): {exc}"
            return error_output(name, encodable(message))
