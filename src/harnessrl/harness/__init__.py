"""Harnesses: five components (S, T, O, C, W) with three realizations each, and out-of-space ones.

Importing the package imports the factor modules, which register the built-in realizations
with ``harness.registry`` (the space is built from what is registered).
"""

from harnessrl.harness import context, observation, prompts, workflow  # noqa: F401
from harnessrl.harness.harness import Harness, HarnessLimits, out_of_space_names
from harnessrl.harness.tools import aider, codex, editor_json, shell_block, tagged  # noqa: F401

__all__ = ["Harness", "HarnessLimits", "out_of_space_names"]
