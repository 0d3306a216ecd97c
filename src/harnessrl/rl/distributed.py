"""Data-parallel training over several processes: rank-sharded rollouts, summed gradients, rank-0 output.

    torchrun --nproc-per-node N -m harnessrl.cli train ...     (or: harnessrl train --nproc N)

    every rank builds the same schedule, jobs and seeds
    rollouts   group g of a step runs on rank g mod N        -> all-gathered, in job order
    advantages computed on every rank from the whole step    (identical everywhere)
    update     micro-batch m of a mini-batch runs on rank m mod N; gradients are all-reduced
               (summed: each micro-batch's loss is already normalised by the whole mini-batch)
               before clipping, so every rank takes the same optimizer step
    outputs    rank 0 alone writes metrics, rollouts, evaluations and checkpoints

The model is replicated (the all-reduce of plain DDP, done once per optimizer step over the
accumulated gradients): for LoRA the adapters, for full fine-tuning every parameter. A
checkpoint is therefore the ordinary full state dict of ``rl.checkpoint`` and resumes on any
number of processes. The single-process path never touches this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

Result = TypeVar("Result")


class DataParallel:
    """The rank, world size and collectives of one training process under torchrun."""

    def __init__(self, rank: int, world_size: int, local_rank: int = 0) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank

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

    # -- the update (the hook of ``rl.update.update_step``) --------------------------------------
    def local(self, micro_batches: list[Any]) -> list[Any]:
        """Returns this rank's micro-batches of a mini-batch: every ``world_size``-th one."""
        return micro_batches[self.rank :: self.world_size]

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sums every parameter's gradient over the ranks (a rank without micro-batches adds
        zeros), flattened into one buffer: one collective per optimizer step."""
        import torch.distributed as dist

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

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
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
