"""One GRPO optimizer step on the embedded model: ``update_step`` against TRL's ``GRPOTrainer``.

Both sides train the same weights (the embedded model's folder, float32, CPU) on the same
batch: ``--prompts`` groups x ``--group-size`` generations, each sequence ``--prompt-len``
prompt tokens + ``--completion-len`` completion tokens (random ids, seeded), group-normalized
advantages, clip ranges 0.2 / 0.28, token-mean aggregation (TRL's ``loss_type="dapo"``), no KL,
AdamW (lr 1e-6, no weight decay), gradient clipping at 1.0, no gradient checkpointing.

Timed on our side: ``harnessrl.rl.update.update_step`` (collate, forward, loss, backward,
clip, AdamW step, zero_grad), by default with shared-prefix micro-batches (each group's common
prompt runs once, its keys and values broadcast to the group's rows; same loss and gradients);
``--no-share-prefix`` times the plain padded batch that TRL also runs. Timed on TRL's side: what ``Trainer``'s inner loop runs for one
optimizer step with ``gradient_accumulation_steps=1`` -- ``GRPOTrainer.training_step`` (input
buffering, forward through TRL's fused log-prob head, loss and metrics, backward), then
``_clip_grad_norm``, ``optimizer.step``, ``lr_scheduler.step`` and ``model.zero_grad``.
Generation and rewards are not timed: ``_generate_and_score_completions`` is replaced by a
function that returns the prepared batch, in the format TRL's own returns.

One warm-up step each, then ``--repeats`` steps each, interleaved (ours, TRL, ours, ...). The
last line is ``ratio: X`` = TRL's median step time / ours (above 1: ours is faster).
TRL is needed only here; run from an environment that has both TRL and harnessrl:

    python benchmarks/bench_grpo_step.py [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from harnessrl.policy.embedded import embedded_model_dir
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.objectives import UpdateSettings
from harnessrl.rl.update import update_step

LEARNING_RATE = 1e-6
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
MAX_GRAD_NORM = 1.0


def make_batch(
    prompts: int, group_size: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (prompt ids [N, P], completion ids [N, C], advantages [N]) for N = prompts x
    group_size sequences: random token ids, advantages normalized within each group."""
    generator = torch.Generator().manual_seed(seed)
    n = prompts * group_size
    prompt_ids = torch.randint(
        0, vocab, (prompts, prompt_len), generator=generator
    ).repeat_interleave(group_size, 0)
    completion_ids = torch.randint(0, vocab, (n, completion_len), generator=generator)
    rewards = torch.rand((prompts, group_size), generator=generator)
    advantages = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    return prompt_ids, completion_ids, advantages.reshape(n)


@torch.no_grad()
def completion_logprobs(model: Any, input_ids: torch.Tensor, completion_len: int) -> torch.Tensor:
    """Returns the model's log-probabilities of the last ``completion_len`` tokens of each row
    (stand-ins for the sampler's log-probs that our samples carry)."""
    model.eval()
    logits = model(input_ids=input_ids).logits[:, -completion_len - 1 : -1].float()
    targets = input_ids[:, -completion_len:]
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def ours_step_fn(
    model_dir: str, input_ids: torch.Tensor, advantages: torch.Tensor, completion_len: int,
    share_prefix: bool = True,
) -> Callable[[], None]:
    """Returns a function that runs one ``update_step`` on the batch with its own model copy."""
    from harnessrl.policy.hf import HFPolicy

    policy = HFPolicy(model_dir, device="cpu", dtype="float32")
    model = policy.model
    rollout = completion_logprobs(model, input_ids, completion_len)
    prompt_len = input_ids.shape[1] - completion_len
    samples = [
        UpdateSample(
            input_ids=row.tolist(),
            loss_mask=[0] * prompt_len + [1] * completion_len,
            rollout_logprobs=[0.0] * prompt_len + logps.tolist(),
            advantage=float(adv),
        )
        for row, logps, adv in zip(input_ids, rollout, advantages, strict=True)
    ]
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE, weight_decay=0.0
    )
    pad_id = policy.tokenizer.pad_token_id

    def step() -> None:
        update_step(
            model,
            optimizer,
            samples,
            pad_id,
            UpdateSettings(objective="pg", temperature=1.0, clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                           aggregation="token_mean", max_grad_norm=MAX_GRAD_NORM, share_prefix=share_prefix),
        )

    return step


