"""Integrations: harnessrl's harnesses, tasks, pairing and rescue inside other trainers.

Each sub-package is an optional extra; importing this package imports none of them.
"""
