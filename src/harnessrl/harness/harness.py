"""`Harness`: one component per registered factor composed, with the limits an episode runs under
(`harness.limits`); the out-of-space presets."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from harnessrl.harness.base import (
    ChainedHooks,
    Component,
    ContextPolicy,
    EpisodeHooks,
    ObservationFormat,
    SystemPrompt,
    ToolInterface,
    Workflow,
)
from harnessrl.harness.context import Compaction, Summarizer
from harnessrl.harness.limits import HarnessLimits
from harnessrl.harness.registry import (
    CORE_LETTERS,
    component_class,
    default_space,
    factors,
    out_of_space_class,
)
from harnessrl.space import HarnessConfig

# Out-of-space harnesses: complete harnesses whose tool syntax (and, for codex-like, the
# observation format) is used by none of the 243 configurations. A factor a preset does not
# name (one registered beyond the five) takes its level 0.
OUT_OF_SPACE_PRESETS: dict[str, dict[str, tuple[str, int | str]]] = {
    "codex-like": {"S": ("in", 1), "T": ("out", "codex_exec"), "O": ("out", "codex_header"),
                   "C": ("in", 2), "W": ("in", 0)},
    "aider-like": {"S": ("in", 0), "T": ("out", "aider_editblock"), "O": ("in", 0),
                   "C": ("in", 0), "W": ("in", 2)},
}


SIBLING_SEPARATOR = "#"  # ``DIR#ID``: the sibling ID of the pool in folder DIR


P = TypeVar("P", bound=Component)


class _Part(Generic[P]):
    """A harness attribute that is the component of one of the papers' five factors."""

    def __init__(self, letter: str) -> None:
        self.letter = letter

    def __get__(self, harness: Harness | None, owner: type) -> Any:
        return self if harness is None else harness.components[self.letter]

    def __set__(self, harness: Harness, component: P) -> None:
        harness.components[self.letter] = component


class Harness:
    """A concrete harness: one component per registered factor (``components``, letter ->
    component, in the registry's order); the papers' five are also its attributes ``system``,
    ``tools``, ``observation``, ``context`` and ``workflow``, which the episode loop calls.
    ``code`` is the configuration code (or the out-of-space harness name, or the name a
    sibling was built under). ``hooks`` act at the opening and on proposed calls (sibling
    harnesses set them); a factor beyond the five acts there too, after them
    (``episode_hooks``). ``sibling`` names the sibling harness this is (``{"id", "hash",
    "base"}``), None for the harnesses of the space and the out-of-space ones."""

    system: _Part[SystemPrompt] = _Part("S")
    tools: _Part[ToolInterface] = _Part("T")
    observation: _Part[ObservationFormat] = _Part("O")
    context: _Part[ContextPolicy] = _Part("C")
    workflow: _Part[Workflow] = _Part("W")

    def __init__(
        self,
        components: Mapping[str, Component],
        code: str,
        limits: HarnessLimits | None = None,
        out_of_space: bool = False,
        hooks: EpisodeHooks | None = None,
        sibling: dict[str, str] | None = None,
    ) -> None:
        letters = [f.letter for f in factors()]
        missing = [letter for letter in letters if letter not in components]
        unknown = sorted(set(components) - set(letters))
        if missing or unknown:
            raise ValueError(f"harness {code!r}: needs one component per registered factor ({', '.join(letters)}); "
                             f"missing {missing or 'none'}, unknown {unknown or 'none'}")
        self.components: dict[str, Component] = {letter: components[letter] for letter in letters}
        self.code = code
        self.limits = limits or HarnessLimits()
        self.out_of_space = out_of_space
        self.hooks = hooks or EpisodeHooks()
        self.sibling = sibling

    @property
    def episode_hooks(self) -> EpisodeHooks:
        """What the episode calls at its hook points: ``hooks``, then the components of the
        factors beyond the five (``FactorHooks``), in factor order."""
        extra = [c for letter, c in self.components.items() if letter not in CORE_LETTERS]
        return ChainedHooks([self.hooks, *extra]) if extra else self.hooks  # type: ignore[list-item]

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
        return cls(parts, code=config.code, limits=limits)

    @classmethod
    def out_of_space_harness(cls, name: str, limits: HarnessLimits | None = None) -> Harness:
        """Returns a named out-of-space harness (see ``OUT_OF_SPACE_PRESETS``)."""
        if name not in OUT_OF_SPACE_PRESETS:
            raise ValueError(f"unknown out-of-space harness {name!r}; known: {', '.join(OUT_OF_SPACE_PRESETS)}")
        parts = {}
        for factor in factors():
            where, key = OUT_OF_SPACE_PRESETS[name].get(factor.letter, ("in", 0))
            klass = component_class(factor.letter, int(key)) if where == "in" else out_of_space_class(factor.letter, str(key))
            parts[factor.letter] = klass()
        return cls(parts, code=name, limits=limits, out_of_space=True)

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
