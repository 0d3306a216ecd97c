"""Continuous batching (policy/continuous.py): requests that join and leave a running decode batch
get the tokens they get alone, an aborted request frees its row, prompts longer than the batch
lay it out anew, finished rows feed the prefix cache; on a tiny random SmolLM2-shaped model."""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest

pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (make test installs it)")

from harnessrl.policy.base import Generation, GenerationRequest, SamplingParams
from harnessrl.policy.continuous import StepDecoder
from harnessrl.policy.hf import HFPolicy


@pytest.fixture(scope="module")
def policy(tiny_model) -> HFPolicy:
    loaded = HFPolicy(tiny_model, device="cpu", max_batch_size=4)
    yield loaded
    loaded.close()


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(length)]


def request(length: int, seed: int, *, tokens: int = 12, temperature: float = 0.0, stop: tuple[int, ...] = ()
            ) -> GenerationRequest:
    return GenerationRequest(prompt(length, seed),
                             SamplingParams(temperature=temperature, max_new_tokens=tokens, seed=seed,
                                            stop_token_ids=stop))


def run(decoder: StepDecoder, schedule: dict[int, list[tuple[Hashable, GenerationRequest]]], *,
        limit: int = 500) -> dict[Hashable, Generation]:
    """Steps ``decoder``, adding the requests ``schedule`` names before each step number; returns
    every finished generation by key."""
    done: dict[Hashable, Generation] = {}
    for step in range(limit):
        for key, item in schedule.get(step, []):
            decoder.add(key, item)
        if step > max(schedule) and not decoder.running and not decoder.queued:
            return done
        for key, generation in decoder.step():
            assert key not in done
            done[key] = generation
    raise AssertionError("the decoder did not finish")


def alone(policy: HFPolicy, item: GenerationRequest) -> Generation:
    policy.clear_prefix_cache()
    return policy.generate([item])[0]


def test_requests_joining_and_leaving_get_the_tokens_they_get_alone(policy: HFPolicy) -> None:
    """Staggered joins (shorter and longer than the rows running), more requests than rows,
    greedy and seeded sampling: each request's tokens equal its single-request generation's,
    log-probs within 1e-4."""
    items = {
        "a": request(40, 1), "b": request(25, 2, tokens=5), "c": request(60, 3, temperature=1.0),
        "d": request(10, 4, tokens=20), "e": request(400, 5, temperature=1.0), "f": request(33, 6, tokens=3),
        "g": request(70, 7, tokens=16),
    }
    schedule = {0: [("a", items["a"]), ("b", items["b"])], 2: [("c", items["c"])],
                4: [("d", items["d"]), ("e", items["e"]), ("f", items["f"])], 9: [("g", items["g"])]}
    policy.clear_prefix_cache()
    with policy.continuous() as decoder:
        got = run(decoder, schedule)
        stats = decoder.stats
    assert stats.relayouts >= 1  # "e" (400 tokens) is longer than the batch and its slack when it joins
    assert stats.admitted == 7 and max(len(v) for v in schedule.values()) <= 4
    for key, item in items.items():
        want = alone(policy, item)
        assert got[key].token_ids == want.token_ids, key
        assert got[key].finish_reason == want.finish_reason == "length"
        assert got[key].logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_all_rows_admitted_at_once_give_generates_numbers_bit_for_bit(policy: HFPolicy) -> None:
    items = [request(50, 11, temperature=1.0), request(30, 12), request(20, 13, tokens=6, temperature=1.0)]
    policy.clear_prefix_cache()
    want = policy.generate(items)
    policy.clear_prefix_cache()
    with policy.continuous() as decoder:
        got = run(decoder, {0: list(enumerate(items))})
    for index, generation in enumerate(want):
        assert got[index].token_ids == generation.token_ids
        assert got[index].logprobs == generation.logprobs


