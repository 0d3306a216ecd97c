"""What every sub-command shares: the help format (defaults shown, one example in the
epilog), "did you mean" suggestions for mistyped names, and looked-up names checked with them."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Returns ``" (did you mean 'x'?)"`` naming the candidates closest to ``name``, or ``""``
    when none is close: the one suggestion helper of the command line."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default after its help (unless the help already names it, or the
    default is empty: None, False, []) and keeps the epilog's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default:" in text or default in (None, False, [], "")
                or default is argparse.SUPPRESS or not action.option_strings):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose "invalid choice" errors (sub-commands, actions, choice
    options) suggest the closest valid choice."""

    _INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")

    def error(self, message: str) -> Any:
        match = self._INVALID_CHOICE.search(message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group(2))
            message += did_you_mean(match.group(1), choices)
        return super().error(message)


def command(subparsers: Any, name: str, *, help: str, example: str, **kwargs: Any) -> argparse.ArgumentParser:
    """Returns a new sub-command parser with the shared help format and ``example`` (a command
    line, or several on separate lines) as its epilog."""
    lines = "\n".join(f"  {line}" for line in example.strip().splitlines())
    return subparsers.add_parser(
        name, help=help, epilog=f"example:\n{lines}", formatter_class=HelpFormatter, **kwargs
    )


def looked_up(kind: str, names: Iterable[str], candidates: Iterable[str], build: Callable[[], T]) -> T:
    """Returns ``build()``; when it refuses a name (``ValueError``), the error is raised again
    with a suggestion for each of ``names`` (the names the user typed) that is not one of
    ``candidates`` (the names of this ``kind`` that exist)."""
    try:
        return build()
    except ValueError as exc:
        known = set(candidates)
        hints = [f"{kind} {name!r}{did_you_mean(name, known)}" for name in names if name not in known]
        hints = [h for h in hints if h.endswith("?)")]
        if not hints:
            raise
        raise ValueError(f"{exc}; {'; '.join(hints)}") from exc


# --- the names each kind of lookup knows -------------------------------------------------------

POLICY_NAMES = ("oracle", "random", "faulty", "embedded", "hf", "vllm", "openai", "openai-text")


def policy_from_spec(spec: str, seed: int = 0, **kwargs: Any) -> Any:
    """Returns ``make_policy(spec, seed, **kwargs)``; a mistyped spec gets a suggestion."""
    from harnessrl.policy import make_policy

    return looked_up("policy", [spec.partition(":")[0]], POLICY_NAMES, lambda: make_policy(spec, seed, **kwargs))


def harness_names() -> list[str]:
    """Returns every harness name a harness set may hold: set names, the 243 codes, the
    out-of-space harnesses and ``ext:<agent>``."""
    from harnessrl.eval.sets import EVAL_SETS, EXTERNAL_PREFIX, HARNESS_SETS, external_agent_names
    from harnessrl.harness.harness import OUT_OF_SPACE_PRESETS
    from harnessrl.harness.registry import default_space

    return [*HARNESS_SETS, *EVAL_SETS, *OUT_OF_SPACE_PRESETS, *(c.code for c in default_space().all_configs),
            *(EXTERNAL_PREFIX + name for name in external_agent_names())]


def harness_set(spec: str, build: Callable[[], T]) -> T:
    """Returns ``build()`` (which resolves the harness set ``spec``); a mistyped set, code or
    agent in it gets a suggestion. Pools (``pool:DIR``, ``DIR#ID``) are paths, not names."""
    typed = [piece.strip() for piece in spec.split(",")
             if piece.strip() and not piece.startswith("pool:") and "/" not in piece and "#" not in piece]
    return looked_up("harness", typed, harness_names(), build)


def suite_named(name: str, build: Callable[[], T]) -> T:
    """Returns ``build()`` (which loads the suite ``name``); a mistyped suite name gets a
    suggestion (a task file, ``file.py`` or ``module:attr`` is not a name)."""
    from harnessrl.tasks.suite import available_suites

    is_path = "/" in name or ":" in name or name.endswith((".yaml", ".yml", ".jsonl", ".json", ".py"))
    typed = [] if is_path else [name]
    return looked_up("suite", typed, available_suites(), build)


def agent_named(name: str) -> Any:
    """Returns the external agent ``name``; a mistyped name gets a suggestion."""
    from harnessrl.external.agents import AGENTS, get_agent

    return looked_up("agent", [name], AGENTS, lambda: get_agent(name))
