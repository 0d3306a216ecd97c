"""Factors are data: a sixth three-level factor registered by a user enters the space, the
OA(18, 3^6, 2) design, every harness (in-space, out-of-space, sibling) and the episode, and the
oracle passes through all 18 of its configurations; removing it restores the papers' space."""

import pytest

from harnessrl.design import orthogonal
from harnessrl.harness import Harness
from harnessrl.harness.base import CallVerdict, FactorHooks, SystemPrompt
from harnessrl.harness.limits import SCRIPTED_LIMITS
from harnessrl.harness.registry import default_space, register, register_factor, unregister_factor
from harnessrl.harness.siblings import Patch, SetLevel, Sibling, build
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks import Action, FileEquals, Task

NOTE = "Preflight: the workspace is yours; check the file before you submit."
HINT = "Preflight hint: you may look at what you wrote."


class NoPreflight(FactorHooks):
    letter, level, name, description = "P", 0, "none", "nothing at the opening or on calls"


class PreflightNote(FactorHooks):
    letter, level, name, description = "P", 1, "note", "a note after the task"

    def at_start(self, state, sandbox):
        return [NOTE]


class PreflightHint(FactorHooks):
    letter, level, name, description = "P", 2, "hint", "a hint after every call"

    def before_call(self, call, state):
        return CallVerdict(hints=(HINT,))


@pytest.fixture
def sixth_factor():
    register_factor("preflight", "P", "what the harness adds before and around calls")
    for cls in (NoPreflight, PreflightNote, PreflightHint):
        register(cls)
    try:
        yield default_space()
    finally:
        unregister_factor("P")


def hello_task(i):
    return Task(id=f"hello-{i}", instruction=f"Create hello{i}.txt containing hello.",
                verifier=FileEquals(f"hello{i}.txt", "hello"),
                gold=[Action.write(f"hello{i}.txt", "hello\n"), Action.submit("")])


def test_the_oracle_runs_through_an_oa18_of_six_factors(sixth_factor):
    space = sixth_factor
    assert space.letters == ("S", "T", "O", "C", "W", "P") and space.size == 3 ** 6
    design = orthogonal(space)
    assert len(design.configs) == 18 and design.report.strength >= 2 and design.report.min_hamming >= 3
    tasks = [hello_task(0), hello_task(1)]
    harnesses = [Harness.from_config(config, SCRIPTED_LIMITS) for config in design.configs]
    assert all(list(h.components) == list(space.letters) for h in harnesses)
    jobs = [RolloutJob(task, harness, seed=0) for harness in harnesses for task in tasks]
    trajectories, _ = RolloutEngine(OraclePolicy(), max_concurrent=8).run(jobs)
    assert [t.status for t in trajectories if not t.passed] == []
    by_level = {level: [t for t, job in zip(trajectories, jobs, strict=True)
                        if job.harness.code.endswith(f"P{level}")] for level in range(3)}
    assert all(len(runs) == 12 for runs in by_level.values())  # each level in 6 of the 18 rows
    for level, runs in by_level.items():
        for t in runs:
            observations = " ".join(turn.observation for turn in t.turns)
            assert (HINT in observations) == (level == 2), t.config
            assert t.config.count("-") == 5  # six letters in the code


def test_start_hooks_of_the_sixth_factor_are_shown_after_the_task(sixth_factor):
    from harnessrl.rollout.episode import Episode
    from harnessrl.sandbox import open_sandbox

    policy = OraclePolicy()
    for level, shown in ((0, False), (1, True)):
        harness = Harness.named(f"S0-T1-O1-C0-W0-P{level}", SCRIPTED_LIMITS)
        with open_sandbox() as sandbox:
            episode = Episode(harness, hello_task(0), sandbox, policy.tokenizer)
            episode.start()
            assert any(NOTE in m.content for m in episode.history) is shown


def test_presets_and_siblings_cover_the_sixth_factor(sixth_factor):
    codex = Harness.named("codex-like")
    assert isinstance(codex.components["P"], NoPreflight)  # a preset names five: the sixth at level 0
    sibling = build(Sibling("p2", "S0-T1-O1-C0-W0-P0", Patch((SetLevel(factor="P", level=2),))), SCRIPTED_LIMITS)
    assert isinstance(sibling.components["P"], PreflightHint)
    assert isinstance(sibling.system.inner, SystemPrompt)  # the five are still wrapped as before


def test_a_sixth_factors_levels_must_act_through_hooks(sixth_factor):
    class NotAHook(SystemPrompt):
        letter, level, name = "P", 3, "wrong"

        def system_message(self, ctx):
            return ""

        def first_user_message(self, ctx):
            return ""

    with pytest.raises(ValueError, match="FactorHooks"):
        register(NotAHook)


def test_removing_the_factor_restores_the_papers_space(sixth_factor):
    unregister_factor("P")
    try:
        assert default_space().letters == ("S", "T", "O", "C", "W") and default_space().size == 243
        assert list(Harness.named("S0-T0-O0-C0-W0").components) == ["S", "T", "O", "C", "W"]
        with pytest.raises(ValueError, match="cannot be removed"):
            unregister_factor("S")
    finally:  # the fixture removes it again
        register_factor("preflight", "P")
        for cls in (NoPreflight, PreflightNote, PreflightHint):
            register(cls)
