"""The limits an episode runs under (`HarnessLimits`), their defaults, and the one rule that
resolves them: what a run set, else the default for its kind of policy (`resolve_limits`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from harnessrl.harness.chat import ByteTokenizer

DEFAULT_MAX_NEW_TOKENS = 384
"""Tokens the policy may sample per turn unless a run says otherwise: the one default of the
harnesses' limits, the policies' sampling, evaluation and training (``TrainConfig``)."""


@dataclass(frozen=True)
class HarnessLimits:
    """Limits of one episode, each with a default sized for small models on CPU, and whether
    its observations may show the clock."""

    max_turns: int = 20  # policy calls per episode
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # tokens the policy may sample per turn
    context_tokens: int = 8192  # the model's context window (SmolLM2: 8192)
    max_consecutive_format_errors: int = 3  # then the episode ends with status format_errors
    command_timeout_s: float = 30.0  # wall-clock limit of one command in the sandbox
    # Observations show a fixed stand-in for a command's wall time (O2's wall_time_s, the Codex
    # header's): 0, or command_timeout_s for a command that timed out. Deterministic runs set it,
    # so that a prompt is a function of the episode alone, not of the machine's load; the starting
    # workspace's files then show a fixed date too (sandbox/workspace.py:FIXED_FILE_TIME; files the
    # policy's own commands write carry the sandbox's real clock).
    fixed_wall_time: bool = False

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_new_tokens < 1:
            raise ValueError("max_turns and max_new_tokens must be >= 1")
        if self.context_tokens <= self.max_new_tokens:
            raise ValueError(
                f"context_tokens ({self.context_tokens}) must exceed max_new_tokens ({self.max_new_tokens})"
            )


# Scripted policies (oracle, replay, gold replay, ...) write their text byte by byte: a byte
# tokenizer counts 3-4x the tokens of a model's for the same text, and long gold commands need
# more room than the model-sized defaults give. ``resolve_limits`` uses these in their place.
SCRIPTED_LIMITS = HarnessLimits(max_new_tokens=16_384, context_tokens=262_144)

_DEFAULTS = HarnessLimits()
LIMIT_FIELDS = tuple(f.name for f in fields(HarnessLimits))


def is_bytewise(policy_or_tokenizer: Any) -> bool:
    """Whether a policy (through its ``tokenizer``) or a tokenizer counts text byte by byte:
    the scripted policies, which get ``SCRIPTED_LIMITS``' room and no model-sized output limit."""
    tokenizer = getattr(policy_or_tokenizer, "tokenizer", policy_or_tokenizer)
    return isinstance(tokenizer, ByteTokenizer)


def _set_value(source: HarnessLimits | Mapping[str, Any], name: str) -> Any:
    """``source``'s value of limit ``name``, or None where it leaves it unset: a mapping (command
    line options, a run's config) sets what is neither absent, None nor 0; a ``HarnessLimits``
    sets what differs from the default."""
    if isinstance(source, HarnessLimits):
        value = getattr(source, name)
        return None if value == getattr(_DEFAULTS, name) else value
    return source.get(name) or None


def resolve_limits(*given: HarnessLimits | Mapping[str, Any] | None, bytewise: bool = False) -> HarnessLimits:
    """Returns the limits a run's episodes use: each limit from the first of ``given`` that sets
    it (see ``_set_value``; None sources are skipped), else the default, which for a ``bytewise``
    policy (``is_bytewise``) is ``SCRIPTED_LIMITS``'. Extra keys of a mapping are ignored, so a
    whole parsed command line or run config can be passed."""
    fallback = SCRIPTED_LIMITS if bytewise else _DEFAULTS
    sources = [source for source in given if source is not None]
    values = {}
    for name in LIMIT_FIELDS:
        value = next((v for v in (_set_value(s, name) for s in sources) if v is not None), None)
        values[name] = getattr(fallback, name) if value is None else value
    return HarnessLimits(**values)
