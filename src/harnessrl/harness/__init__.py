"""Harnesses: five components (S, T, O, C, W) with three realizations each, and out-of-space ones."""

from harnessrl.harness.harness import Harness, HarnessLimits, out_of_space_names

__all__ = ["Harness", "HarnessLimits", "out_of_space_names"]
