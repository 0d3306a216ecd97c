"""Factor O, the observation format: how a tool's output and error notices reach the policy.

O0 raw: the output as is. O1 return code plus output, head and tail kept with an elision
marker past a limit (mini-swe-agent, Terminus). O2 a structured JSON record with return code,
stdout, stderr, truncation flag and wall time.

Outside the space: ``codex_header`` (Codex CLI), an ``Exit code`` / ``Wall time`` / ``Output``
header with long output cut to its head and tail lines.
"""

from __future__ import annotations

import json
from typing import ClassVar

from harnessrl.harness.base import ObservationFormat, ToolOutput
from harnessrl.harness.registry import register


def head_tail(text: str, limit: int) -> tuple[str, str, int]:
    """Returns (head, tail, elided characters) keeping ``limit`` characters in all."""
    if len(text) <= limit:
        return text, "", 0
    half = limit // 2
    return text[:half], text[len(text) - (limit - half):], len(text) - limit


def _combined(output: ToolOutput) -> str:
    if output.stderr and output.output:
        return output.output.rstrip("\n") + "\n" + output.stderr
    return output.output or output.stderr


@register
class RawObservation(ObservationFormat):
    """O0: the raw output (stdout then stderr), cut hard at ``limit`` characters."""

    level, name = 0, "raw"
    description = "raw command output"
    limit: ClassVar[int] = 6000

    def format(self, output: ToolOutput) -> str:
        text = _combined(output)
        if output.timed_out:
            text += "\nCommand timed out."
        return text[: self.limit]

    def format_error(self, message: str, kind: str = "format") -> str:
        return message


@register
class ReturnCodeObservation(ObservationFormat):
    """O1: ``<returncode>`` plus ``<output>``; past ``limit`` the head and tail with a marker."""

    level, name = 1, "rc_head_tail"
    description = "return code plus output, head and tail kept past a limit"
    limit: ClassVar[int] = 2000

    def format(self, output: ToolOutput) -> str:
        code = output.exit_code if output.exit_code is not None else (1 if output.is_error else 0)
        text = _combined(output)
        head, tail, elided = head_tail(text, self.limit)
        parts = [f"<returncode>{code}</returncode>"]
        if output.timed_out:
            parts.append("<warning>The command timed out and was killed.</warning>")
        if elided or output.truncated:
            parts.append(
                "<warning>The output of your last command was too long. Use head, tail, grep or "
                "a more selective command.</warning>"
            )
        if elided:
            parts.append(f"<output_head>\n{head}\n</output_head>")
            parts.append(f"<elided_chars>\n{elided} characters elided\n</elided_chars>")
            parts.append(f"<output_tail>\n{tail}\n</output_tail>")
        else:
            parts.append(f"<output>\n{text}</output>" if text.endswith("\n") else f"<output>\n{text}\n</output>")
        return "\n".join(parts)

    def format_error(self, message: str, kind: str = "format") -> str:
        return f"<error kind=\"{kind}\">\n{message}\n</error>"


@register
class StructuredObservation(ObservationFormat):
    """O2: one JSON record per call: exit code, stdout, stderr, truncated, wall time."""

    level, name = 2, "structured"
    description = "a structured record: return code, stdout, stderr, truncation, wall time"
    limit: ClassVar[int] = 4000

    def format(self, output: ToolOutput) -> str:
        stdout, stderr = output.output, output.stderr
        truncated = output.truncated or len(stdout) + len(stderr) > self.limit
        record = {
            "tool": output.tool,
            "exit_code": output.exit_code if output.exit_code is not None else (1 if output.is_error else 0),
            "stdout": stdout[: self.limit],
            "stderr": stderr[: max(0, self.limit - len(stdout))] if stderr else "",
            "truncated": truncated,
            "timed_out": output.timed_out,
            "wall_time_s": round(output.duration_s, 3),
        }
        return json.dumps(record, ensure_ascii=False)

    def format_error(self, message: str, kind: str = "format") -> str:
        return json.dumps({"error": {"kind": kind, "message": message}}, ensure_ascii=False)


# ---- outside the space ----------------------------------------------------------------

CODEX_HEAD_LINES = 128  # lines kept at each end of a long output
CODEX_MAX_CHARS = 10000
CODEX_OMITTED = "[... omitted {omitted} of {total} lines ...]"


@register
class CodexHeaderObservation(ObservationFormat):
    """Codex CLI: ``Exit code`` / ``Wall time`` / (``Total output lines``) / ``Output`` header."""

    out_of_space = True
    name = "codex_header"
    description = "Exit code / Wall time / Output header, long output cut to head and tail lines (Codex CLI)"

    def format(self, output: ToolOutput) -> str:
        """Returns the header block and the (head and tail of the) output."""
        code = output.exit_code if output.exit_code is not None else (1 if output.is_error else 0)
        text = output.output
        if output.stderr:
            text = (text.rstrip("\n") + "\n" if text else "") + output.stderr
        if output.timed_out:
            text = f"command timed out after {round(output.duration_s * 1000)} milliseconds\n{text}"
        lines = text.split("\n")
        total = len(lines)
        sections = [f"Exit code: {code}", f"Wall time: {output.duration_s:.1f} seconds"]
        if total > 2 * CODEX_HEAD_LINES:
            omitted = total - 2 * CODEX_HEAD_LINES
            lines = [*lines[:CODEX_HEAD_LINES], CODEX_OMITTED.format(omitted=omitted, total=total),
                     *lines[-CODEX_HEAD_LINES:]]
            sections.append(f"Total output lines: {total}")
        body = "\n".join(lines)
        if len(body) > CODEX_MAX_CHARS:
            half = CODEX_MAX_CHARS // 2
            body = f"{body[:half]}\n[... omitted {len(body) - CODEX_MAX_CHARS} characters ...]\n{body[-half:]}"
            if len(sections) == 2:
                sections.append(f"Total output lines: {total}")
        sections += ["Output:", body]
        return "\n".join(sections)

    def format_error(self, message: str, kind: str = "format") -> str:
        """Returns the error as Codex reports a call it could not run: plain text."""
        return f"{kind} error: {message}"
