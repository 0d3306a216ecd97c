"""Rollouts: the episode state machine (`episode`), the batched engine (`engine`), Ray workers (`ray_engine`)."""
