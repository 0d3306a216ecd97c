"""Task families of the ``workspace`` suite: one module per family, one generator per tier."""

from __future__ import annotations

from collections.abc import Callable

from harnessrl.tasks.builtin.families import (
    code,
    data,
    files,
    recovery,
    search,
    sqlite,
    state,
    text,
)
from harnessrl.tasks.builtin.families.common import GenContext
from harnessrl.tasks.model import Task

Generator = Callable[[GenContext], Task]

#: family name -> {tier -> generator}; family names never contain "-" (they are part of task ids).
FAMILIES: dict[str, dict[int, Generator]] = {
    "files": files.GENERATORS,
    "text": text.GENERATORS,
    "data": data.GENERATORS,
    "sqlite": sqlite.GENERATORS,
    "code": code.GENERATORS,
    "search": search.GENERATORS,
    "state": state.GENERATORS,
    "recovery": recovery.GENERATORS,
}

__all__ = ["FAMILIES", "GenContext", "Generator"]
