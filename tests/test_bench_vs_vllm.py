"""The identity check of ``benchmarks/bench_vs_vllm.py``: two sides that generate the same
tokens pass it; a perturbed policy (its output layer moved) fails it, and the failure says where.
The benchmark itself (a real vLLM server against HFPolicy) is a measurement, not a test."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_vs_vllm import first_difference, run_side  # noqa: E402

from harnessrl.harness import Harness, HarnessLimits  # noqa: E402
from harnessrl.policy.base import SamplingParams  # noqa: E402
from harnessrl.policy.hf import HFPolicy  # noqa: E402
from harnessrl.rollout.engine import RolloutJob  # noqa: E402
from harnessrl.tasks.suite import load_suite  # noqa: E402


def test_identical_sides_pass_and_a_perturbed_policy_fails_the_identity_check(tiny_model):
    limits = HarnessLimits(max_turns=2, max_new_tokens=12)
    tasks = list(load_suite("workspace").tasks("test", limit=2, seed=0))
    jobs = [RolloutJob(task, Harness.named(code, limits), seed=i)
            for i, (code, task) in enumerate((c, t) for c in ("S0-T0-O0-C0-W0", "S2-T2-O2-C2-W2") for t in tasks)]
    # Seeded sampling (each episode its seed): the random tiny model's greedy choice is one
    # token (a newline) whatever the perturbation, so greedy tokens would not show it.
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    policy = HFPolicy(str(tiny_model), device="cpu", dtype="float32")
    first, wall, cpu, tokens = run_side(policy, jobs, sampling, time.process_time)
    assert len(first) == 4 and tokens > 0 and wall > 0 and cpu >= 0
    policy.clear_prefix_cache()
    again, *_ = run_side(policy, jobs, sampling, time.process_time)
    assert first_difference(first, again) is None

    perturbed = HFPolicy(str(tiny_model), device="cpu", dtype="float32")
    with torch.no_grad():  # the output layer (tied to the embedding) moved by noise
        perturbed.model.get_output_embeddings().weight.add_(
            torch.randn(perturbed.model.get_output_embeddings().weight.shape, generator=torch.Generator().manual_seed(0)))
    perturbed.clear_prefix_cache()
    other, *_ = run_side(perturbed, jobs, sampling, time.process_time)
    difference = first_difference(first, other)
    assert difference is not None and difference.startswith("4/4 episodes differ; first at episode 0"), difference
    assert "turn 0, token" in difference
    assert first_difference(first, other[:3]) == "4 episodes against 3"
