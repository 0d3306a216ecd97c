"""HFPolicy's prefix KV cache: cached and uncached generation agree, multi-turn prompts and shared
system prompts hit, divergent prefixes and mixed batches stay correct, the LRU bound holds, and
changed weights never meet stale KV. Mostly on a tiny random model; one test on the embedded one."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (make test installs it)")

from conftest import save_tiny_model  # noqa: E402
from harnessrl.policy.base import Generation, GenerationRequest, SamplingParams  # noqa: E402
from harnessrl.policy.cascade import row_groups  # noqa: E402
from harnessrl.policy.hf import HFPolicy  # noqa: E402
from harnessrl.policy.kv_slab import GROUPED_SDPA, KVSlab, grouped_sdpa_attention  # noqa: E402
from harnessrl.policy.prefix_cache import PrefixCache  # noqa: E402

LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer model of SmolLM2's architecture and tokenizer, with large
    initial weights so that its next-token distributions are peaked (greedy ties are unlikely)."""
    return save_tiny_model(tmp_path_factory, "tiny-prefix", initializer_range=0.3)


@pytest.fixture()
def cached(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy(tiny_model_dir, device="cpu", max_batch_size=8)


@pytest.fixture(scope="module")
def uncached(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy(tiny_model_dir, device="cpu", max_batch_size=8, max_prefix_cache_tokens=0)


def ids(seed: int, length: int) -> list[int]:
    """Returns ``length`` reproducible random token ids."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40_000, (length,), generator=generator).tolist()


def greedy(max_new_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)


def run(policy: HFPolicy, prompts: list[list[int]], params: SamplingParams | None = None) -> list[Generation]:
    return policy.generate([GenerationRequest(prompt, params or greedy()) for prompt in prompts])


def assert_same(got: list[Generation], want: list[Generation]) -> None:
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert [g.finish_reason for g in got] == [g.finish_reason for g in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOLERANCE)


# ------------------------------------------------------------------ the radix tree on its own


def kv_of(tokens: list[int]) -> torch.Tensor:
    """A stand-in KV tensor whose column i holds token i's id, so pieces can be read back."""
    return torch.tensor(tokens, dtype=torch.float32).reshape(1, 1, 1, -1, 1).expand(2, 2, 1, -1, 3).clone()


def matched_tokens(cache: PrefixCache, tokens: list[int], limit: int | None = None) -> list[int]:
    found = cache.match(tokens, limit)
    if not found.pieces:
        return []
    joined = torch.cat(found.pieces, dim=-2)
    assert joined.shape[-2] == found.length
    return [int(value) for value in joined[0, 0, 0, :, 0].tolist()]


def test_radix_tree_returns_the_kv_of_the_longest_common_prefix() -> None:
    cache = PrefixCache(max_tokens=1000)
    cache.insert([1, 2, 3, 4, 5], kv_of([1, 2, 3, 4, 5]))
    cache.insert([1, 2, 3, 9, 9, 9], kv_of([1, 2, 3, 9, 9, 9]))  # splits the first edge after 3
    assert cache.tokens == 8
    assert matched_tokens(cache, [1, 2, 3, 4, 5, 6]) == [1, 2, 3, 4, 5]
    assert matched_tokens(cache, [1, 2, 3, 9, 9, 7]) == [1, 2, 3, 9, 9]
    assert matched_tokens(cache, [1, 2, 7]) == [1, 2]
    assert matched_tokens(cache, [1, 2, 3, 4, 5], limit=4) == [1, 2, 3, 4]
    assert matched_tokens(cache, [2, 1]) == []
    cache.insert([1, 2, 3], kv_of([1, 2, 3]))  # already cached: nothing new is stored
    assert cache.tokens == 8
    with pytest.raises(ValueError, match="3 tokens for 2 ids"):
        cache.insert([1, 2], kv_of([1, 2, 3]))


def test_radix_tree_evicts_least_recently_used_leaves_to_stay_within_its_bound() -> None:
    cache = PrefixCache(max_tokens=12)
    shared = [7, 7, 7, 7]
    cache.insert([*shared, 1, 1, 1], kv_of([*shared, 1, 1, 1]))
    cache.insert([*shared, 2, 2, 2], kv_of([*shared, 2, 2, 2]))
    assert cache.tokens == 10
    matched_tokens(cache, [*shared, 1, 1, 1])  # touch branch 1: branch 2 is now the oldest leaf
    cache.insert([*shared, 3, 3, 3], kv_of([*shared, 3, 3, 3]))
    assert cache.tokens == 10 <= cache.max_tokens
    assert cache.stats.evicted_tokens == 3
    assert matched_tokens(cache, [*shared, 2, 2, 2]) == shared  # its leaf went, the shared part stayed
    assert matched_tokens(cache, [*shared, 1, 1, 1]) == [*shared, 1, 1, 1]
    cache.insert(list(range(100, 130)), kv_of(list(range(100, 130))))  # longer than the bound
    assert cache.tokens == 12
    assert matched_tokens(cache, list(range(100, 130))) == list(range(100, 112))
    cache.clear()
    assert cache.tokens == 0 and matched_tokens(cache, [*shared, 1]) == []


# ------------------------------------------------------------------ HFPolicy with the cache


def test_cached_greedy_generation_equals_uncached_tokens_and_logprobs(
    cached: HFPolicy, uncached: HFPolicy
) -> None:
    system = ids(0, 60)
    prompts = [system + ids(1, 9), system + ids(2, 31), ids(3, 17)]
    first = run(cached, prompts)
    assert_same(first, run(uncached, prompts))
    assert cached.cache_stats.cached_tokens == 60  # the second prompt reused the first's system part
    again = run(cached, prompts)  # every prompt is cached now: only its last token is recomputed
    assert_same(again, first)
    assert cached.cache_stats.prefilled_tokens == (60 + 31) + 9 + 17 + 3
    assert cached.prefix_cache is not None and uncached.prefix_cache is None
    assert uncached.cache_stats.cached_tokens == 0


def test_next_turn_prefills_only_the_tokens_after_the_previous_completion(
    cached: HFPolicy, uncached: HFPolicy
) -> None:
    prompt = ids(10, 80)
    turns = []
    for turn in range(3):
        generation = run(cached, [prompt])[0]
        assert_same([generation], run(uncached, [prompt]))
        turns.append(generation)
        before = cached.cache_stats.prefilled_tokens
        observation = ids(20 + turn, 15)
        prompt = prompt + generation.token_ids + observation
        next_generation = run(cached, [prompt])[0]
        # Cached: the previous prompt and all of the completion but its last (never fed) token.
        assert cached.cache_stats.prefilled_tokens - before == 1 + len(observation)
        assert_same([next_generation], run(uncached, [prompt]))
    assert cached.cache_stats.token_hit_rate > 0.7
    assert (cached.cache_stats.requests, cached.cache_stats.hits) == (6, 5)  # only the first missed


def test_divergent_prefixes_reuse_only_the_shared_part(cached: HFPolicy, uncached: HFPolicy) -> None:
    base = ids(30, 50)
    run(cached, [base])
    rewritten = base[:20] + ids(31, 40)  # history rewritten after token 20 (masking, compaction)
    before = cached.cache_stats.cached_tokens
    assert_same(run(cached, [rewritten]), run(uncached, [rewritten]))
    assert cached.cache_stats.cached_tokens - before == 20
    # Both branches are cached now; each one matches fully.
    before = cached.cache_stats.prefilled_tokens
    assert_same(run(cached, [base, rewritten]), run(uncached, [base, rewritten]))
    assert cached.cache_stats.prefilled_tokens - before == 2


def test_a_batch_mixing_cached_and_uncached_rows_of_different_lengths_matches_one_at_a_time(
    cached: HFPolicy, uncached: HFPolicy
) -> None:
    system = ids(40, 70)
    warm = [system + ids(41, 5), ids(42, 120)]
    warm_out = run(cached, warm, greedy(6))
    prompts = [
        warm[0] + warm_out[0].token_ids + ids(43, 12),  # long cached prefix
        ids(44, 7),  # short, nothing cached
        system + ids(45, 90),  # shares the system prompt only
        warm[1][:60] + ids(46, 3),  # part of an edge
        ids(47, 150),  # long, nothing cached
    ]
    params = [greedy(4), greedy(16), greedy(9), greedy(1), greedy(12)]
    got = cached.generate([GenerationRequest(p, s) for p, s in zip(prompts, params, strict=True)])
    one_at_a_time = [uncached.generate([GenerationRequest(p, s)])[0] for p, s in zip(prompts, params, strict=True)]
    assert_same(got, one_at_a_time)
    assert [len(g.token_ids) for g in got] == [4, 16, 9, 1, 12]


def test_seeded_sampling_draws_the_same_tokens_cached_and_uncached(cached: HFPolicy, uncached: HFPolicy) -> None:
    system = ids(50, 64)
    prompts = [system + ids(51, 4), system + ids(52, 22), system + ids(51, 4)]

    def requests(seed: int) -> list[GenerationRequest]:
        return [
            GenerationRequest(p, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=14, seed=seed + i))
            for i, p in enumerate(prompts)
        ]

    first = cached.generate(requests(7))
    assert_same(first, uncached.generate(requests(7)))
    assert_same(cached.generate(requests(7)), first)  # now fully cached
    assert cached.cache_stats.request_hit_rate > 0.5


def test_the_cache_stays_within_its_token_bound_and_keeps_the_latest_entries(tiny_model_dir: Path) -> None:
    small = HFPolicy(tiny_model_dir, device="cpu", max_prefix_cache_tokens=100)
    prompts = [ids(60 + i, 40) for i in range(5)]
    for prompt in prompts:
        run(small, [prompt], greedy(5))
        assert small.prefix_cache is not None and small.prefix_cache.tokens <= 100
    assert small.cache_stats.evicted_tokens > 0
    before = small.cache_stats.cached_tokens
    run(small, [prompts[-1]], greedy(5))  # the newest prompt is still there
    assert small.cache_stats.cached_tokens - before == 39
    before = small.cache_stats.cached_tokens
    run(small, [prompts[0]], greedy(5))  # the oldest one was evicted
    assert small.cache_stats.cached_tokens == before
    with pytest.raises(ValueError, match="max_prefix_cache_tokens"):
        HFPolicy(tiny_model_dir, device="cpu", max_prefix_cache_tokens=-1)


def test_generation_after_a_weight_change_equals_uncached_generation(
    tiny_model_dir: Path, uncached: HFPolicy
) -> None:
    policy = HFPolicy(tiny_model_dir, device="cpu")
    reference = HFPolicy(tiny_model_dir, device="cpu", max_prefix_cache_tokens=0)
    reference.model = policy.model  # the same weights, never cached
    prompts = [ids(70, 50), ids(71, 30)]
    before = run(policy, prompts)
    assert_same(before, run(uncached, prompts))

    # An optimizer step, as the trainer takes it: the policy notices the parameters' versions.
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.5)
    loss = policy.model(input_ids=torch.tensor([prompts[0]])).logits.float().logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    after = run(policy, prompts)
    assert policy.cache_stats.invalidations == 1
    assert_same(after, run(reference, prompts))
    assert [g.token_ids for g in after] != [g.token_ids for g in before]

    # Writes through .data move no version counter: the explicit call is what keeps KV fresh.
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.data.mul_(0.7)
    policy.clear_prefix_cache()
    assert policy.prefix_cache is not None and policy.prefix_cache.tokens == 0
    assert_same(run(policy, prompts), run(reference, prompts))


