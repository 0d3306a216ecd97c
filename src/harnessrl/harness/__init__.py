"""Harnesses: five components (S, T, O, C, W) with three realizations each, and out-of-space ones.

Importing the package imports the factor modules, which register the built-in realizations
with ``harness.registry`` (the space is built from what is registered), and the sibling
harnesses of Harness-S (``harness.siblings``), which register their edit kinds and names.
"""

from harnessrl.harness import (  # noqa: F401
    context,
    observation,
    prompts,
    siblings,
    workflow,
)
from harnessrl.harness.harness import Harness, HarnessLimits, out_of_space_names
from harnessrl.harness.tools import aider, codex, editor_json, shell_block, tagged  # noqa: F401

__all__ = ["Harness", "HarnessLimits", "out_of_space_names"]
