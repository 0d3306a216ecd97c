"""Reinforcement learning: losses, advantages, trainers and the harness-scaling loop."""