def trl_step_fn(
    model_dir: str,
    prompt_ids: torch.Tensor,
    completion_ids: torch.Tensor,
    advantages: torch.Tensor,
    group_size: int,
) -> Callable[[], None]:
    """Returns a function that runs one optimizer step of TRL's ``GRPOTrainer`` on the batch
    (the inner loop of ``Trainer`` for one step, generation replaced by the prepared batch)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    n, completion_len = completion_ids.shape

    def zero_reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    config = GRPOConfig(
        output_dir="/tmp/bench-grpo-step-trl",
        per_device_train_batch_size=n,
        num_generations=group_size,
        max_completion_length=completion_len,
        gradient_accumulation_steps=1,
        num_iterations=1,
        beta=0.0,
        loss_type="dapo",
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        temperature=1.0,
        learning_rate=LEARNING_RATE,
        weight_decay=0.0,
        max_grad_norm=MAX_GRAD_NORM,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        model_init_kwargs={"dtype": torch.float32},
    )
    dataset = Dataset.from_dict({"prompt": ["unused"] * n})
    trainer = GRPOTrainer(
        model=model_dir, reward_funcs=zero_reward, args=config, train_dataset=dataset
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() before its loop
    model = trainer.model
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones_like(completion_ids),
        "advantages": advantages.clone(),
        "num_items_in_batch": torch.tensor(float(completion_ids.numel())),
    }
    trainer._generate_and_score_completions = lambda generation_batch: dict(batch)  # type: ignore[method-assign]

    def step() -> None:
        trainer.training_step(model, {}, None)
        trainer._clip_grad_norm(model)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts (groups) per step")
    parser.add_argument("--group-size", type=int, default=4, help="generations per prompt")
    parser.add_argument("--prompt-len", type=int, default=384)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per side")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument(
        "--no-share-prefix", action="store_true",
        help="ours without running each group's common prompt once (the plain padded batch, as TRL does)",
    )
    args = parser.parse_args()

    import transformers
    import trl

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_dir = str(embedded_model_dir())
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
    prompt_ids, completion_ids, advantages = make_batch(
        args.prompts, args.group_size, args.prompt_len, args.completion_len, vocab
    )
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    sides: dict[str, Callable[[], None]] = {
        "ours": ours_step_fn(model_dir, input_ids, advantages, args.completion_len, not args.no_share_prefix),
        "trl": trl_step_fn(model_dir, prompt_ids, completion_ids, advantages, args.group_size),
    }
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
        f"threads {torch.get_num_threads()}; batch {input_ids.shape[0]} sequences "
        f"({args.prompts} prompts x {args.group_size}) of {args.prompt_len} + {args.completion_len} tokens; "
        f"ours {'without' if args.no_share_prefix else 'with'} shared-prefix micro-batches"
    )
    times: dict[str, list[float]] = {name: [] for name in sides}
    for name, step in sides.items():  # warm-up
        started = time.perf_counter()
        step()
        print(f"warm-up {name}: {time.perf_counter() - started:.2f} s", flush=True)
    for repeat in range(args.repeats):
        for name, step in sides.items():
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
            print(f"step {repeat + 1} {name}: {times[name][-1]:.2f} s", flush=True)
    ours, theirs = statistics.median(times["ours"]), statistics.median(times["trl"])
    print(f"median step: ours {ours:.2f} s, TRL {theirs:.2f} s")
    print(f"ratio: {theirs / ours:.2f}")


if __name__ == "__main__":
    main()