def test_trainer_clears_the_prefix_cache_after_every_weight_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    from harnessrl.rl.config import load_config
    from harnessrl.rl.loop import Trainer

    overrides = {
        "model": str(tiny_model_dir), "run_dir": str(tmp_path / "run"), "steps": 1, "tasks_per_step": 1,
        "group_size": 2, "max_turns": 1, "max_new_tokens": 4, "max_train_tasks": 4, "sft_warm_start_steps": 2,
        "sft_tasks": 1, "eval_tasks": 1, "eval_held_out": 1, "micro_batch_tokens": 4096, "seed": 3,
    }
    trainer = Trainer(load_config(preset="quick", overrides=overrides), log=lambda message: None)
    stats = trainer.policy.cache_stats
    trainer.rollouts(0)
    assert trainer.policy.prefix_cache is not None and trainer.policy.prefix_cache.tokens > 0
    trainer.rl_step(0)
    # dropped twice: before the update (the rollouts are over) and by the weight sync after it
    assert trainer.policy.prefix_cache.tokens == 0 and stats.invalidations == 2
    trainer.warm_start()
    assert stats.invalidations == 2 + 2  # one per SFT step


def test_slab_select_keeps_the_rows_in_place_without_a_new_slab() -> None:
    # [layers, 2, rows, kv_heads, capacity, head_dim], 6 of 10 columns filled
    buffer = torch.randn(3, 2, 5, 2, 10, 4)
    before = buffer.clone()
    slab = KVSlab(buffer, 6)
    cache = slab.cache()
    slab.select(torch.tensor([1, 3, 4]))
    assert slab.buffer.data_ptr() == buffer.data_ptr() and slab.buffer.shape[2] == 3  # the same storage
    assert torch.equal(slab.buffer[..., :6, :], before[:, :, [1, 3, 4], :, :6, :])
    assert slab.buffer.stride() == buffer.stride()  # attention reads the views as before
    for index, layer in enumerate(cache.layers):
        assert torch.equal(layer.keys, before[index, 0, [1, 3, 4], :, :6]) and layer.values.shape[0] == 3
    slab.select([0, 2])  # again, from the compacted batch: rows 1 and 4 of the first one
    assert torch.equal(slab.buffer[..., :6, :], before[:, :, [1, 4], :, :6, :])
    with pytest.raises(ValueError, match="must ascend"):
        slab.select([1, 0])


