"""The Ray rollout backend: rollout jobs spread over Ray actors, each running a ``RolloutEngine``.

``RayRolloutEngine`` has the API of ``rollout.RolloutEngine`` (``run(jobs) -> (trajectories,
stats)``) but runs the episodes in ``num_workers`` Ray actors. Each actor builds its own
policy once, from a picklable ``policy_factory`` (a model is loaded where it runs, never
shipped per call), and runs an in-process ``RolloutEngine`` over the chunks of jobs it is
given. Chunks go out as a work queue: every actor starts with one chunk and pulls the next
when it returns one, so a slow chunk holds back only its own actor. Trajectories come back
in job order, errored episodes included, and the workers' stats are merged.

Jobs travel to the actors by pickle: a ``Task`` (a dataclass whose setup builders are
module-level functions or partials by contract) and a ``Harness`` (plain components) both
pickle as they are. Ray is an optional extra: ``pip install 'harnessrl[ray]'``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from harnessrl.policy.base import Policy
from harnessrl.rollout.engine import (
    EngineOptions,
    RolloutEngine,
    RolloutJob,
    RolloutStats,
    _progress_bar,
)
from harnessrl.trajectory import Trajectory

PolicyFactory = Callable[[], Policy]

# Stats that add up across workers; wall time and mean batch size are merged separately.
_ADDITIVE_STATS = (
    "episodes",
    "errored",
    "passed",
    "generation_calls",
    "tokens_generated",
    "generation_time_s",
    "sandbox_time_s",
    "harness_time_s",
)


def _import_ray() -> Any:
    """Returns the ``ray`` module, or raises an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "RayRolloutEngine needs Ray, which is not installed; install it with "
            "pip install 'harnessrl[ray]'"
        ) from exc
    return ray


class _RolloutWorker:
    """A Ray actor's state: one policy built in the actor and the engine settings to run chunks."""

    def __init__(self, policy_factory: PolicyFactory, options: EngineOptions) -> None:
        self.policy = policy_factory()
        self.options = options

    def ready(self) -> str:
        """Returns the policy's name once the actor has built it (raises if building failed)."""
        return self.policy.name

    def run(
        self, first_index: int, jobs: list[RolloutJob]
    ) -> tuple[int, list[Trajectory], RolloutStats]:
        """Runs one chunk; returns its first job index, its trajectories in order, and stats."""
        trajectories, stats = RolloutEngine.from_options(self.policy, self.options).run(jobs)
        return first_index, trajectories, stats

    def close(self) -> None:
        """Releases the policy's resources."""
        self.policy.close()


def merge_stats(parts: Sequence[RolloutStats], wall_time_s: float) -> RolloutStats:
    """Returns the stats of several engine runs as one run that took ``wall_time_s``.

    Counts and per-part times add up (so ``generation_time_s`` is total worker time and may
    exceed the wall time); ``mean_batch_size`` is weighted by each part's generation calls.
    """
    merged = RolloutStats(wall_time_s=wall_time_s)
    for part in parts:
        for name in _ADDITIVE_STATS:
            setattr(merged, name, getattr(merged, name) + getattr(part, name))
    if merged.generation_calls:
        merged.mean_batch_size = (
            sum(p.mean_batch_size * p.generation_calls for p in parts) / merged.generation_calls
        )
    return merged


