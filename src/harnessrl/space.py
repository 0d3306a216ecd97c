"""The factorized harness space: factors, their levels, and configurations (points of the space)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Level:
    """One realization of a factor: a short name and a one-line description."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class Factor:
    """A harness factor: a full name, a one-letter code and its ordered levels."""

    name: str
    letter: str
    levels: tuple[Level, ...]

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Z]", self.letter):
            raise ValueError(f"factor {self.name!r}: letter must be one upper-case A-Z, got {self.letter!r}")
        if len(self.levels) < 2:
            raise ValueError(f"factor {self.name!r} needs at least 2 levels, got {len(self.levels)}")
        names = [level.name for level in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"factor {self.name!r} has duplicate level names: {names}")

    @property
    def n_levels(self) -> int:
        return len(self.levels)


@dataclass(frozen=True)
class HarnessConfig:
    """An immutable, hashable point of a harness space: one level index per factor.

    Its printable code joins ``<letter><level>`` per factor, e.g. ``S0-T1-O2-C0-W1``.
    Configurations of the same space compare and hash by their levels and letters.
    """

    letters: tuple[str, ...]
    levels: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.letters) != len(self.levels):
            raise ValueError("letters and levels must have the same length")

    @property
    def code(self) -> str:
        return "-".join(f"{letter}{level}" for letter, level in zip(self.letters, self.levels, strict=True))

    def __str__(self) -> str:
        return self.code

    def __repr__(self) -> str:
        return f"HarnessConfig({self.code!r})"

    def __getitem__(self, letter: str) -> int:
        """Returns the level index of the factor with this letter."""
        try:
            return self.levels[self.letters.index(letter)]
        except ValueError:
            raise KeyError(f"no factor {letter!r} in {self.code}") from None

    def __lt__(self, other: HarnessConfig) -> bool:
        return self.levels < other.levels

    def hamming(self, other: HarnessConfig) -> int:
        """Returns the number of factors at which the two configurations differ."""
        if self.letters != other.letters:
            raise ValueError(f"cannot compare configurations of different spaces: {self} vs {other}")
        return sum(a != b for a, b in zip(self.levels, other.levels, strict=True))

    def replace(self, **levels: int) -> HarnessConfig:
        """Returns a copy with the given factors (by letter) set to new levels."""
        new = list(self.levels)
        for letter, level in levels.items():
            new[self.letters.index(letter)] = level
        return HarnessConfig(self.letters, tuple(new))