def test_row_groups_follow_length_tiers_of_a_longest_first_batch() -> None:
    assert row_groups([100, 95, 81, 80, 50, 49, 10]) == [(0, 4, 100), (4, 6, 50), (6, 7, 10)]
    assert row_groups([10, 40]) == [(0, 1, 10), (1, 2, 40)]  # a longer row never joins a shorter group
    assert row_groups([7]) == [(0, 1, 7)]


def test_grouped_decode_attention_equals_attention_over_the_whole_padded_width(cached: HFPolicy) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    assert cached.model.config._attn_implementation == GROUPED_SDPA
    attention = cached.model.model.layers[0].self_attn
    heads, kv_heads, dim = 4, 2, 8
    lengths = [90, 85, 40, 12]
    width = max(lengths)
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(len(lengths), heads, 1, dim, generator=generator)
    key = torch.randn(len(lengths), kv_heads, width, dim, generator=generator)
    value = torch.randn(len(lengths), kv_heads, width, dim, generator=generator)
    mask = torch.zeros(len(lengths), 1, 1, width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, ..., width - length :] = True
    groups = row_groups(lengths)
    assert len(groups) == 3
    grouped, _ = grouped_sdpa_attention(attention, query, key, value, mask, harnessrl_row_groups=groups, scaling=0.3)
    plain, _ = sdpa_attention_forward(attention, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(grouped, plain, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the embedded model


def test_embedded_model_multi_turn_episodes_hit_the_cache_and_match_uncached_rollouts() -> None:
    from harnessrl.harness import Harness, HarnessLimits
    from harnessrl.rollout.engine import RolloutEngine, RolloutJob
    from harnessrl.tasks.suite import load_suite

    policy = HFPolicy(device="cpu", max_batch_size=4)
    plain = HFPolicy(device="cpu", max_batch_size=4, max_prefix_cache_tokens=0)
    plain.model = policy.model
    limits = HarnessLimits(max_turns=2, max_new_tokens=24)
    tasks = list(load_suite("workspace").tasks("test", limit=2, seed=0))
    jobs = [RolloutJob(task, Harness.named("S0-T0-O0-C0-W0", limits)) for task in tasks]
    greedy_params = SamplingParams(temperature=0.0, max_new_tokens=24)
    with_cache, _ = RolloutEngine(policy, max_concurrent=2, sampling=greedy_params).run(jobs)
    without, _ = RolloutEngine(plain, max_concurrent=2, sampling=greedy_params).run(jobs)
    for a, b in zip(with_cache, without, strict=True):
        assert [t.completion_ids for t in a.turns] == [t.completion_ids for t in b.turns]
        for turn_a, turn_b in zip(a.turns, b.turns, strict=True):
            assert turn_a.completion_logprobs == pytest.approx(turn_b.completion_logprobs, abs=LOGPROB_TOLERANCE)
    turns = sum(len(t.turns) for t in with_cache)
    assert turns > len(jobs)  # at least one episode took a second turn
    # Every later turn extends its episode's previous prompt and completion (the renderer reuses
    # sampled ids), so all of that history but the last sampled token comes from the cache.
    history = 0
    for trajectory in with_cache:
        for previous, turn in zip(trajectory.turns, trajectory.turns[1:], strict=False):
            seen = previous.prompt_ids + previous.completion_ids
            assert turn.prompt_ids[: len(seen)] == seen
            history += len(seen) - 1
    stats = policy.cache_stats
    assert stats.cached_tokens >= history > 0
    # Turn one of the second episode shares the configuration's opening with the first.
    assert stats.hits == turns - 1
    assert stats.prefilled_tokens == stats.prompt_tokens - stats.cached_tokens


def test_a_sliding_window_model_runs_without_the_cache_and_matches_transformers_generate(
    tmp_path: Path,
) -> None:
    from harnessrl.policy.embedded import embedded_model_dir

    config = transformers.MistralConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=16, initializer_range=0.3,
    )
    torch.manual_seed(1)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    transformers.AutoTokenizer.from_pretrained(embedded_model_dir()).save_pretrained(tmp_path / "model")
    policy = HFPolicy(tmp_path / "model", device="cpu")
    assert policy.prefix_cache is None  # a sliding-window layer keeps only its window
    prompts = [ids(80, 30), ids(81, 11)]
    got = run(policy, prompts, greedy(10))
    for prompt, generation in zip(prompts, got, strict=True):
        expected = policy.model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=10, do_sample=False, pad_token_id=policy.tokenizer.pad_token_id,
        )[0, len(prompt):].tolist()
        assert generation.token_ids == expected
    assert policy.cache_stats.cached_tokens == 0
