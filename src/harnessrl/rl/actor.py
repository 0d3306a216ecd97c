"""The actor: the model a run trains and everything that changes it. It owns the rollout policy
and the trained weights (precision, LoRA, FSDP2), the KL reference, the PPO value head, the
optimizer and its schedule, the weight sync into the rollout policy after every optimizer
step, and the model half of a checkpoint; it is the one place in `rl/` that asks `policy/`
for a model.

Precision: full fine-tuning keeps float32 master weights (the optimizer's) and samples from a
copy in the rollout dtype, synced after every optimizer step; the update's forward and backward
run under autocast in that dtype (bfloat16 master weights would round away updates of lr
~1e-6). LoRA trains float32 adapters on the shared base model. A float32 (or LoRA) rollout
model in this process is trained in place, no copy; a sharded model cannot sample, so FSDP2
always trains a copy of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harnessrl.memory import release_freed_memory
from harnessrl.rl.batching import UpdateSample
from harnessrl.rl.checkpoint import load_training_state, save_checkpoint
from harnessrl.rl.config import TrainConfig
from harnessrl.rl.distributed import DataParallel
from harnessrl.rl.forward import enable_activation_checkpointing
from harnessrl.rl.objectives import UpdateSettings
from harnessrl.rl.ppo import ppo_samples
from harnessrl.rl.schedules import lr_lambda
from harnessrl.rl.update import update_step
from harnessrl.trajectory import Trajectory


class Actor:
    """The trained model of one run (see the module docstring). ``checkpoint`` is the folder
    to resume from (None: a new run); ``weights_dir`` is where a served policy's synced
    weights go."""

    def __init__(
        self, cfg: TrainConfig, checkpoint: Path | None, parallel: DataParallel | None, weights_dir: Path,
        log: Callable[[str], None],
    ) -> None:
        from harnessrl.policy import make_training_policy
        from harnessrl.policy.device import resolve_device, resolve_dtype, resolve_rollout_dtype
        from harnessrl.policy.embedded import resolve_model_path
        from harnessrl.policy.hf import HFPolicy

        self.cfg, self.parallel, self.checkpoint_dir = cfg, parallel, checkpoint
        # Several processes shard full fine-tuning with FSDP2 and replicate LoRA (rl.distributed).
        shard = parallel is not None and not cfg.lora_rank
        if shard and cfg.policy_server is not None:
            raise ValueError("full fine-tuning on several processes shards the model (FSDP2) and rolls out in "
                             "process: drop policy_server, train LoRA (lora_rank > 0), or run one process")
        # A LoRA checkpoint holds only the adapter: the base model comes from the config.
        model_source = str(checkpoint / "model") if (checkpoint is not None and not cfg.lora_rank) else cfg.model
        device = resolve_device(cfg.device)
        rollout_dtype = resolve_rollout_dtype(cfg.dtype, device)
        self.policy = make_training_policy(model_source, cfg.device, rollout_dtype, server=cfg.policy_server,
                                           server_model=cfg.policy_server_model, weights_dir=weights_dir,
                                           cascade_attention=cfg.cascade_attention,
                                           attention_kernels=cfg.attention_kernels)
        self.model = self.policy.local_model()
        self.autocast_dtype: torch.dtype | None = None  # update_step's default: bf16 on CUDA only
        # The rollout copy is the trained model itself only for full fine-tuning in float32 on one
        # process. LoRA trains a model of its own (its frozen base in the run's dtype: float32 on a
        # CPU, bfloat16 on CUDA) and the rollout copy takes its adapters merged after every step
        # (policy.merged), in the same precision as full fine-tuning's (before, LoRA sampled
        # through its unmerged adapters in float32, and an RL arm in another precision than its control).
        if self.model is None or cfg.lora_rank or rollout_dtype != torch.float32 or shard:
            from transformers import AutoModelForCausalLM

            master_dtype = resolve_dtype(cfg.dtype, device) if cfg.lora_rank else torch.float32
            self.model = AutoModelForCausalLM.from_pretrained(
                resolve_model_path(model_source), dtype=master_dtype, local_files_only=True
            ).to(device)
            if rollout_dtype != torch.float32 and master_dtype == torch.float32:
                self.autocast_dtype = rollout_dtype
        self.precision = {
            "rollout": str(rollout_dtype).removeprefix("torch."),
            "master": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "autocast": str(self.autocast_dtype or (torch.bfloat16 if device.type == "cuda" else "off")).removeprefix("torch."),
        }
        log(f"precision: rollout {self.precision['rollout']}, master weights {self.precision['master']}, "
            f"update autocast {self.precision['autocast']}")
        if cfg.lora_rank:
            self.model = self._wrap_lora(self.model, checkpoint / "model" if checkpoint is not None else None)
            self.policy.sync_weights(self.model)  # the adapters merged into the rollout copy (a resume's are not 0)
        elif cfg.policy_server is not None:
            self.policy.sync_weights(self.model)  # the server samples from the weights trained here (or resumed)
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        if parallel is not None:
            if shard:
                parallel.shard_model(self.model)  # before the optimizer: it steps the shards
            log(f"data parallel: {parallel.world_size} processes, "
                f"{'model sharded by FSDP2' if shard else 'LoRA adapters replicated'}")
        # The KL reference is the model the run started from, also after a resume.
        self.ref_model: torch.nn.Module | None = None
        if cfg.kl_coef > 0:
            self.ref_model = HFPolicy(cfg.model, device=cfg.device, dtype=cfg.dtype).model.eval()
            for parameter in self.ref_model.parameters():
                parameter.requires_grad_(False)
        self.value_head = self._value_head(checkpoint) if cfg.algorithm == "ppo" else None
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            trainable += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg, cfg.steps))

    @property
    def pad_id(self) -> int:
        return self.policy.tokenizer.pad_token_id

    def _value_head(self, checkpoint: Path | None) -> torch.nn.Module:
        """The critic shares the policy's trunk: a linear value head on the last hidden state."""
        hidden = int(self.model.config.hidden_size)
        head = torch.nn.Linear(hidden, 1).to(next(self.model.parameters()).device)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        if checkpoint is not None and (checkpoint / "value_head.pt").exists():
            head.load_state_dict(torch.load(checkpoint / "value_head.pt", map_location="cpu"))
        return head

    def _wrap_lora(self, model: Any, adapter_dir: Path | None) -> Any:
        try:
            from peft import LoraConfig, PeftModel, get_peft_model
        except ImportError:
            raise ValueError("lora_rank > 0 needs peft: pip install 'harnessrl[lora]'") from None
        if adapter_dir is not None:
            return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
        config = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, target_modules="all-linear")
        return get_peft_model(model, config)

    def load_training_state(self) -> dict[str, Any]:
        """Restores the optimizer, the schedule and the random states from the checkpoint this
        actor was built from; returns the trainer's saved state."""
        assert self.checkpoint_dir is not None
        sharded = self.parallel is not None and self.parallel.sharded
        shard_state = (lambda full: self.parallel.shard_optimizer_state(self.optimizer, full)) if sharded else None
        return load_training_state(self.checkpoint_dir, self.optimizer, self.scheduler, shard_state)

    def update(self, samples: list[UpdateSample], seed: int) -> dict[str, float]:
        """One update of the run's algorithm on ``samples`` (``update_step``), then the weight
        sync; ``seed`` orders the mini-batches (a pure function of the step: resumable). The
        step's rollouts are over, so where they ran in this process their prefix cache and packed
        layers, which the sync would drop after the update, go before it: the update's
        activations do not sit on top of them."""
        if self.cfg.policy_server is None:
            self.release_rollout_memory()
        metrics = update_step(
            self.model, self.optimizer, samples, self.pad_id, UpdateSettings.from_config(self.cfg, self.autocast_dtype),
            ref_model=self.ref_model, value_head=self.value_head, scheduler=self.scheduler, seed=seed,
            data_parallel=self.parallel,
        )
        self.sync_rollout_weights()
        return metrics

    def sft_step(self, samples: list[UpdateSample], optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, float]:
        """One supervised step (the warm start's) with its own optimizer, then the weight sync."""
        cfg = self.cfg
        metrics = update_step(
            self.model, optimizer, samples, self.pad_id, UpdateSettings(
                objective="nll", max_grad_norm=cfg.max_grad_norm, micro_batch_tokens=cfg.micro_batch_tokens,
                lm_head_chunk_tokens=cfg.lm_head_chunk_tokens, causal_mask_only=cfg.causal_mask_only,
                autocast_dtype=self.autocast_dtype),
            scheduler=scheduler, data_parallel=self.parallel,
        )
        self.sync_rollout_weights()
        return metrics

    def ppo_samples(self, trajectories: list[Trajectory]) -> list[UpdateSample]:
        """Returns update samples with per-turn GAE advantages from the value head (``rl.ppo``)."""
        assert self.value_head is not None
        cfg = self.cfg
        return ppo_samples(trajectories, self.model, self.value_head, self.pad_id,
                           micro_batch_tokens=cfg.micro_batch_tokens, gamma=cfg.gamma,
                           gae_lambda=cfg.gae_lambda, autocast_dtype=self.autocast_dtype)

    def sync_rollout_weights(self) -> None:
        """Gives the rollout policy the trained weights (copied in when the master weights are a
        model of their own; gathered when sharded) and drops its prefix KV cache: call it after
        every optimizer step."""
        if self.parallel is not None and self.parallel.sharded:
            self.parallel.sync_sampling_copy(self.model, self.policy)
        else:
            self.policy.sync_weights(self.model)
        release_freed_memory()  # the step's activations, kept by the C allocator otherwise

    def release_rollout_memory(self) -> None:
        """Drops the rollout policy's prefix cache (and its packed layers) and hands freed memory
        back to the system: call it after an evaluation, whose prompts the training does not
        share, and before an update, after which the weight sync would drop them anyway."""
        self.policy.clear_prefix_cache()
        release_freed_memory()

    def release_training_state(self) -> None:
        """Drops what only an update needs: the optimizer's moments, the KL reference, the value
        head and, where the master weights are a model of their own (LoRA, another rollout
        dtype, FSDP2), that model; the rollout policy stays. Call it when the run has no step,
        checkpoint or save left and only its policy is used (an experiment's evaluation of a
        finished arm: the control's master copy is 0.5 GB of float32 the evaluation never reads);
        the actor cannot update or save after it (its optimizer and schedule are gone too: the
        optimizer's parameter groups would keep the master weights alive)."""
        self.optimizer = self.scheduler = None
        self.ref_model = self.value_head = None
        if self.model is not self.policy.local_model():
            self.model = None
        release_freed_memory()

    def save(self, run_dir: Path, step: int, state: dict[str, Any], main: bool) -> None:
        """Writes the checkpoint of ``step`` (one full checkpoint whatever the world size: every
        rank gathers a sharded model, rank 0 writes; it resumes on any)."""
        tokenizer = getattr(self.policy, "hf_tokenizer", None)
        extra = {"value_head": self.value_head} if self.value_head is not None else None
        model_state = optimizer_state = None
        if self.parallel is not None and self.parallel.sharded:
            model_state = self.parallel.full_model_state(self.model)
            optimizer_state = self.parallel.full_optimizer_state(self.optimizer)
        if main:
            save_checkpoint(run_dir, step, self.model, tokenizer, self.optimizer, self.scheduler, state,
                            keep=self.cfg.keep_checkpoints, extra_modules=extra,
                            model_state=model_state, optimizer_state=optimizer_state)
