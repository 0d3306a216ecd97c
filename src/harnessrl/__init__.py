"""harnessrl: agentic reinforcement learning through many harnesses."""

from __future__ import annotations

from typing import Any

from harnessrl.space import Factor, HarnessConfig, HarnessSpace, Level

__all__ = ["Factor", "HarnessConfig", "HarnessSpace", "Level", "default_space"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # `default_space` is built from the harness registry (a layer above the space): imported on
    # first use so that `import harnessrl.space` does not load the harness runtime.
    if name == "default_space":
        from harnessrl.harness.registry import default_space

        return default_space
    raise AttributeError(f"module 'harnessrl' has no attribute {name!r}")
