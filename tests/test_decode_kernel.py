"""The C++ attention kernels (``policy/decode_kernel.py``): a decode step's attention as SDPA computes
it over only each row's filled slab columns, a prefill's causal attention over its cached prefix as
SDPA computes it under the mask, and ``HFPolicy`` with them gives the tokens it gives without them;
where they cannot be built the policy keeps SDPA and says why."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.policy import decode_kernel as dk  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    """The built kernel; without a C++ compiler the test fails in CI and is skipped elsewhere
    (`make setup` installs g++ where it can)."""
    if shutil.which("c++") is None:
        if os.environ.get("CI"):
            pytest.fail("no C++ compiler: the decode-attention kernel cannot be built")
        pytest.skip("no C++ compiler (`make setup` installs g++ where it can)")
    built = dk.decode_kernel()
    assert built is not None, "the kernel did not build: see the warning logged"
    return built


def reference(query, key, value, lengths, scale):
    """SDPA per row over its filled columns (the right end of the slab), GQA by repeating keys."""
    rows, heads, _, _ = query.shape
    group = heads // key.shape[1]
    outputs = []
    for row in range(rows):
        k = key[row, :, key.shape[2] - lengths[row]:].repeat_interleave(group, dim=0)
        v = value[row, :, value.shape[2] - lengths[row]:].repeat_interleave(group, dim=0)
        outputs.append(torch.nn.functional.scaled_dot_product_attention(query[row], k, v, scale=scale))
    return torch.stack(outputs).transpose(1, 2)  # [rows, 1, heads, head_dim]


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 2, 32), (8, 1, 128)])
def test_the_kernel_computes_sdpa_over_each_rows_columns(kernel, heads, kv_heads, head_dim):
    torch.manual_seed(0)
    rows, capacity, fill = 5, 700, 517
    # a slab with room to spare on both sides, read through the strided view a decode step gets
    slab = torch.randn(2, rows, kv_heads, capacity, head_dim) * 3
    key, value = slab[0, :, :, :fill], slab[1, :, :, :fill]
    query = torch.randn(rows, heads, 1, head_dim) * 3
    lengths = torch.tensor([fill, 1, 128, 129, 300])  # whole, one column, block edges, a tail
    scale = head_dim ** -0.5
    got = dk.decode_attention(kernel, query, key, value, lengths, scale)
    want = reference(query, key, value, lengths.tolist(), scale)
    assert got.shape == (rows, 1, heads, head_dim)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-5)  # float32 sums in another order, libmvec exp
    # the padding it must not read: garbage there changes nothing
    slab[:, 2, :, : fill - 128] = float("nan")
    assert torch.equal(dk.decode_attention(kernel, query, key, value, lengths, scale), got)


def test_the_kernel_computes_bfloat16_attention_in_float32(kernel):
    torch.manual_seed(1)
    rows, fill = 4, 400
    slab = torch.randn(2, rows, 3, fill + 64, 64).bfloat16()
    key, value = slab[0, :, :, :fill], slab[1, :, :, :fill]
    query = torch.randn(rows, 9, 1, 64).bfloat16()
    lengths = torch.tensor([fill, 7, 128, 257])
    got = dk.decode_attention(kernel, query, key, value, lengths, 0.125)
    assert got.dtype == torch.bfloat16
    exact = reference(query.float(), key.float(), value.float(), lengths.tolist(), 0.125)
    torch.testing.assert_close(got.float(), exact, rtol=0, atol=1e-2)  # one bfloat16 rounding of the output
    assert torch.equal(got, exact.bfloat16())  # ... and only that: the arithmetic is float32's


def test_the_kernel_refuses_what_it_cannot_compute(kernel):
    query, key = torch.randn(2, 3, 3, 64), torch.randn(2, 3, 10, 64)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernel.decode_attention(query.double(), key.double(), key.double(), torch.tensor([0, 0]), 1.0)
    with pytest.raises(RuntimeError, match="one dtype"):
        kernel.decode_attention(query, key.bfloat16(), key.bfloat16(), torch.tensor([0, 0]), 1.0)
    with pytest.raises(RuntimeError, match="attends over no column"):
        kernel.decode_attention(query, key, key, torch.tensor([0, 10]), 1.0)
    with pytest.raises(RuntimeError, match="head size 48 is not built"):
        kernel.decode_attention(torch.randn(2, 3, 3, 48), torch.randn(2, 3, 10, 48), torch.randn(2, 3, 10, 48),
                                torch.tensor([0, 0]), 1.0)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernel.decode_attention(query, key.transpose(2, 3).contiguous().transpose(2, 3), key, torch.tensor([0, 0]), 1.0)


@pytest.fixture(scope="module")
def head64_model(tmp_path_factory):
    from conftest import save_tiny_model

    return save_tiny_model(tmp_path_factory, "tiny-head64", hidden_size=48, num_attention_heads=6,
                           num_key_value_heads=2, head_dim=64)


def test_hf_policy_decodes_the_same_tokens_with_the_kernel(kernel, head64_model):
    from harnessrl.policy.base import GenerationRequest, SamplingParams
    from harnessrl.policy.hf import HFPolicy

    with_kernel = HFPolicy(head64_model, device="cpu", dtype="float32")
    without = HFPolicy(head64_model, device="cpu", dtype="float32", decode_kernel=False)
    assert with_kernel._decode_kernel is kernel and without._decode_kernel is None
    prompts = [[(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate((5, 140, 33, 260))]
    requests = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=12 + 5 * i))
                for i, p in enumerate(prompts)]
    for policy in (with_kernel, without):  # the batch: rows of four lengths, finishing apart
        policy.clear_prefix_cache()
    a, b = with_kernel.generate(requests), without.generate(requests)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
    # continuous batching: requests joining at different steps get the same tokens too
    with with_kernel.continuous() as decoder:
        for key, request in enumerate(requests[:2]):
            decoder.add(key, request)
        finished, joined = {}, False
        while len(finished) < len(requests):
            for key, generation in decoder.step():
                finished[key] = generation
            if not joined and decoder.stats.steps >= 4:  # two more join a batch four steps in
                decoder.add(2, requests[2])
                decoder.add(3, requests[3])
                joined = True
    assert [finished[k].token_ids for k in range(len(requests))] == [g.token_ids for g in b]


def test_a_kernel_that_does_not_build_leaves_sdpa_and_says_why(monkeypatch, tmp_path, caplog):
    broken = tmp_path / "decode_attention.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(dk, "SOURCES", (broken, dk.SOURCES[1]))
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger=dk.__name__):
        assert dk.decode_kernel.__wrapped__() is None
    assert "could not be built" in caplog.text and "decode and prefill attention use SDPA" in caplog.text
    monkeypatch.setattr(dk, "decode_kernel", lambda: None)
    assert dk.select_kernel(None, fits=True) is None  # automatic: SDPA
    with pytest.raises(ValueError, match="decode_kernel needs a CPU, float32 or bfloat16 weights"):
        dk.select_kernel(True, fits=True)
    with pytest.raises(ValueError, match="decode_kernel needs"):
        dk.select_kernel(True, fits=False)
    assert dk.select_kernel(False, fits=True) is None
    with pytest.raises(ValueError, match=r"prefill_kernel needs.*pass prefill_kernel=None"):
        dk.select_kernel(True, fits=True, setting="prefill_kernel")


def test_the_kernel_is_chosen_only_where_it_fits():
    cpu = torch.device("cpu")
    assert dk.kernel_fits(cpu, torch.float32, 9, 3, 64)
    assert dk.kernel_fits(cpu, torch.bfloat16, 9, 3, 64)  # the trainer's rollout copy
    assert not dk.kernel_fits(cpu, torch.float16, 9, 3, 64)
    assert not dk.kernel_fits(cpu, torch.float32, 9, 3, 48)
    assert not dk.kernel_fits(cpu, torch.float32, 18, 1, 64)  # more query heads per key head than built
    assert not dk.kernel_fits(torch.device("cuda"), torch.float32, 9, 3, 64)


def test_the_build_is_named_by_its_source_flags_torch_and_cpu(monkeypatch, tmp_path):
    first = dk.build_digest()
    assert first == dk.build_digest()
    for index in range(len(dk.SOURCES)):  # either source
        other = tmp_path / dk.SOURCES[index].name
        other.write_text(dk.SOURCES[index].read_text() + "\n// another source\n")
        with monkeypatch.context() as patch:
            patch.setattr(dk, "SOURCES", tuple(other if i == index else s for i, s in enumerate(dk.SOURCES)))
            assert dk.build_digest() != first
    monkeypatch.setattr(dk, "_cpu_identity", lambda: "another CPU")
    assert dk.build_digest() not in (first,)


def prefill_reference(query, key, value, scale):
    """SDPA under the mask a prefill after a cached prefix gets: new token t sees columns up to
    L - S + t; GQA by repeating keys. Returns [1, S, heads, head_dim]."""
    tokens, columns = query.shape[2], key.shape[2]
    group = query.shape[1] // key.shape[1]
    mask = torch.ones(tokens, columns, dtype=torch.bool).tril(columns - tokens)
    k, v = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale).transpose(1, 2)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 1, 128)])
@pytest.mark.parametrize(("tokens", "columns"), [(1, 1), (1, 300), (5, 5), (7, 70), (64, 64), (113, 900), (130, 131)])
def test_the_prefill_kernel_computes_causal_attention_over_the_cached_prefix(kernel, heads, kv_heads, head_dim,
                                                                             tokens, columns):
    torch.manual_seed(tokens * 1000 + columns)
    # the keys as a prefill reads them: a view of a slab row with room beyond its columns
    slab = torch.randn(2, 1, kv_heads, columns + 40, head_dim) * 3
    key, value = slab[0, :, :, :columns], slab[1, :, :, :columns]
    query = torch.randn(1, heads, tokens, head_dim) * 3
    scale = head_dim ** -0.5
    got = dk.prefill_attention(kernel, query, key, value, scale)
    assert got.shape == (1, tokens, heads, head_dim)
    # as close to the float64 result as SDPA's float32 is (sums in another order, a polynomial exp)
    exact = prefill_reference(query.double(), key.double(), value.double(), scale)
    sdpa_error = (prefill_reference(query, key, value, scale).double() - exact).abs().max().item()
    assert (got.double() - exact).abs().max().item() <= 1.5 * sdpa_error + 1e-5
    slab[:, :, :, columns:] = float("nan")  # past the last column: never read
    assert torch.equal(dk.prefill_attention(kernel, query, key, value, scale), got)


def test_the_prefill_kernel_computes_bfloat16_attention_in_float32(kernel):
    torch.manual_seed(2)
    query = torch.randn(1, 9, 77, 64).bfloat16()
    key, value = torch.randn(2, 1, 3, 600, 64).bfloat16()
    got = dk.prefill_attention(kernel, query, key, value, 0.125)
    assert got.dtype == torch.bfloat16
    exact = prefill_reference(query.float(), key.float(), value.float(), 0.125)
    torch.testing.assert_close(got.float(), exact, rtol=0, atol=1e-2)  # one bfloat16 rounding of the output
    # ... and only that, but for outputs within a float32 rounding of a bfloat16 tie
    assert (got != exact.bfloat16()).float().mean() < 1e-3


def test_the_prefill_kernel_refuses_what_it_cannot_compute(kernel):
    query, key = torch.randn(1, 9, 4, 64), torch.randn(1, 3, 10, 64)
    with pytest.raises(RuntimeError, match="one request"):
        kernel.prefill_attention(query.repeat(2, 1, 1, 1), key.repeat(2, 1, 1, 1), key.repeat(2, 1, 1, 1), 1.0)
    with pytest.raises(RuntimeError, match="the new tokens are the last key columns"):
        kernel.prefill_attention(torch.randn(1, 9, 11, 64), key, key, 1.0)
    with pytest.raises(RuntimeError, match="multiple of key heads"):
        kernel.prefill_attention(torch.randn(1, 8, 4, 64), key, key, 1.0)
    with pytest.raises(RuntimeError, match="head size 48 is not built"):
        kernel.prefill_attention(torch.randn(1, 9, 4, 48), torch.randn(1, 3, 10, 48), torch.randn(1, 3, 10, 48), 1.0)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernel.prefill_attention(query, key.transpose(2, 3).contiguous().transpose(2, 3), key, 1.0)


def test_hf_policy_prefills_the_same_tokens_with_the_kernel(kernel, head64_model):
    from harnessrl.policy.base import GenerationRequest, SamplingParams
    from harnessrl.policy.hf import HFPolicy

    with_kernel = HFPolicy(head64_model, device="cpu", dtype="float32", decode_kernel=False)
    without = HFPolicy(head64_model, device="cpu", dtype="float32", decode_kernel=False, prefill_kernel=False)
    assert with_kernel._prefill_kernel is kernel and without._prefill_kernel is None
    shared = [(11 * j) % 400 + 5 for j in range(180)]  # a system prompt the prefix cache serves to later rows
    prompts = [shared + [(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate((3, 90, 40, 200))]
    prompts.append([9, 8, 7])
    requests = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=10)) for p in prompts]
    for policy in (with_kernel, without):
        policy.clear_prefix_cache()
    a, b = with_kernel.generate(requests), without.generate(requests)
    assert with_kernel.cache_stats.cached_tokens >= 3 * len(shared)  # prefills after a cached prefix ran
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4


def test_a_runs_attention_kernels_setting_reaches_its_rollouts_and_its_checkpoints(kernel, head64_model, tmp_path):
    import json

    import transformers

    from harnessrl.policy import make_training_policy
    from harnessrl.rl.checkpoint import load_checkpoint_policy, save_checkpoint
    from harnessrl.rl.config import TrainConfig

    assert TrainConfig().attention_kernels is None
    kept = make_training_policy(str(head64_model), "cpu", torch.float32, attention_kernels=False)
    used = make_training_policy(str(head64_model), "cpu", torch.float32)
    assert kept._decode_kernel is None and kept._prefill_kernel is None
    assert used._decode_kernel is kernel and used._prefill_kernel is kernel
    run = tmp_path / "run"
    model = transformers.AutoModelForCausalLM.from_pretrained(head64_model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(head64_model)
    save_checkpoint(run, 1, model, tokenizer, torch.optim.SGD(model.parameters(), lr=0.1), None, {})
    for recorded, expected in ((False, None), (None, kernel)):  # a run recorded before the field: its default
        (run / "config.json").write_text(json.dumps({"model": str(head64_model), "attention_kernels": recorded}))
        policy, _ = load_checkpoint_policy(run, device="cpu", dtype="float32")
        assert policy._decode_kernel is expected and policy._prefill_kernel is expected
