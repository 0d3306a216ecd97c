"""Data-parallel training over several processes: rank-sharded rollouts, FSDP2 or replicated weights, rank-0 output.

    torchrun --nproc-per-node N -m harnessrl.cli train ...     (or: harnessrl train --nproc N)

    every rank builds the same schedule, jobs and seeds
    rollouts   group g of a step runs on rank g mod N        -> all-gathered, in job order
    advantages computed on every rank from the whole step    (identical everywhere)
    update     each rank runs its share of a mini-batch's micro-batches; gradients are summed
               over the ranks (each micro-batch's loss is already normalised by the whole
               mini-batch) before clipping, then one optimizer step
    outputs    rank 0 alone writes metrics, rollouts, evaluations and checkpoints

Full fine-tuning shards the trained model with FSDP2 (``torch.distributed.fsdp.fully_shard``,
``shard_model``): every decoder layer is a group of its own, the rest (embeddings, final norm,
the tied LM head) the root group, each parameter a ``DTensor`` split by rows (``Shard(0)``)
over the ranks, and so are its gradient and AdamW state. A forward all-gathers a group's
parameters and frees them after; a backward reduce-scatters the gradients (summed, not
averaged). FSDP2's collectives pair up across ranks, so every rank makes the same forward and
backward calls: a mini-batch's micro-batches are dealt out in rounds of N, a rank with none
left in a round runs a stand-in at weight 0, and when one micro-batch of a round runs its
shared prefix once (two decoder calls) the others split their forward into two calls as well
(``local``). Forwards over the whole batch (old log-probabilities, PPO values) run on every
rank alike. Rollouts need full weights: the sampling copy
stays unsharded on every rank and takes the gathered weights after every optimizer step
(``sync_sampling_copy``).

LoRA keeps the model replicated (the all-reduce of plain DDP, done once per optimizer step
over the accumulated adapter gradients; ``reduce_gradients``): the adapters are small.

Checkpoints have one format whatever the world size, the ordinary full one of
``rl.checkpoint``, written by rank 0: a sharded run gathers the full model state dict and the
full optimizer state to rank 0's CPU first (``full_model_state``, ``full_optimizer_state``);
on resume every rank reads the full checkpoint and keeps its shard (``shard_optimizer_state``).
So a run resumes on any number of processes. The single-process path never touches this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from harnessrl.rl.batching import MIN_SHARED_PREFIX, UpdateSample, shared_prefix

Result = TypeVar("Result")


@dataclass
class LocalBatch:
    """A micro-batch this rank runs: ``weight`` 0 marks a stand-in (its loss counts nothing; it
    runs so that every rank makes the same collective calls), ``two_calls`` that the decoder
    runs in two calls even without a shared prefix (``rl.update.decoder_hidden``'s split)."""

    samples: list[UpdateSample]
    weight: float
    two_calls: bool


def trains(batch: list[UpdateSample]) -> bool:
    """Returns whether some sample of ``batch`` has a trained token (past its first)."""
    return any(any(s.loss_mask[1:]) for s in batch)


class DataParallel:
    """The rank, world size and collectives of one training process under torchrun."""

    def __init__(self, rank: int, world_size: int, local_rank: int = 0) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.sharded = False  # set by ``shard_model``: FSDP2 parameters, not replicas

    @classmethod
    def from_env(cls) -> DataParallel | None:
        """Returns the process's place in a torchrun job (its process group initialised: NCCL
        on CUDA, gloo elsewhere), or None outside one or with one process."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return None
        import torch.distributed as dist

        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(local_rank)  # "cuda" means this rank's GPU from here on
            dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        return cls(rank, world_size, local_rank)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    # -- rollouts ------------------------------------------------------------------------------
    def run_sharded(self, run: Callable[[list[Any]], tuple[list[Any], Any]], jobs: Sequence[Any],
                    owner: Sequence[int]) -> tuple[list[Any], Any]:
        """Runs on this rank the jobs whose ``owner`` (a rank per job) is this rank; returns every
        rank's trajectories in job order and the ranks' merged rollout stats."""
        import torch.distributed as dist

        from harnessrl.rollout.ray_engine import merge_stats

        if len(owner) != len(jobs):
            raise ValueError(f"run_sharded: {len(jobs)} jobs but {len(owner)} owners")
        mine = [index for index, rank in enumerate(owner) if rank == self.rank]
        trajectories, stats = run([jobs[index] for index in mine]) if mine else ([], None)
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, (mine, trajectories, stats))
        ordered: list[Any] = [None] * len(jobs)
        parts = []
        for indices, rank_trajectories, rank_stats in gathered:
            for index, trajectory in zip(indices, rank_trajectories, strict=True):
                ordered[index] = trajectory
            if rank_stats is not None:
                parts.append(rank_stats)
        wall = max((part.wall_time_s for part in parts), default=0.0)
        return ordered, merge_stats(parts, wall)

    def on_main(self, compute: Callable[[], Result]) -> Result:
        """Runs ``compute`` on rank 0 only and returns its result on every rank."""
        import torch.distributed as dist

        box = [compute() if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]

    # -- FSDP2 (full fine-tuning) --------------------------------------------------------------
    def shard_model(self, model: Any) -> Any:
        """Shards ``model`` (a transformers causal LM) with FSDP2 in place and returns it: each
        decoder layer a group, the root group the rest (the tied embeddings and LM head must
        share one group). ``update_step`` calls the decoder and the LM head one by one, so the
        model gets a method ``run_as_forward(function, *args)`` that runs ``function`` between
        the root group's forward hooks (``register_fsdp_forward_method``): its parameters are
        gathered around the call and again for the backward. Build the optimizer after this."""
        from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

        for layer in model.get_decoder().layers:
            fully_shard(layer)
        fully_shard(model, reshard_after_forward=True)  # no stale gathered copy across an optimizer step
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # Each micro-batch's loss is already divided by the whole mini-batch's count: sum
                # (plain SUM: gloo has no pre-multiplied sum).
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)

        def run_as_forward(function: Callable[..., Result], *args: Any) -> Result:
            return function(*args)

        model.run_as_forward = run_as_forward
        register_fsdp_forward_method(model, "run_as_forward")
        self.sharded = True
        return model

    @staticmethod
    def full_model_state(model: Any) -> dict[str, torch.Tensor]:
        """Returns the full (gathered) state dict of a sharded ``model`` on rank 0's CPU (other
        ranks get ``{}``), for a checkpoint; every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def sync_sampling_copy(self, model: Any, policy: Any) -> None:
        """Gives ``policy`` (a ``WeightSyncedPolicy`` with a model in this process) the full
        weights of the sharded ``model`` and has it drop its prefix KV; every rank must call
        it. One parameter is gathered at a time (an all-gather each) and copied in, cast to
        the copy's dtype, so a whole float32 model is never held twice."""
        from torch.distributed.tensor import DTensor

        copy = policy.local_model()
        if copy is None:
            raise ValueError("a sharded model syncs into a rollout model in this process; this policy has none")
        targets = dict(copy.named_parameters())  # a tied LM head is the embedding here as there
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                targets[name].copy_(parameter.full_tensor() if isinstance(parameter, DTensor) else parameter)
        policy.sync_weights(copy)  # its own model: nothing more to copy

    def full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Returns ``optimizer.state_dict()`` with every sharded tensor gathered to a full CPU
        tensor, on rank 0 (other ranks get ``{}``): the format one process saves and loads.
        Every rank must call it (one all-gather per sharded tensor)."""
        from torch.distributed.tensor import DTensor

        state = optimizer.state_dict()
        full: dict[int, dict[str, Any]] = {}
        for index, values in state["state"].items():
            full[index] = {}
            for key, value in values.items():
                if isinstance(value, DTensor):
                    value = value.full_tensor()
                full[index][key] = value.cpu() if isinstance(value, torch.Tensor) else value
        return {"state": full, "param_groups": state["param_groups"]} if self.is_main else {}

    @staticmethod
    def shard_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
        """Returns a full optimizer state (``full_optimizer_state``, or a one-process run's)
        with each tensor of a sharded parameter cut to this rank's shard, ready for
        ``optimizer.load_state_dict``; every rank holds the same full state (read from disk)."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        # state_dict() numbers the parameters in param_groups order, whatever the world size.
        params = [p for group in optimizer.param_groups for p in group["params"]]
        out: dict[int, dict[str, Any]] = {}
        for index, values in state["state"].items():
            param = params[int(index)]
            out[index] = {}
            for key, value in values.items():
                if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.shape:
                    value = distribute_tensor(value.to(param.device), param.device_mesh, param.placements,
                                              src_data_rank=None)  # each rank cuts its own shard
                out[index][key] = value
        return {"state": out, "param_groups": state["param_groups"]}

    # -- the update (the hook of ``rl.update.update_step``) --------------------------------------
    def local(self, micro_batches: list[list[UpdateSample]], share_prefix: bool) -> list[LocalBatch]:
        """Returns this rank's micro-batches of a mini-batch. Replicated: every
        ``world_size``-th one. Sharded: the micro-batches that train anything, in rounds of
        ``world_size`` (rank r runs the r-th of each round); a rank with none left in the last
        round runs a stand-in of the round's first at weight 0, and when one micro-batch of a
        round runs its shared prefix apart, every other one splits its forward in two calls
        too: every rank calls the model alike."""
        if not self.sharded:
            return [LocalBatch(b, 1.0, False) for b in micro_batches[self.rank :: self.world_size]]
        trained = [b for b in micro_batches if trains(b)]
        out = []
        for start in range(0, len(trained), self.world_size):
            members = trained[start : start + self.world_size]
            two_calls = share_prefix and any(shared_prefix(b) >= MIN_SHARED_PREFIX for b in members)
            if self.rank < len(members):
                out.append(LocalBatch(members[self.rank], 1.0, two_calls))
            else:
                out.append(LocalBatch(members[0], 0.0, two_calls))
        return out

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sums every replicated parameter's gradient over the ranks (a rank without
        micro-batches adds zeros), flattened into one buffer: one collective per optimizer
        step. Sharded parameters (``DTensor``) are skipped: FSDP2 reduce-scattered theirs."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        params = [p for p in params if not isinstance(p, DTensor)]
        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            n = grad.numel()
            param.grad = flat[offset : offset + n].view_as(param).to(param.dtype)
            offset += n

    def reduce_sums(self, values: dict[str, float]) -> dict[str, float]:
        """Returns each value summed over the ranks (keys missing on a rank count as 0)."""
        keys = sorted(set().union(*self._gather(sorted(values))))
        tensor = torch.tensor([float(values.get(key, 0.0)) for key in keys], dtype=torch.float64)
        import torch.distributed as dist

        dist.all_reduce(tensor)
        return dict(zip(keys, tensor.tolist(), strict=True))

    def reduce_extremes(self, values: dict[str, float]) -> dict[str, float]:
        """Returns ``*_max`` keys maximised and ``*_min`` keys minimised over the ranks."""
        out: dict[str, float] = {}
        for rank_values in self._gather(values):
            for key, value in rank_values.items():
                if key not in out:
                    out[key] = value
                else:
                    out[key] = max(out[key], value) if key.endswith("_max") else min(out[key], value)
        return out

    def _gather(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def close(self, *, ok: bool = True) -> None:
        """Ends the process group. After a run that ended well every rank first meets the others
        at a barrier, so that no rank tears down its gloo connections while a peer still reads
        from them (that peer then aborts: "terminate called without an active exception", seen
        in CI on 2026-12-04). After a failure (``ok=False``) it does not wait: the peer that
        failed may never arrive (torchtitan closes the same way)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        if ok:
            dist.barrier()
        dist.destroy_process_group()


def launch_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """Returns the torchrun command that runs ``harnessrl train`` with ``argv`` on ``nproc``
    processes of this machine (``argv`` without ``--nproc``)."""
    if nproc < 2:
        raise ValueError(f"--nproc must be at least 2 to launch torchrun, got {nproc}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "harnessrl.cli", "train", *argv]


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """Returns ``argv`` without its ``--nproc N`` / ``--nproc=N`` (the launched ranks must not relaunch)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Runs ``harnessrl train`` under torchrun on ``nproc`` local processes; returns its exit code."""
    return subprocess.call(launch_command(nproc, strip_nproc(argv)))