def test_an_aborted_request_ends_with_its_tokens_and_frees_its_row(policy: HFPolicy) -> None:
    with policy.continuous() as decoder:
        for key in range(5):  # 4 rows: the fifth waits
            decoder.add(key, request(20 + key, 20 + key, tokens=50))
        assert decoder.step() == [] and (decoder.running, decoder.queued) == (4, 1)
        decoder.step()
        assert decoder.abort(1)
        finished = decoder.step()
        assert [key for key, _ in finished] == [1]
        assert finished[0][1].finish_reason == "abort" and len(finished[0][1].token_ids) == 3
        assert (decoder.running, decoder.queued) == (3, 1)
        decoder.step()  # the freed row admits the queued request
        assert (decoder.running, decoder.queued) == (4, 0)
        assert decoder.abort("nobody") is False


def test_a_queued_request_can_be_aborted_before_it_runs(policy: HFPolicy) -> None:
    with policy.continuous() as decoder:
        for key in range(5):
            decoder.add(key, request(15, key, tokens=4))
        decoder.step()
        assert (decoder.running, decoder.queued) == (4, 1)
        assert decoder.abort(4) and decoder.queued == 0
        assert decoder.abort(4) is False
        got = run(decoder, {0: []})
    assert sorted(got) == [0, 1, 2, 3]


def test_bad_requests_come_back_as_errors_and_keys_must_be_unique(policy: HFPolicy) -> None:
    with policy.continuous() as decoder:
        decoder.add("empty", GenerationRequest([], SamplingParams(max_new_tokens=4)))
        decoder.add("zero", GenerationRequest([5, 6], SamplingParams(max_new_tokens=0)))
        decoder.add("fine", request(12, 1, tokens=2))
        with pytest.raises(ValueError, match="already queued"):
            decoder.add("fine", request(12, 1, tokens=2))
        first = dict(decoder.step())
        assert first["empty"].finish_reason == "error" and "empty prompt" in (first["empty"].error or "")
        assert first["zero"] == Generation([], [], "length")
        rest = run(decoder, {0: []})
    assert rest["fine"].finish_reason == "length" and len(rest["fine"].token_ids) == 2


def test_stop_tokens_end_a_row_and_its_kv_serves_the_next_turn(policy: HFPolicy) -> None:
    """A finished row leaves its prompt and completion in the prefix cache: the next turn (the
    prompt, the completion and a new message) reuses them and samples what it samples uncached."""
    first = request(40, 31, tokens=12, temperature=1.0)
    sampled = alone(policy, first).token_ids
    end = next(k for k in range(3, 12) if sampled[k] not in sampled[:k])  # a token new at k
    stopped_item = GenerationRequest(first.prompt_ids, SamplingParams(
        temperature=1.0, max_new_tokens=12, seed=31, stop_token_ids=(sampled[end],)))
    policy.clear_prefix_cache()
    with policy.continuous() as decoder:
        got = run(decoder, {0: [("turn1", stopped_item), ("other", request(35, 32, tokens=10))]})
        assert got["turn1"].finish_reason == "stop" and got["turn1"].token_ids == sampled[: end + 1]
        second = GenerationRequest(first.prompt_ids + got["turn1"].token_ids + prompt(15, 33),
                                   SamplingParams(temperature=0.0, max_new_tokens=6))
        before = policy.cache_stats.cached_tokens
        again = run(decoder, {0: [("turn2", second)]})
        assert policy.cache_stats.cached_tokens - before == 40 + end  # the prompt and every fed token
    assert again["turn2"].token_ids == alone(policy, second).token_ids


# ------------------------------------------------------------------ through the rollout engine


