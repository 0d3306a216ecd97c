"""The component registry: (factor letter, level) -> realization, and the space built from it.

The built-in realizations register themselves when their factor modules are imported, which
``harnessrl.harness`` (the package) does first. Users add a level by subclassing a component
with a new ``level`` and calling ``register``. A new factor is ``register_factor`` and then one
``FactorHooks`` subclass per level: the five papers' factors are the harness's parts (``Harness``
attributes the episode loop calls), a factor beyond them acts at the episode's hook points (the
opening, each proposed call). The space, the designs, ``Harness`` and the out-of-space presets
all loop over what is registered here (docs/architecture.md, "Add a factor").
"""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.harness.base import Component, FactorHooks
from harnessrl.space import Factor, HarnessSpace, Level


@dataclass(frozen=True)
class FactorInfo:
    """A registered factor. ``part`` is the ``Harness`` attribute its component fills for the
    papers' five; None for a factor beyond them, whose components are ``FactorHooks``."""

    name: str
    letter: str
    description: str
    part: str | None = None


_FACTORS: list[FactorInfo] = [
    FactorInfo("system_prompt", "S", "system prompt and reminders", "system"),
    FactorInfo("tool_interface", "T", "tool set, schemas and call syntax", "tools"),
    FactorInfo("observation", "O", "how tool output is shown", "observation"),
    FactorInfo("context", "C", "which history the policy sees", "context"),
    FactorInfo("workflow", "W", "control loop around actions", "workflow"),
]
CORE_LETTERS = tuple(f.letter for f in _FACTORS)  # the parts every harness has an attribute for
_COMPONENTS: dict[tuple[str, int], type[Component]] = {}
_OUT_OF_SPACE: dict[str, dict[str, type[Component]]] = {}


def register_factor(name: str, letter: str, description: str = "") -> None:
    """Adds a factor (appended after the existing ones); its levels are ``FactorHooks``
    subclasses registered with ``register``."""
    if any(f.letter == letter for f in _FACTORS):
        raise ValueError(f"factor letter {letter!r} is already registered")
    _FACTORS.append(FactorInfo(name, letter, description))


def unregister_factor(letter: str) -> None:
    """Removes a factor added with ``register_factor`` and its levels (the five cannot go)."""
    if letter in CORE_LETTERS:
        raise ValueError(f"factor {letter} is one of the papers' five ({', '.join(CORE_LETTERS)}); it cannot be removed")
    if not any(f.letter == letter for f in _FACTORS):
        raise ValueError(f"no factor {letter!r} is registered")
    _FACTORS[:] = [f for f in _FACTORS if f.letter != letter]
    for key in [key for key in _COMPONENTS if key[0] == letter]:
        del _COMPONENTS[key]


def factors() -> list[FactorInfo]:
    """Returns the registered factors in space order (the papers' five first)."""
    return list(_FACTORS)


def register(cls: type[Component]) -> type[Component]:
    """Registers a component class (usable as a decorator). Out-of-space components are kept
    apart: they never enter the space."""
    if cls.out_of_space:
        _OUT_OF_SPACE.setdefault(cls.letter, {})[cls.name] = cls
        return cls
    if not any(f.letter == cls.letter for f in _FACTORS):
        raise ValueError(f"{cls.__name__}: unknown factor letter {cls.letter!r}")
    if cls.letter not in CORE_LETTERS and not issubclass(cls, FactorHooks):
        raise ValueError(f"{cls.__name__}: factor {cls.letter} is not one of the five, so its levels act at the "
                         "episode's hook points: subclass harness.base.FactorHooks")
    key = (cls.letter, cls.level)
    existing = _COMPONENTS.get(key)
    if existing is not None and existing is not cls:
        raise ValueError(f"level {cls.letter}{cls.level} is already registered by {existing.__name__}")
    _COMPONENTS[key] = cls
    return cls


def component_class(letter: str, level: int) -> type[Component]:
    """Returns the registered realization of ``letter`` at ``level``."""
    try:
        return _COMPONENTS[(letter, level)]
    except KeyError:
        levels = sorted(lv for (ltr, lv) in _COMPONENTS if ltr == letter)
        raise KeyError(f"no realization registered for {letter}{level}; registered levels: {levels}") from None


def out_of_space_class(letter: str, name: str) -> type[Component]:
    """Returns an out-of-space component by factor letter and name."""
    try:
        return _OUT_OF_SPACE[letter][name]
    except KeyError:
        names = sorted(_OUT_OF_SPACE.get(letter, {}))
        raise KeyError(f"no out-of-space {letter} component {name!r}; known: {names}") from None


def default_space() -> HarnessSpace:
    """Returns the harness space made of every registered factor and level (contiguous levels):
    the papers' space S, T, O, C, W with three realizations each (3^5 = 243 configurations)
    unless a user registered another level or factor."""
    factors = []
    for info in _FACTORS:
        levels = sorted(lv for (ltr, lv) in _COMPONENTS if ltr == info.letter)
        if levels != list(range(len(levels))):
            raise ValueError(f"factor {info.letter} has non-contiguous levels {levels}")
        classes = [_COMPONENTS[(info.letter, lv)] for lv in levels]
        factors.append(
            Factor(info.name, info.letter, tuple(Level(c.name, c.description) for c in classes))
        )
    return HarnessSpace(factors)
