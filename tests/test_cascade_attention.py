"""Cascade attention (policy/cascade.py): rows that share a prompt prefix read it once per decode
step, and generation computes the same function as without it (greedy tokens equal, log-probs
within float rounding), whichever rows leave the batch first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (make test installs it)")

from conftest import save_tiny_model  # noqa: E402
from harnessrl.policy import cascade  # noqa: E402
from harnessrl.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from harnessrl.policy.cascade import (  # noqa: E402
    CascadeBlock,
    cascade_attention,
    cascade_order,
    decode_blocks,
    prefix_groups,
)
from harnessrl.policy.hf import HFPolicy  # noqa: E402


def ids(seed: int, length: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40_000, (length,), generator=generator).tolist()


def test_prefix_groups_keep_each_group_prompt_apart_from_the_system_prompt_all_share() -> None:
    system = ids(0, 40)
    task_a, task_b = system + ids(1, 100), system + ids(2, 80)
    prompts = [task_a] * 3 + [task_b + ids(3, 5), task_b + ids(4, 7)] + [ids(5, 60)]
    # Merging the two groups would share only the system prompt: 4 x 40 < 2 x 140 + 1 x 120.
    assert prefix_groups(prompts) == [(0, 3, 140), (3, 5, 120), (5, 6, 0)]
    assert prefix_groups(prompts, min_prefix=200) == [(i, i + 1, 0) for i in range(6)]
    # A shuffled batch: the order puts each group's rows together, groups first, then the rest longest first.
    shuffled = [prompts[i] for i in (5, 3, 0, 4, 1, 2)]
    order = cascade_order(shuffled)
    assert sorted(order) == list(range(6))
    assert [shuffled[i] for i in order][-1] == prompts[5]
    groups = prefix_groups([shuffled[i] for i in order])
    assert sorted((end - first, prefix) for first, end, prefix in groups) == [(1, 0), (2, 120), (3, 140)]


def test_decode_blocks_read_a_group_prefix_once_and_tier_the_rest() -> None:
    # rows 0-2: one group with a 100-token prefix; row 3 alone; row 4 the last row of a group left alone
    blocks = decode_blocks(lengths=[130, 120, 125, 90, 80], group_of=[0, 0, 0, 1, 2], prefixes=[100, 0, 50],
                           starts=[0, 10, 5, 40, 50])
    assert blocks == [CascadeBlock(0, 3, (30, 20, 25), 100, 0, 0), CascadeBlock(3, 5, (90, 80))]


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_cascade_attention_equals_attention_over_each_row_columns(dtype, tolerance) -> None:
    torch.manual_seed(0)
    rows, kv_heads, per_kv, dim, width = 5, 3, 3, 64, 300
    key, value = torch.randn(2, rows, kv_heads, width, dim, dtype=dtype)
    lengths, prefix = [300, 260, 280, 200, 150], 180
    starts = [width - n for n in lengths]
    for row in (1, 2):  # rows 0-2 share their first 180 tokens, bit for bit
        key[row, :, starts[row] : starts[row] + prefix] = key[0, :, :prefix]
        value[row, :, starts[row] : starts[row] + prefix] = value[0, :, :prefix]
    query = torch.randn(rows, kv_heads * per_kv, 1, dim, dtype=dtype)
    blocks = decode_blocks(lengths, [0, 0, 0, 1, 2], [prefix, 0, 0], starts)
    assert blocks[0].prefix == prefix and blocks[0].end == 3
    got = cascade_attention(query, key, value, blocks, scaling=dim**-0.5)
    for row, length in enumerate(lengths):
        k = key[row : row + 1, :, -length:].repeat_interleave(per_kv, dim=1)
        v = value[row : row + 1, :, -length:].repeat_interleave(per_kv, dim=1)
        want = torch.nn.functional.scaled_dot_product_attention(query[row : row + 1].float(), k.float(), v.float(),
                                                                scale=dim**-0.5)
        assert got.shape == (rows, 1, kv_heads * per_kv, dim)
        assert torch.allclose(got[row, 0].float(), want[0, :, 0], atol=tolerance, rtol=0), row


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory, "tiny-cascade", initializer_range=0.3)


def group_batch(max_new_tokens: list[int]) -> list[GenerationRequest]:
    """Two GRPO-like groups (4 and 3 rollouts of one prompt, a system prompt common to both) and
    one prompt alone; per-row token budgets make rows leave the batch at different steps."""
    system = ids(10, 48)
    prompts = [system + ids(11, 70)] * 4 + [system + ids(12, 90)] * 3 + [ids(13, 50)]
    return [GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=n))
            for prompt, n in zip(prompts, max_new_tokens, strict=True)]


def test_generation_with_cascade_attention_matches_generation_without(tiny_model_dir, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(cascade, "_FLASH", lambda *a, _f=cascade._FLASH, **k: calls.append(1) or _f(*a, **k))
    plain = HFPolicy(tiny_model_dir, device="cpu", max_batch_size=16)
    shared = HFPolicy(tiny_model_dir, device="cpu", max_batch_size=16, cascade_attention=True)
    assert shared.cascade_attention and not plain.cascade_attention
    budgets = [3, 12, 7, 12, 12, 2, 9, 10]  # each group's first rows (its prefix's source) leave early
    for turn in range(2):
        want = plain.generate(group_batch(budgets))
        assert not calls
        got = shared.generate(group_batch(budgets))
        assert calls, "no cascade block ran"
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        for a, b in zip(got, want, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        calls.clear()
        budgets = [n + turn for n in budgets]
    # The next turn of each rollout extends its own completion: the rows still share the first prompt.
    first = plain.generate(group_batch(budgets))
    follow = [GenerationRequest(r.prompt_ids + g.token_ids + ids(20 + i, 6), r.params)
              for i, (r, g) in enumerate(zip(group_batch(budgets), first, strict=True))]
    want = plain.generate(follow)
    got = shared.generate(follow)
    assert calls
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_cascade_attention_is_off_without_the_prefix_cache(tiny_model_dir) -> None:
    policy = HFPolicy(tiny_model_dir, device="cpu", max_prefix_cache_tokens=0, cascade_attention=True)
    assert not policy.cascade_attention


def test_a_group_prefix_is_cut_to_what_every_other_row_copied_from_the_cache(tiny_model_dir) -> None:
    """The prefix is read from the group's first row: rows that recomputed part of it (the last
    prompt token always; more after an eviction) attend over their own keys for that part."""
    policy = HFPolicy(tiny_model_dir, device="cpu", cascade_attention=True)
    prompt = ids(30, 120)
    assert policy._cascade_groups([prompt] * 3 + [ids(31, 50)], reused=[0, 119, 100, 0]) == ([0, 0, 0, 1], [100, 0])
    assert policy._cascade_groups([prompt] * 3, reused=[0, 119, 10]) is None  # 10 tokens: not worth it


def test_a_training_run_with_cascade_attention_rolls_out_through_it(tiny_model, tmp_path, monkeypatch) -> None:
    """``cascade_attention: true`` reaches the trainer's rollout policy: a tiny GRPO run's groups
    decode through cascade blocks, and the run ends with the metrics a run without it has."""
    from harnessrl.rl.config import load_config
    from harnessrl.rl.loop import train

    calls = []
    monkeypatch.setattr(cascade, "_FLASH", lambda *a, _f=cascade._FLASH, **k: calls.append(1) or _f(*a, **k))
    settings = {"steps": 1, "tasks_per_step": 2, "group_size": 3, "max_turns": 2, "max_new_tokens": 8,
                "max_train_tasks": 4, "sft_warm_start_steps": 0, "eval_base": False, "eval_held_out": 0,
                "eval_out_of_space": False, "model": str(tiny_model), "seed": 3}
    metrics = {}
    for on in (False, True):
        run_dir = tmp_path / f"cascade-{on}"
        train(load_config(preset="quick", overrides={**settings, "cascade_attention": on, "run_dir": str(run_dir)}),
              log=lambda message: None)
        assert bool(calls) == on
        metrics[on] = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics[True]["episodes"] == metrics[False]["episodes"] == 6
    assert set(metrics[True]) == set(metrics[False])