def engine_run(policy: HFPolicy, *, continuous: bool, deterministic: bool = False, slow: int | None = None,
               monkeypatch: pytest.MonkeyPatch | None = None):
    """Runs 6 episodes (4 in flight, 3 turns of 10 sampled tokens at temperature 1) of the tiny
    model through the engine; episode ``slow``'s sandbox steps take 0.3 s more each."""
    import time

    from harnessrl.harness import Harness, HarnessLimits
    from harnessrl.rollout.engine import RolloutEngine, RolloutJob
    from harnessrl.tasks import Action, FileEquals, Task

    if monkeypatch is not None:
        step = RolloutEngine._step

        def slow_step(self, slot, generation):
            if slot.index == slow:
                time.sleep(0.3)
            return step(self, slot, generation)

        monkeypatch.setattr(RolloutEngine, "_step", slow_step)
    limits = HarnessLimits(max_turns=3, max_new_tokens=10, max_consecutive_format_errors=5)
    codes = ["S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2"]
    jobs = [RolloutJob(Task(id=f"t{i}", instruction=f"Write {i} into a.txt." + " Please." * (9 * i),
                            verifier=FileEquals("a.txt", f"{i}"), gold=[Action.write("a.txt", f"{i}\n")]),
                       Harness.named(codes[i % 3], limits), seed=i) for i in range(6)]
    policy.clear_prefix_cache()  # what prefixes are cached moves the prefill's rounding
    engine = RolloutEngine(policy, max_concurrent=4, env_workers=4, sampling=SamplingParams(temperature=1.0),
                           deterministic=deterministic, continuous_batching=continuous)
    trajectories, stats = engine.run(jobs)
    if monkeypatch is not None:
        monkeypatch.undo()
    return trajectories, stats


def test_the_engine_with_continuous_batching_samples_what_it_samples_in_batches(policy: HFPolicy) -> None:
    batched, batched_stats = engine_run(policy, continuous=False)
    continuous, stats = engine_run(policy, continuous=True)
    assert stats.generation_calls > 0 and stats.tokens_generated == batched_stats.tokens_generated
    assert sum(len(t.turns) for t in continuous) == sum(len(t.turns) for t in batched) >= 12
    for want, got in zip(batched, continuous, strict=True):
        assert (got.task_id, got.status, got.error) == (want.task_id, want.status, want.error)
        for a, b in zip(want.turns, got.turns, strict=True):
            assert b.prompt_ids == a.prompt_ids and b.completion_ids == a.completion_ids
            assert b.completion_logprobs == pytest.approx(a.completion_logprobs, abs=1e-4)


