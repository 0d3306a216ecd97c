"""harnessrl: agentic reinforcement learning through many harnesses."""

from harnessrl.space import Factor, HarnessConfig, HarnessSpace, Level, default_space

__all__ = ["Factor", "HarnessConfig", "HarnessSpace", "Level", "default_space"]
__version__ = "0.1.0"
