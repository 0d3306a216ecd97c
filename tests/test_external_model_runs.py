"""External runs with a real (tiny) transformers model behind the server: a run cut by its
time limit ends cleanly with what was recorded kept and is reported as it ends; a prompt over
the model's context is reported as what it is; the evaluation's limits and temperature reach
``ext:`` targets."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

from conftest import save_tiny_model
from harnessrl.external.agents import get_agent
from harnessrl.external.install import install
from harnessrl.external.run import CPU_MAX_TOKENS, AgentServer, ExternalConfig, evaluate_external
from harnessrl.tasks.suite import load_suite

pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.policy.hf import HFPolicy


class SlowAfterFirstAnswer(HFPolicy):
    """A real model that answers the first request, then takes until ``release`` (at most
    120 s) for the next one: a slow CPU model whose request is in flight at the time limit."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.release = threading.Event()

    def arrived(self) -> None:
        self.calls += 1
        if self.calls > 1:
            self.release.wait(timeout=120)

    def generate_stream(self, requests, on_tokens):  # what a batch-at-a-time server calls
        self.arrived()
        return super().generate_stream(requests, on_tokens)

    @contextlib.contextmanager
    def continuous(self):  # what the server's continuous batching opens: each request is added
        with super().continuous() as decoder:
            add = decoder.add

            def slow_add(*args, **kwargs):
                self.arrived()
                add(*args, **kwargs)

            decoder.add = slow_add
            yield decoder


@pytest.fixture(scope="module")
def mini_swe_agent() -> str:
    agent = get_agent("mini-swe-agent")
    install(agent.name, agent.plan())
    return agent.name


@pytest.fixture(scope="module")
def task():
    return next(iter(load_suite("workspace").tasks("test", limit=1, seed=0)))


def test_run_cut_by_its_time_limit_keeps_what_was_recorded(mini_swe_agent, task, tiny_model, tmp_path: Path):
    policy = SlowAfterFirstAnswer(tiny_model, device="cpu")
    reported = []

    def finished(trajectory):
        reported.append(trajectory)
        policy.release.set()  # the run is over: let the request in flight finish

    config = ExternalConfig(time_limit_s=30, max_tokens=24, log_dir=str(tmp_path))
    [trajectory] = evaluate_external(mini_swe_agent, policy, [task], config=config, on_trajectory=finished)
    assert reported == [trajectory]
    assert trajectory.status == "error" and trajectory.metrics["timed_out"]
    assert "did not finish within 30 s" in (trajectory.error or "")
    # The answered request is kept with its exact ids; the one in flight at the limit is not a turn.
    assert len(trajectory.turns) == 1 and trajectory.turns[0].completion_ids
    assert 0 < len(trajectory.turns[0].completion_ids) <= 24
    assert trajectory.policy == policy.name


def test_prompt_over_the_context_is_reported_as_such(mini_swe_agent, task, tmp_path_factory):
    short = HFPolicy(save_tiny_model(tmp_path_factory, "short", max_position_embeddings=128), device="cpu")
    [trajectory] = evaluate_external(mini_swe_agent, short, [task], config=ExternalConfig(time_limit_s=120))
    assert trajectory.status == "error" and not trajectory.passed
    assert "tokens > context 128" in (trajectory.error or "")
    assert (trajectory.error or "").startswith("prompt ")


def test_a_model_on_cpu_gets_a_cpu_sized_output_limit(tiny_model):
    server = AgentServer(HFPolicy(tiny_model, device="cpu"))
    try:
        assert server.max_tokens == CPU_MAX_TOKENS
    finally:
        server.close()


def test_eval_limits_reach_ext_targets(mini_swe_agent, task, tiny_model):
    from harnessrl.eval.evaluate import evaluate
    from harnessrl.harness.harness import HarnessLimits
    from harnessrl.rollout.settings import RolloutSettings

    seen = []

    class Seen(HFPolicy):
        def generate_stream(self, requests, on_tokens):  # what a batch-at-a-time server calls
            seen.extend(r.params for r in requests)
            return super().generate_stream(requests, on_tokens)

        @contextlib.contextmanager
        def continuous(self):  # what the server's continuous batching adds each request to
            with super().continuous() as decoder:
                add = decoder.add

                def seen_add(key, request, on_tokens=None):
                    seen.append(request.params)
                    add(key, request, on_tokens)

                decoder.add = seen_add
                yield decoder

    policy = Seen(tiny_model, device="cpu")
    settings = RolloutSettings(limits=HarnessLimits(max_turns=2), max_new_tokens=8, temperature=0.7)
    result = evaluate(policy, ["ext:mini-swe-agent"], [task], settings=settings)
    [trajectory] = result.trajectories
    assert trajectory.config == "ext:mini-swe-agent" and trajectory.turns
    assert all(0 < len(turn.completion_ids) <= 8 for turn in trajectory.turns)  # --max-new-tokens
    assert len(trajectory.turns) <= 2  # --max-turns: the agent's own step limit
    # --temperature: every request the agent made sampled at the evaluation's, whatever it asked
    assert seen and {(p.temperature, p.top_p) for p in seen} == {(0.7, 1.0)}