def test_deterministic_continuous_batching_does_not_depend_on_which_episode_is_slow(
    policy: HFPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [engine_run(policy, continuous=True, deterministic=True, slow=slow, monkeypatch=monkeypatch)
            for slow in (0, 1)]
    (first, first_stats), (second, second_stats) = runs
    assert (first_stats.generation_calls, first_stats.mean_batch_size) == (
        second_stats.generation_calls, second_stats.mean_batch_size)
    for a, b in zip(first, second, strict=True):
        assert [(t.prompt_ids, t.completion_ids, t.completion_logprobs) for t in a.turns] == [
            (t.prompt_ids, t.completion_ids, t.completion_logprobs) for t in b.turns]


def test_a_failing_forward_ends_the_batch_with_error_generations_and_the_decoder_goes_on(
    policy: HFPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    with policy.continuous() as decoder:
        decoder.add("a", request(20, 1, tokens=6))
        decoder.add("b", request(30, 2, tokens=6))
        decoder.step()
        with monkeypatch.context() as patched:
            patched.setattr(policy, "model", lambda **kwargs: (_ for _ in ()).throw(RuntimeError("out of memory")))
            failed = dict(decoder.step())
        assert set(failed) == {"a", "b"} and decoder.running == 0
        assert all(g.finish_reason == "error" and "RuntimeError: out of memory" in (g.error or "")
                   for g in failed.values())
        decoder.add("c", request(25, 3, tokens=4))
        got = run(decoder, {0: []})
    assert got["c"].token_ids == alone(policy, request(25, 3, tokens=4)).token_ids


def test_a_failing_prefill_answers_the_request_it_was_admitting(policy: HFPolicy, monkeypatch) -> None:
    with policy.continuous() as decoder:
        decoder.add("a", request(20, 1, tokens=6))
        with monkeypatch.context() as patched:
            patched.setattr(policy, "_prefill_row", lambda *a: (_ for _ in ()).throw(ValueError("bad prompt")))
            failed = decoder.step()
        assert failed == [("a", Generation([], [], "error", error="generation failed: ValueError: bad prompt"))]
        assert (decoder.running, decoder.queued) == (0, 0)


def test_forced_sampling_forces_what_its_continuous_decoder_samples(policy: HFPolicy) -> None:
    """Black-box training and ``eval --temperature`` serve through ``ForcedSampling``: the
    server's continuous batching then runs the wrapped policy's decoder with the forced sampling."""
    from harnessrl.policy.forced import ForcedSampling

    served = ForcedSampling(policy, temperature=0.0, max_new_tokens=3)
    assert served.supports_continuous
    asked = GenerationRequest(prompt(30, 41), SamplingParams(temperature=1.5, max_new_tokens=100, seed=41))
    with served.continuous() as decoder:
        got = run(decoder, {0: [("a", asked)]})
    want = alone(policy, GenerationRequest(asked.prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=3)))
    assert got["a"].token_ids == want.token_ids and len(want.token_ids) == 3


def test_a_sink_that_raises_answers_each_request_once(policy: HFPolicy) -> None:
    """A row that finished in the same step as the failure keeps its answer; the rest are errors."""
    def broken(ids):
        if ids:  # it lets the request in (asked with no ids) and fails on its first token
            raise OSError("client socket")

    with policy.continuous() as decoder:
        decoder.add("short", request(20, 1, tokens=1))
        decoder.add("broken", request(25, 2, tokens=6), broken)
        answers = decoder.step()
    assert [key for key, _ in answers] == ["short", "broken"]
    assert answers[0][1].finish_reason == "length" and len(answers[0][1].token_ids) == 1
    assert answers[1][1].finish_reason == "error" and "OSError: client socket" in (answers[1][1].error or "")


def test_a_waiting_request_its_sink_gave_up_is_answered_unrun_without_a_prefill(
        policy: HFPolicy, monkeypatch) -> None:
    """A request that waits for a row is asked (with no tokens) when one frees: False ends it with
    no tokens and no prefill (a server's client that left meanwhile); a sink that raises there
    answers only its own request, with an error; the others run as they would."""
    prefills: list[int] = []
    prefill_row = policy._prefill_row
    monkeypatch.setattr(policy, "_prefill_row", lambda ids, columns: prefills.append(len(ids)) or prefill_row(ids, columns))
    left = {"gone": False}
    asked: list[tuple[int, ...]] = []

    def leaving(ids):
        asked.append(tuple(ids))
        return False if left["gone"] else None

    def broken(ids):
        raise OSError("client socket")

    with policy.continuous() as decoder:
        for key in range(4):  # 4 rows: the next two wait
            decoder.add(key, request(20 + key, key, tokens=3))
        decoder.add("left", request(30, 9, tokens=5), leaving)
        decoder.add("broken", request(31, 8, tokens=5), broken)
        decoder.step()
        assert (decoder.running, decoder.queued) == (4, 2) and asked == []
        left["gone"] = True
        got = run(decoder, {0: [(5, request(22, 5, tokens=2))]})
        assert decoder.stats.dropped == 1
    assert got["left"].finish_reason == "abort" and got["left"].token_ids == [] and asked == [()]
    assert got["broken"].finish_reason == "error" and "OSError: client socket" in (got["broken"].error or "")
    assert sorted(prefills) == [20, 21, 22, 22, 23]  # the four first rows and key 5, not the two that left
    for key in (*range(4), 5):
        assert got[key].finish_reason == "length"
    assert got[5].token_ids == alone(policy, request(22, 5, tokens=2)).token_ids
