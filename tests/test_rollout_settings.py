"""How rollouts run: the one rule for an episode's limits (`harness.limits.resolve_limits`: what a
run set, else the default of its kind of policy; used by episodes, `eval`, `rollout` and `pool`),
and the one settings type (`rollout.settings.RolloutSettings`) that evaluation, Harness-S and the
trainer hand to the engine, with one default per setting."""

import argparse
from dataclasses import replace

import pytest

from harnessrl.cli.eval import register as register_eval
from harnessrl.harness.chat import ByteTokenizer
from harnessrl.harness.harness import Harness
from harnessrl.harness.limits import SCRIPTED_LIMITS, HarnessLimits, is_bytewise, resolve_limits
from harnessrl.policy.base import SamplingParams
from harnessrl.policy.scripted import OraclePolicy
from harnessrl.rl.config import TrainConfig
from harnessrl.rollout.engine import EngineOptions, RolloutEngine
from harnessrl.rollout.episode import Episode
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.sandbox import open_sandbox
from harnessrl.tasks import Action, FileEquals, Task


def test_first_source_that_sets_a_limit_wins_then_the_default():
    options = {"max_turns": None, "max_new_tokens": 96, "context_tokens": 0, "unrelated": 5}
    run = {"max_turns": 7, "max_new_tokens": 200, "context_tokens": 4096, "learning_rate": 1e-5}
    limits = resolve_limits(options, run)
    assert (limits.max_turns, limits.max_new_tokens, limits.context_tokens) == (7, 96, 4096)
    assert resolve_limits() == HarnessLimits()
    assert resolve_limits(None, {}) == HarnessLimits()


def test_bytewise_policies_get_scripted_room_only_where_nothing_was_set():
    assert resolve_limits(bytewise=True) == SCRIPTED_LIMITS
    limits = resolve_limits({"max_new_tokens": 64}, bytewise=True)
    assert (limits.max_new_tokens, limits.context_tokens) == (64, SCRIPTED_LIMITS.context_tokens)
    # A HarnessLimits sets what differs from the default (an episode's harness limits).
    given = HarnessLimits(max_turns=3, context_tokens=32_768, fixed_wall_time=True)
    resolved = resolve_limits(given, bytewise=True)
    assert resolved == HarnessLimits(max_turns=3, max_new_tokens=SCRIPTED_LIMITS.max_new_tokens,
                                     context_tokens=32_768, fixed_wall_time=True)
    assert resolve_limits(given) == given  # a model policy: the harness's limits as they are


def test_is_bytewise_reads_a_policy_or_a_tokenizer():
    assert is_bytewise(ByteTokenizer()) and is_bytewise(OraclePolicy())
    assert not is_bytewise(object()) and not is_bytewise(None)


def test_an_episode_of_a_scripted_policy_runs_under_resolved_limits():
    task = Task(id="limits", instruction="Create hello.txt containing hello.", verifier=FileEquals("hello.txt", "hello"),
                gold=[Action.write("hello.txt", "hello\n"), Action.submit("")])
    harness = Harness.named("S1-T1-O1-C1-W1", HarnessLimits(max_turns=4))
    with open_sandbox() as sandbox:
        scripted = Episode(harness, task, sandbox, ByteTokenizer())
        assert scripted.limits == HarnessLimits(max_turns=4, max_new_tokens=SCRIPTED_LIMITS.max_new_tokens,
                                                context_tokens=SCRIPTED_LIMITS.context_tokens)


@pytest.mark.parametrize(("argv", "expected"), [
    ([], (5, 128, 2048)),  # the training run's
    (["--max-turns", "9", "--context-tokens", "4096"], (9, 128, 4096)),  # the options first
])
def test_eval_options_then_the_run_config(argv, expected):
    parser = argparse.ArgumentParser()
    register_eval(parser.add_subparsers())
    args = parser.parse_args(["eval", *argv])
    limits = resolve_limits(vars(args), {"max_turns": 5, "max_new_tokens": 128, "context_tokens": 2048})
    assert (limits.max_turns, limits.max_new_tokens, limits.context_tokens) == expected


def test_rollout_settings_build_the_engine_they_describe():
    settings = RolloutSettings(limits=HarnessLimits(max_new_tokens=48, context_tokens=2048), temperature=0.5,
                               top_p=0.9, backend="bwrap", max_concurrent=3, env_workers=2, deterministic=True)
    assert settings.sampling() == SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=48)  # None: the limits'
    assert replace(settings, max_new_tokens=16).sampling().max_new_tokens == 16
    options = settings.engine(OraclePolicy()).options
    assert (options.max_concurrent, options.env_workers, options.backend, options.deterministic) == (3, 2, "bwrap", True)
    assert options.sampling == settings.sampling()


def test_concurrency_has_one_default_everywhere():
    parser = argparse.ArgumentParser()
    register_eval(parser.add_subparsers())
    args = parser.parse_args(["eval"])
    assert (TrainConfig().max_concurrent == RolloutSettings().max_concurrent == args.concurrent
            == EngineOptions().max_concurrent == RolloutEngine(OraclePolicy()).options.max_concurrent)
    assert TrainConfig().env_workers == RolloutSettings().env_workers == args.workers == EngineOptions().env_workers


def test_a_runs_training_and_evaluation_rollouts():
    cfg = TrainConfig(temperature=0.8, top_p=0.95, eval_temperature=0.0, max_new_tokens=64, seed=5,
                      sandbox_backend="bwrap", max_concurrent=4, env_workers=3, deterministic=True)
    limits = HarnessLimits(max_turns=3, max_new_tokens=64, context_tokens=1024)
    train = cfg.rollout_settings(limits)
    assert train.sampling() == SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=64)
    assert (train.seed, train.backend, train.max_concurrent, train.env_workers, train.deterministic) == (5, "bwrap", 4, 3, True)
    evaluation = cfg.rollout_settings(limits, evaluation=True)
    assert evaluation.sampling() == SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=64)
    spec = cfg.rollout_settings(limits, evaluation=True, temperature=0.7, seed=9)
    assert (spec.temperature, spec.seed, spec.limits) == (0.7, 9, limits)
