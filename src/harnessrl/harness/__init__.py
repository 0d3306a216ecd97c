"""Harnesses: five components (S, T, O, C, W) with three realizations each, and out-of-space ones.

Importing the package imports the factor modules, which register the built-in realizations
with ``harness.registry`` (the space is built from what is registered).
"""

from harnessrl.harness import context, observation, out_of_space, prompts, tools, workflow  # noqa: F401
from harnessrl.harness.harness import Harness, HarnessLimits, out_of_space_names

__all__ = ["Harness", "HarnessLimits", "out_of_space_names"]