class RayRolloutEngine:
    """Runs rollout jobs over Ray actors that each hold a policy; same ``run`` as ``RolloutEngine``.

    ``policy_factory`` builds the policy inside each actor (e.g. ``functools.partial(HFPolicy,
    model_dir)``). The other keyword arguments of ``EngineOptions`` (``max_concurrent``,
    ``env_workers``, ``sampling``, ``backend``, ``sandbox_limits``, ``batch_wait_s``) configure
    the engine in each actor, as for ``RolloutEngine``.
    ``chunk_size`` is how many jobs an actor takes at a time (default: ``max_concurrent``, or
    an even split when there are fewer jobs than that per worker). ``actor_options`` are Ray
    resource options per actor (default ``{"num_cpus": 1}``; e.g. ``{"num_gpus": 1}`` for a GPU
    model); Ray sets an actor's ``OMP_NUM_THREADS`` (torch's thread count) to its ``num_cpus``.
    With ``ray_address=None`` and no Ray running, a local Ray instance is started with
    ``num_cpus`` CPUs (default: enough for the actors) and shut down again by ``close``;
    otherwise the engine joins the running instance or the cluster at ``ray_address``.
    Actors are created on the first ``run`` and reused by later runs until ``close``.
    ``on_trajectory(index, trajectory)`` is called in the driver as each chunk comes back.
    ``max_chunk_retries``: a chunk whose worker died (its process or node lost: a
    ``RayActorError``) runs again on a surviving worker, up to this many times, before its
    episodes become error trajectories; ``rerun_jobs`` counts the jobs re-run so. A chunk that
    kills every worker it reaches (a crashing task) is bounded by the same limit. An error
    inside an episode is not retried: the episode already records it.
    """

    def __init__(
        self,
        policy_factory: PolicyFactory,
        num_workers: int = 2,
        *,
        progress: bool = False,
        on_trajectory: Callable[[int, Trajectory], None] | None = None,
        chunk_size: int | None = None,
        ray_address: str | None = None,
        num_cpus: int | None = None,
        actor_options: Mapping[str, Any] | None = None,
        max_chunk_retries: int = 2,
        **engine_options: Any,
    ) -> None:
        try:
            options = EngineOptions(**engine_options)
        except TypeError:
            known = ", ".join(f.name for f in fields(EngineOptions))
            raise TypeError(f"RayRolloutEngine: unknown options {sorted(engine_options)}; the engine's are {known}") from None
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if max_chunk_retries < 0:
            raise ValueError(f"max_chunk_retries must be >= 0, got {max_chunk_retries}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
        if not callable(policy_factory):
            raise TypeError(
                "policy_factory must be a picklable callable that builds the policy in each worker, "
                f"e.g. functools.partial(OraclePolicy); got {type(policy_factory).__name__}"
            )
        self.ray = _import_ray()
        self.policy_factory = policy_factory
        self.num_workers = num_workers
        self.options = options
        self.chunk_size = chunk_size
        self.progress = progress
        self.on_trajectory = on_trajectory
        self.ray_address = ray_address
        self.num_cpus = num_cpus
        self.actor_options = dict(actor_options) if actor_options is not None else {"num_cpus": 1}
        self.max_chunk_retries = max_chunk_retries
        self.rerun_jobs = 0
        self._actors: list[Any] = []
        self._started_ray = False

    # -- workers ---------------------------------------------------------------------------
    def _start(self) -> None:
        """Connects to (or starts) Ray and creates the actors; raises if a policy cannot be built."""
        ray = self.ray
        if not ray.is_initialized():
            if self.ray_address is None:
                cpus = self.num_cpus
                if cpus is None:
                    per_actor = float(self.actor_options.get("num_cpus", 1))
                    cpus = max(os.cpu_count() or 1, math.ceil(self.num_workers * per_actor))
                ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.ray_address, log_to_driver=False)
            self._started_ray = True
        actor_class = ray.remote(**self.actor_options)(_RolloutWorker)
        self._actors = [
            actor_class.remote(self.policy_factory, self.options)
            for _ in range(self.num_workers)
        ]
        try:
            ray.get([actor.ready.remote() for actor in self._actors])
        except Exception as exc:
            self.close()
            raise RuntimeError(f"a Ray rollout worker could not build its policy: {exc}") from exc

    def close(self) -> None:
        """Ends the actors (closing their policies) and the local Ray instance if this engine started it."""
        ray = self.ray
        actors, self._actors = self._actors, []
        if actors:
            with contextlib.suppress(Exception):  # a dead actor has nothing left to close
                ray.get([actor.close.remote() for actor in actors], timeout=30)
            for actor in actors:
                ray.kill(actor)
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> RayRolloutEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the work queue --------------------------------------------------------------------
    def _chunk_size(self, n_jobs: int) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        # One chunk fills an actor's engine (max_concurrent episodes batched per policy call);
        # smaller chunks would shrink the batches, larger ones would balance the load worse.
        # A run too short to give every worker that much is split evenly instead.
        return max(1, min(self.options.max_concurrent, math.ceil(n_jobs / self.num_workers)))

    def run(self, jobs: Iterable[RolloutJob]) -> tuple[list[Trajectory], RolloutStats]:
        """Runs every job on the actors; returns trajectories in job order (errored ones included)
        and the workers' merged stats. Raises TypeError, before any episode runs, for a job that
        cannot be pickled."""
        jobs = list(jobs)
        if not jobs:
            return [], RolloutStats()
        if not self._actors:
            self._start()
        ray = self.ray
        start = time.perf_counter()
        size = self._chunk_size(len(jobs))
        queue = [
            (first, self._put(jobs, first, first + size)) for first in range(0, len(jobs), size)
        ]
        queue.reverse()  # pop() from the end hands out chunks in job order
        results: list[Trajectory | None] = [None] * len(jobs)
        parts: list[RolloutStats] = []
        bar = _progress_bar(len(jobs)) if self.progress else None
        # ref -> (actor, first index, chunk length, the chunk in the object store)
        in_flight: dict[Any, tuple[Any, int, int, Any]] = {}
        idle = list(reversed(self._actors))
        attempts = dict.fromkeys(range(0, len(jobs), size), 0)

        def dispatch() -> None:
            while idle and queue:
                actor = idle.pop()
                first, chunk_ref = queue.pop()
                length = min(size, len(jobs) - first)
                in_flight[actor.run.remote(first, chunk_ref)] = (actor, first, length, chunk_ref)

        def record(first: int, trajectories: list[Trajectory], stats: RolloutStats) -> None:
            parts.append(stats)
            for offset, trajectory in enumerate(trajectories):
                results[first + offset] = trajectory
                if self.on_trajectory is not None:
                    self.on_trajectory(first + offset, trajectory)
            if bar is not None:
                bar.update(len(trajectories))

        def record_failed(first: int, length: int, exc: BaseException) -> None:
            failed = [self._error_trajectory(job, exc) for job in jobs[first : first + length]]
            record(first, failed, RolloutStats(episodes=length, errored=length))

        dispatch()
        while in_flight:
            done, _ = ray.wait(list(in_flight), num_returns=1)
            actor, first, length, chunk_ref = in_flight.pop(done[0])
            try:
                _, trajectories, stats = ray.get(done[0])
            except Exception as exc:  # the actor died or the chunk could not run
                died = isinstance(exc, ray.exceptions.RayActorError)
                if died:
                    self._actors.remove(actor)  # a later run starts fresh actors if none are left
                else:
                    idle.append(actor)
                if died and self._actors and attempts[first] < self.max_chunk_retries:
                    attempts[first] += 1  # its episodes run again, next, on a surviving worker
                    self.rerun_jobs += length
                    queue.append((first, chunk_ref))
                else:
                    record_failed(first, length, exc)
                while queue and not self._actors:  # nobody left to run the rest
                    rest, _ = queue.pop()
                    record_failed(rest, min(size, len(jobs) - rest), exc)
            else:
                idle.append(actor)
                record(first, trajectories, stats)
            dispatch()
        if bar is not None:
            bar.close()
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:  # pragma: no cover - every path records a trajectory
            raise RuntimeError(f"ray rollout lost episodes {missing}")
        stats = merge_stats(parts, time.perf_counter() - start)
        return [r for r in results if r is not None], stats

    def _put(self, jobs: list[RolloutJob], first: int, stop: int) -> Any:
        """Puts ``jobs[first:stop]`` in the object store; a job that won't pickle is a TypeError."""
        try:
            return self.ray.put(jobs[first:stop])
        except Exception:
            from ray import cloudpickle  # the pickler Ray itself uses

            for index in range(first, min(stop, len(jobs))):
                try:
                    cloudpickle.dumps(jobs[index])
                except Exception as job_exc:
                    job = jobs[index]
                    raise TypeError(
                        f"rollout job {index} (task {job.task.id!r}, harness {job.harness.code!r}) cannot "
                        f"be sent to a Ray worker: {type(job_exc).__name__}: {job_exc}. Task setup builders "
                        "must be module-level functions or functools.partial of them, and tags plain data."
                    ) from job_exc
            raise

    @staticmethod
    def _error_trajectory(job: RolloutJob, exc: BaseException) -> Trajectory:
        return Trajectory(
            task_id=job.task.id,
            config=job.harness.code,
            harness=job.harness.code,
            status="error",
            error=f"ray worker failed: {type(exc).__name__}: {exc}",
            seed=job.seed,
            out_of_space=job.harness.out_of_space,
        )
