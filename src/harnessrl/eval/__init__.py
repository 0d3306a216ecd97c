"""Evaluation: pass@k metrics and in-space / out-of-space evaluation of a policy."""
