"""Harness-S: sibling pools, the router that picks siblings for a task, and rescue groups.

``router`` ranks siblings before a task runs (validation margins, behaviour-profile votes,
random); ``groups`` finds dead GRPO groups and replaces them with rescue groups.
"""
