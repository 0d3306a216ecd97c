"""`Harness`: five components composed, plus the limits an episode runs under."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harnessrl.harness.base import (
    ContextPolicy,
    EpisodeHooks,
    ObservationFormat,
    SystemPrompt,
    ToolInterface,
    Workflow,
)
from harnessrl.harness.context import Compaction, Summarizer
from harnessrl.harness.registry import component_class, default_space, out_of_space_class
from harnessrl.space import HarnessConfig

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
    # so that a prompt is a function of the episode alone, not of the machine's load.
    fixed_wall_time: bool = False

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_new_tokens < 1:
            raise ValueError("max_turns and max_new_tokens must be >= 1")
        if self.context_tokens <= self.max_new_tokens:
            raise ValueError(
                f"context_tokens ({self.context_tokens}) must exceed max_new_tokens ({self.max_new_tokens})"
            )


# Out-of-space harnesses: complete harnesses whose tool syntax (and, for codex-like, the
# observation format) is used by none of the 243 configurations.
OUT_OF_SPACE_PRESETS: dict[str, dict[str, tuple[str, int | str]]] = {
    "codex-like": {"S": ("in", 1), "T": ("out", "codex_exec"), "O": ("out", "codex_header"),
                   "C": ("in", 2), "W": ("in", 0)},
    "aider-like": {"S": ("in", 0), "T": ("out", "aider_editblock"), "O": ("in", 0),
                   "C": ("in", 0), "W": ("in", 2)},
}


SIBLING_SEPARATOR = "#"  # ``DIR#ID``: the sibling ID of the pool in folder DIR


class Harness:
    """A concrete harness: system prompt, tool interface, observation format, context policy
    and workflow. ``code`` is the configuration code (or the out-of-space harness name, or
    the name a sibling was built under). ``hooks`` act at the opening and on proposed calls;
    ``sibling`` names the sibling harness this is (``{"id", "hash", "base"}``), None for the
    harnesses of the space and the out-of-space ones."""

    def __init__(
        self,
        system: SystemPrompt,
        tools: ToolInterface,
        observation: ObservationFormat,
        context: ContextPolicy,
        workflow: Workflow,
        code: str,
        limits: HarnessLimits | None = None,
        out_of_space: bool = False,
        hooks: EpisodeHooks | None = None,
        sibling: dict[str, str] | None = None,
    ) -> None:
        self.system = system
        self.tools = tools
        self.observation = observation
        self.context = context
        self.workflow = workflow
        self.code = code
        self.limits = limits or HarnessLimits()
        self.out_of_space = out_of_space
        self.hooks = hooks or EpisodeHooks()
        self.sibling = sibling

    def __repr__(self) -> str:
        return f"Harness({self.code!r})"

    def with_summarizer(self, summarizer: Summarizer) -> Harness:
        """Makes a compaction context (C2) write its digests with ``summarizer`` (e.g.
        ``policy.summarizer.PolicySummarizer``, the policy's own summary); other context
        policies are left as they are. Returns the harness itself."""
        if isinstance(self.context, Compaction):
            self.context = Compaction(summarizer=summarizer, budget_fraction=self.context.budget_fraction)
        return self

    @classmethod
    def from_config(cls, config: HarnessConfig | str, limits: HarnessLimits | None = None) -> Harness:
        """Returns the harness of an in-space configuration (a ``HarnessConfig`` or its code)."""
        space = default_space()
        if isinstance(config, str):
            config = space.parse(config)
        parts = {letter: component_class(letter, level)() for letter, level in zip(config.letters, config.levels, strict=True)}
        return cls(
            parts["S"], parts["T"], parts["O"], parts["C"], parts["W"],  # type: ignore[arg-type]
            code=config.code, limits=limits,
        )

    @classmethod
    def out_of_space_harness(cls, name: str, limits: HarnessLimits | None = None) -> Harness:
        """Returns a named out-of-space harness (see ``OUT_OF_SPACE_PRESETS``)."""
        if name not in OUT_OF_SPACE_PRESETS:
            raise ValueError(f"unknown out-of-space harness {name!r}; known: {', '.join(OUT_OF_SPACE_PRESETS)}")
        parts = {}
        for letter, (where, key) in OUT_OF_SPACE_PRESETS[name].items():
            klass = component_class(letter, int(key)) if where == "in" else out_of_space_class(letter, str(key))
            parts[letter] = klass()
        return cls(
            parts["S"], parts["T"], parts["O"], parts["C"], parts["W"],  # type: ignore[arg-type]
            code=name, limits=limits, out_of_space=True,
        )

    @classmethod
    def named(cls, name: str, limits: HarnessLimits | None = None) -> Harness:
        """Returns an in-space harness by code, an out-of-space harness by name, or whatever a
        registered name resolver builds (``harness.siblings`` registers pool members ``DIR#ID``)."""
        for handles, resolve in _NAME_RESOLVERS:
            if handles(name):
                return resolve(name, limits)
        if name in OUT_OF_SPACE_PRESETS:
            return cls.out_of_space_harness(name, limits)
        return cls.from_config(name, limits)


# Other kinds of harness names, registered by the packages that build them (as levels are):
# (does this resolver handle the name?, build it with these limits).
_NAME_RESOLVERS: list[tuple[Callable[[str], bool], Callable[[str, HarnessLimits | None], Harness]]] = []


def register_name_resolver(
    handles: Callable[[str], bool], resolve: Callable[[str, HarnessLimits | None], Harness]
) -> None:
    """Lets ``Harness.named`` build names that ``handles`` accepts with ``resolve``."""
    _NAME_RESOLVERS.append((handles, resolve))


def out_of_space_names() -> list[str]:
    """Returns the names of the out-of-space harnesses."""
    return list(OUT_OF_SPACE_PRESETS)
