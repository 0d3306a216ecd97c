"""Harness-S: the sibling pool, directional evolution, the router, and rescue groups.

Offline: the pool (``pool``), its compliance check (``check``), directional evolution
(``diagnose``, ``editors``, ``evolve``, ``select``) and the pool analysis (``analysis``).
Online: the router that ranks siblings for a task before it runs (``router``: validation
margins, behaviour-profile votes, random), and rescue groups that replace dead GRPO groups
(``groups``).

Layer: above ``external`` and ``rollout`` (it runs episodes), below ``eval`` (evaluation
resolves ``pool:DIR`` sets and routes at inference) and ``rl`` (rescue training).
"""