class HarnessSpace:
    """An ordered set of factors; its points are ``HarnessConfig``s.

    Nothing here assumes 5 factors or 3 levels: mixed level counts are allowed.
    """

    def __init__(self, factors: Sequence[Factor]) -> None:
        factors = tuple(factors)
        if not factors:
            raise ValueError("a harness space needs at least one factor")
        letters = [f.letter for f in factors]
        if len(set(letters)) != len(letters):
            raise ValueError(f"factor letters must be unique, got {letters}")
        self.factors: tuple[Factor, ...] = factors

    def __repr__(self) -> str:
        return f"HarnessSpace({' x '.join(f'{f.letter}{f.n_levels}' for f in self.factors)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HarnessSpace) and self.factors == other.factors

    def __hash__(self) -> int:
        return hash(self.factors)

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(f.letter for f in self.factors)

    @property
    def level_counts(self) -> tuple[int, ...]:
        return tuple(f.n_levels for f in self.factors)

    @property
    def size(self) -> int:
        """Returns the number of configurations (the product of level counts)."""
        total = 1
        for n in self.level_counts:
            total *= n
        return total

    def __len__(self) -> int:
        return self.size

    def factor(self, letter: str) -> Factor:
        for f in self.factors:
            if f.letter == letter:
                return f
        raise KeyError(f"no factor {letter!r}; factors are {', '.join(self.letters)}")

    def config(self, levels: Sequence[int] | Mapping[str, int]) -> HarnessConfig:
        """Returns the configuration with these levels (a sequence in factor order, or by letter)."""
        if isinstance(levels, Mapping):
            missing = [letter for letter in self.letters if letter not in levels]
            if missing:
                raise ValueError(f"missing factor(s) {', '.join(missing)}")
            levels = [levels[letter] for letter in self.letters]
        levels = tuple(int(v) for v in levels)
        if len(levels) != len(self.factors):
            raise ValueError(f"expected {len(self.factors)} levels ({', '.join(self.letters)}), got {len(levels)}")
        for factor, level in zip(self.factors, levels, strict=True):
            if not 0 <= level < factor.n_levels:
                raise ValueError(
                    f"factor {factor.letter} ({factor.name}): level {level} is out of range "
                    f"0..{factor.n_levels - 1}"
                )
        return HarnessConfig(self.letters, levels)

    def parse(self, code: str) -> HarnessConfig:
        """Parses a code like ``S0-T1-O2-C0-W1``; errors name the problem and the valid range."""
        if not isinstance(code, str) or not code.strip():
            raise ValueError(f"empty configuration code; expected e.g. {self.example_code()}")
        parts = [p for p in re.split(r"[-_,\s]+", code.strip()) if p]
        levels: dict[str, int] = {}
        for part in parts:
            match = re.fullmatch(r"([A-Za-z])(\d+)", part)
            if not match:
                raise ValueError(
                    f"bad part {part!r} in {code!r}: expected a factor letter and a level, e.g. "
                    f"{self.example_code()}"
                )
            letter, level = match.group(1).upper(), int(match.group(2))
            if letter not in self.letters:
                raise ValueError(
                    f"unknown factor letter {letter!r} in {code!r}; valid letters are "
                    f"{', '.join(self.letters)}"
                )
            if letter in levels:
                raise ValueError(f"factor {letter} appears twice in {code!r}")
            factor = self.factor(letter)
            if not 0 <= level < factor.n_levels:
                raise ValueError(
                    f"factor {letter} ({factor.name}) level {level} in {code!r} is out of range "
                    f"0..{factor.n_levels - 1}"
                )
            levels[letter] = level
        missing = [letter for letter in self.letters if letter not in levels]
        if missing:
            raise ValueError(
                f"code {code!r} is missing factor(s) {', '.join(missing)}; expected all of "
                f"{', '.join(self.letters)}, e.g. {self.example_code()}"
            )
        return self.config(levels)

    def neighbours(self, config: HarnessConfig, radius: int = 1) -> list[HarnessConfig]:
        """Returns every configuration at Hamming distance 1..``radius`` from ``config``, nearest
        first, then in level order (the default space has 10 at radius 1)."""
        if radius < 1:
            raise ValueError(f"radius must be >= 1, got {radius}")
        if not self.contains(config):
            raise ValueError(f"{config} is not a configuration of {self}")
        found: list[HarnessConfig] = []
        for distance in range(1, min(radius, len(self.factors)) + 1):
            within: list[HarnessConfig] = []
            for positions in itertools.combinations(range(len(self.factors)), distance):
                choices = [[lv for lv in range(self.level_counts[i]) if lv != config.levels[i]] for i in positions]
                for new_levels in itertools.product(*choices):
                    levels = list(config.levels)
                    for i, lv in zip(positions, new_levels, strict=True):
                        levels[i] = lv
                    within.append(HarnessConfig(config.letters, tuple(levels)))
            found += sorted(within, key=lambda c: c.levels)
        return found

    def example_code(self) -> str:
        return "-".join(f"{f.letter}{i % f.n_levels}" for i, f in enumerate(self.factors))

    def contains(self, config: HarnessConfig) -> bool:
        return config.letters == self.letters and all(
            0 <= v < n for v, n in zip(config.levels, self.level_counts, strict=True)
        )

    def __contains__(self, config: object) -> bool:
        return isinstance(config, HarnessConfig) and self.contains(config)

    def enumerate(self) -> Iterator[HarnessConfig]:
        """Yields every configuration in lexicographic order of levels."""
        for levels in itertools.product(*(range(n) for n in self.level_counts)):
            yield HarnessConfig(self.letters, levels)

    @cached_property
    def all_configs(self) -> tuple[HarnessConfig, ...]:
        return tuple(self.enumerate())

    def describe(self, config: HarnessConfig) -> dict[str, str]:
        """Returns ``{factor name: level name}`` for a configuration."""
        return {
            f.name: f.levels[level].name for f, level in zip(self.factors, config.levels, strict=True)
        }
