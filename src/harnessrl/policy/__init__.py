"""Policies: the protocol, scripted policies, and model-backed policies."""

from harnessrl.policy.base import Generation, GenerationRequest, Policy, SamplingParams

__all__ = ["Generation", "GenerationRequest", "Policy", "SamplingParams"]
