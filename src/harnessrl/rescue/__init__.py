"""Harness-S, offline: the sibling pool, its compliance check, directional evolution
(diagnose, edit, validate, select) and the pool analysis (fixes, regressions, coverage).

Layer: above ``rollout`` (it runs episodes) and below ``rl`` (rescue training uses the pool).
"""
