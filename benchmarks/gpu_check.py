"""The figures of ``benchmarks/gpu_check.sh`` on a Qwen3-1.7B-shaped model with random weights.

Nothing is downloaded: the model is built from a ``Qwen3Config`` with Qwen3-1.7B's shape
(28 layers, hidden 2048, 16 query / 8 key-value heads of 128, MLP 6144, vocabulary 151,936,
tied embeddings) and randomly initialised; the tokenizer is the embedded model's (its ids lie
inside Qwen3's vocabulary). Random weights sample random tokens, which is all a speed figure
needs: every sequence runs its full ``--new-tokens`` (no stop token is set).

    rollout   tokens/s of ``HFPolicy.generate`` on ``--batch`` requests vs ``model.generate``
              on the same prompts (sampling, temperature 1), and of vLLM's engine on the same
              saved folder when ``vllm`` is importable (else a line says it was skipped)
    update    one ``rl.update.update_step`` (float32 master weights, bfloat16 autocast, AdamW)
              on ``--train-batch`` sequences of ``--train-len`` tokens: tokens/s and MFU =
              6 x parameters x tokens / time / the GPU's peak bfloat16 FLOP/s (``--peak-tflops``)

Each figure is one line ``gpu_check: NAME: VALUE``. ``--tiny`` shrinks the model and the
batches to run on a CPU in seconds (the syntax check of the test suite).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.embedded import embedded_model_dir
from harnessrl.policy.hf import HFPolicy
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.objectives import UpdateSettings
from harnessrl.rl.update import update_step

QWEN3_1_7B = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "tie_word_embeddings": True, "rope_theta": 1000000.0,
}
TINY = {**QWEN3_1_7B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
EMBEDDED_VOCAB = 49152  # the embedded tokenizer's ids: prompts stay decodable
# Dense bfloat16 peak of the GPUs this check is meant for (vendor data sheets, no sparsity).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def report(name: str, value: str) -> None:
    print(f"gpu_check: {name}: {value}", flush=True)


def build_model(shape: dict[str, Any], out_dir: Path, dtype: torch.dtype) -> Path:
    """Saves a randomly initialised Qwen3 model of ``shape`` with the embedded tokenizer; returns its folder."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**shape)).to(dtype)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(embedded_model_dir()).save_pretrained(out_dir)
    return out_dir


def prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (batch, length), generator=generator).tolist()


def rollout_figures(model_dir: Path, device: str, batch: int, prompt_len: int, new_tokens: int) -> None:
    policy = HFPolicy(str(model_dir), device=device, dtype="bfloat16" if device == "cuda" else "float32",
                      max_batch_size=batch, max_prefix_cache_tokens=0)
    vocab = min(EMBEDDED_VOCAB, policy.model.config.vocab_size)
    batch_prompts = prompts(batch, prompt_len, vocab)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)

    def ours() -> int:
        requests = [GenerationRequest(p, SamplingParams(**{**params.__dict__, "seed": i})) for i, p in enumerate(batch_prompts)]
        return sum(len(g.token_ids) for g in policy.generate(requests))

    def reference() -> int:
        ids = torch.tensor(batch_prompts, device=policy.model.device)
        with torch.no_grad():
            out = policy.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                        top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
        return int((out.shape[1] - ids.shape[1]) * out.shape[0])

    for name, run in (("HFPolicy.generate", ours), ("model.generate", reference)):
        run()  # warm-up: kernels, allocator
        synchronize(device)
        start = time.perf_counter()
        tokens = run()
        synchronize(device)
        seconds = time.perf_counter() - start
        report(f"rollout {name} batch {batch}", f"{tokens / seconds:.1f} tokens/s ({tokens} tokens in {seconds:.2f} s)")
    if device != "cuda" or importlib.util.find_spec("vllm") is None:
        report(f"rollout vLLM batch {batch}", "skipped (vllm is not installed here)" if device == "cuda"
               else "skipped (vLLM needs the GPU)")
        return
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling

    llm = LLM(model=str(model_dir), dtype="bfloat16", gpu_memory_utilization=0.5, enforce_eager=False)
    sampling = VllmSampling(temperature=1.0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True)
    inputs = [{"prompt_token_ids": p} for p in batch_prompts]
    llm.generate(inputs, sampling, use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(inputs, sampling, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    report(f"rollout vLLM batch {batch}", f"{tokens / seconds:.1f} tokens/s ({tokens} tokens in {seconds:.2f} s)")


def update_figures(model_dir: Path, device: str, batch: int, length: int, peak_tflops: float | None) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    vocab = min(EMBEDDED_VOCAB, model.config.vocab_size)
    prompt = length // 2
    samples = [
        UpdateSample(ids, [0] * prompt + [1] * (length - prompt), [-1.0] * length, 1.0 if i % 2 else -1.0)
        for i, ids in enumerate(prompts(batch, length, vocab, seed=1))
    ]
    autocast = torch.bfloat16 if device == "cuda" else torch.float32

    def step() -> None:
        update_step(model, optimizer, samples, 0, UpdateSettings(
            micro_batch_tokens=max(length, 8192), autocast_dtype=autocast, share_prefix=False))

    step()  # warm-up: optimizer state, kernels
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens = batch * length
    parameters = sum(p.numel() for p in model.parameters())
    report("update step", f"{tokens / seconds:.1f} tokens/s ({tokens} tokens, {parameters / 1e9:.2f}B parameters, {seconds:.2f} s)")
    if peak_tflops is None:
        report("update MFU", "n/a (unknown GPU peak: pass --peak-tflops)")
        return
    achieved = 6.0 * parameters * tokens / seconds / 1e12
    report("update MFU", f"{100 * achieved / peak_tflops:.1f}% ({achieved:.1f} of {peak_tflops:.0f} TFLOP/s, 6N per token)")


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def gpu_peak_tflops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and small batches, on CPU")
    parser.add_argument("--batch", type=int, default=64, help="rollout requests per batch")
    parser.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per rollout request")
    parser.add_argument("--new-tokens", type=int, default=256, help="sampled tokens per rollout request")
    parser.add_argument("--train-batch", type=int, default=16, help="sequences of the update step")
    parser.add_argument("--train-len", type=int, default=2048, help="tokens per update sequence")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    args = parser.parse_args(argv)
    if args.tiny:
        shape, device = TINY, "cpu"
        args.batch, args.prompt_len, args.new_tokens, args.train_batch, args.train_len = 4, 16, 8, 2, 32
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA GPU here; --tiny runs the check on the CPU")
        shape, device = QWEN3_1_7B, "cuda"
    with tempfile.TemporaryDirectory(prefix="harnessrl-gpu-check-") as tmp:
        model_dir = build_model(shape, Path(tmp) / "qwen3-1.7b-shape", torch.bfloat16 if device == "cuda" else torch.float32)
        report("model", f"Qwen3 {'tiny' if args.tiny else '1.7B'}-shaped, random weights, on {device}"
               + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
        rollout_figures(model_dir, device, args.batch, args.prompt_len, args.new_tokens)
        if device == "cuda":
            torch.cuda.empty_cache()
        update_figures(model_dir, device, args.train_batch, args.train_len,
                       args.peak_tflops or (gpu_peak_tflops() if device == "cuda" else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
