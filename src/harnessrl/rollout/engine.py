"""The rollout engine: many episodes at once, one batched policy call for all that wait.

Each episode is a state machine (``episode.Episode``). The engine keeps up to
``max_concurrent`` episodes in flight: every episode waiting for the model goes into one
``policy.generate`` batch, while sandbox steps (laying out workspaces, running commands,
verifying) run in a thread pool; an episode that finishes frees its slot for the next job
at once. An episode that raises is recorded with status ``error`` and the rest go on.

Which episodes share a batch is a matter of timing (who left the sandbox first), and a batch's
shape moves a row's rounding (bfloat16 most). ``deterministic`` runs in lockstep instead:
every admitted episode reaches its next policy call (or its end) before a batch forms, and the
batch is in job order, so two runs form the same batches whatever else the machine does.

``continuous_batching`` (a policy with ``continuous()``, ``HFPolicy``) drops the batch barrier:
one decode batch runs for the whole ``run``, an episode's request joins it at the next decode
step, and each finished generation goes back to its episode at once, so the next turn of an
episode whose row finished early decodes beside the rows still running
(``policy/continuous.py``). With ``deterministic`` a request returned by the sandbox joins at
the decode step right after the one that finished its last turn (the engine waits for it
there), in job order: the batches are again a function of the jobs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields
from typing import Any

from harnessrl.harness.harness import Harness
from harnessrl.policy.base import Generation, GenerationRequest, Policy, SamplingParams
from harnessrl.progress import Progress
from harnessrl.rollout.episode import Episode
from harnessrl.sandbox import SandboxLimits, open_sandbox
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


@dataclass
class RolloutJob:
    """One episode to run: a task under a harness, with a seed and free-form tags."""

    task: Task
    harness: Harness
    seed: int = 0
    tags: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutStats:
    """Timing and throughput of one ``run``."""

    episodes: int = 0
    errored: int = 0
    passed: int = 0
    generation_calls: int = 0
    tokens_generated: int = 0
    generation_time_s: float = 0.0
    sandbox_time_s: float = 0.0
    harness_time_s: float = 0.0
    wall_time_s: float = 0.0
    mean_batch_size: float = 0.0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_time_s if self.wall_time_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_generated / self.wall_time_s if self.wall_time_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["episodes_per_s"] = round(self.episodes_per_s, 4)
        out["tokens_per_s"] = round(self.tokens_per_s, 2)
        return out


class _Slot:
    """An episode in flight with its sandbox and the job it came from."""

    def __init__(self, index: int, job: RolloutJob) -> None:
        self.index, self.job = index, job
        self.episode: Episode | None = None
        self.sandbox: Any = None
        self.request: GenerationRequest | None = None
        self.trajectory: Trajectory | None = None


@dataclass(frozen=True)
class EngineOptions:
    """How an engine runs episodes; the same for ``RolloutEngine`` and each Ray worker's engine.

    ``max_concurrent`` episodes are in flight at once (all that wait for the model go into one
    policy call); ``env_workers`` threads run sandbox steps; ``sampling`` is passed to every
    episode (the harness's per-turn limit still caps it); ``backend`` and ``sandbox_limits``
    open each episode's sandbox (default limits: the harness's command timeout);
    ``batch_wait_s`` is how long a ready batch waits for episodes still in a sandbox step;
    ``deterministic`` waits for all of them instead and orders the batch by job (lockstep: the
    batches are a function of the jobs, not of timing; ``batch_wait_s`` is then unused).
    ``continuous_batching`` runs one decode batch that requests join and leave step by step
    (module docstring) where the policy can (``supports_continuous``); elsewhere it is ignored.
    """

    max_concurrent: int = 16  # the one default of episodes in flight (evaluation, training, CLIs)
    env_workers: int = 4
    sampling: SamplingParams | None = None
    backend: str = "auto"
    sandbox_limits: SandboxLimits | None = None
    batch_wait_s: float = 1.0
    deterministic: bool = False
    continuous_batching: bool = False

    def __post_init__(self) -> None:
        if self.max_concurrent < 1 or self.env_workers < 1:
            raise ValueError(
                f"max_concurrent and env_workers must be >= 1, got {self.max_concurrent} and {self.env_workers}"
            )
        if self.batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, got {self.batch_wait_s}")


class RolloutEngine:
    """Runs rollout jobs concurrently against one policy and returns their trajectories.

    The keyword arguments are the fields of ``EngineOptions`` (their defaults are its own;
    ``rollout.settings.RolloutSettings.engine`` builds one from a run's settings); ``progress`` shows the episodes' progress on stderr (a bar on a terminal, timestamped
    lines otherwise: ``harnessrl.progress``) and
    ``on_trajectory(index, trajectory)`` is called as each episode finishes.
    """

    def __init__(
        self,
        policy: Policy,
        max_concurrent: int = EngineOptions.max_concurrent,
        env_workers: int = EngineOptions.env_workers,
        sampling: SamplingParams | None = None,
        backend: str = EngineOptions.backend,
        sandbox_limits: SandboxLimits | None = None,
        progress: bool = False,
        on_trajectory: Callable[[int, Trajectory], None] | None = None,
        batch_wait_s: float = EngineOptions.batch_wait_s,
        deterministic: bool = False,
        continuous_batching: bool = False,
    ) -> None:
        self.options = EngineOptions(max_concurrent, env_workers, sampling, backend, sandbox_limits, batch_wait_s,
                                     deterministic, continuous_batching)
        self.policy = policy
        self.progress = progress
        self.on_trajectory = on_trajectory

    @classmethod
    def from_options(cls, policy: Policy, options: EngineOptions, **kwargs: Any) -> RolloutEngine:
        """Returns an engine with these options (``kwargs``: ``progress``, ``on_trajectory``)."""
        return cls(policy, **{f.name: getattr(options, f.name) for f in fields(options)}, **kwargs)

    # -- environment work, run in the thread pool ----------------------------------------
    def _open(self, slot: _Slot) -> _Slot:
        job = slot.job
        try:
            limits = self.options.sandbox_limits or SandboxLimits(timeout_s=job.harness.limits.command_timeout_s)
            slot.sandbox = open_sandbox(backend=self.options.backend, limits=limits)
            slot.episode = Episode(job.harness, job.task, slot.sandbox, self.policy.tokenizer, self.options.sampling, job.seed)
            slot.episode.start()
            return self._next_request(slot)
        except Exception as exc:
            return self._fail(slot, exc)

    def _step(self, slot: _Slot, generation: Generation) -> _Slot:
        try:
            assert slot.episode is not None
            slot.episode.advance(generation)
            return self._next_request(slot)
        except Exception as exc:
            return self._fail(slot, exc)

    def _next_request(self, slot: _Slot) -> _Slot:
        episode = slot.episode
        assert episode is not None
        slot.request = None if episode.done else episode.request()
        if slot.request is None:
            self._finish(slot)
        return slot

    def _fail(self, slot: _Slot, exc: BaseException) -> _Slot:
        job = slot.job
        error = f"{type(exc).__name__}: {exc}"
        if slot.episode is not None:
            slot.episode.error = error
            slot.episode.end("error")
            try:
                self._finish(slot)
                return slot
            except Exception:  # fall through to a bare record
                pass
        slot.trajectory = Trajectory(
            task_id=job.task.id, config=job.harness.code, harness=job.harness.code, status="error",
            error=error, policy=self.policy.name, seed=job.seed, out_of_space=job.harness.out_of_space,
            metrics=_tag_metrics(job),
        )
        self._close(slot)
        return slot

    def _finish(self, slot: _Slot) -> None:
        assert slot.episode is not None
        try:
            slot.trajectory = slot.episode.finish(self.policy.name)
            slot.trajectory.metrics.update(_tag_metrics(slot.job))
        finally:
            self._close(slot)

    @staticmethod
    def _close(slot: _Slot) -> None:
        if slot.sandbox is not None:
            with contextlib.suppress(Exception):
                slot.sandbox.close()
            slot.sandbox = None

    # -- the scheduler ---------------------------------------------------------------------
    def run(self, jobs: Iterable[RolloutJob]) -> tuple[list[Trajectory], RolloutStats]:
        """Runs every job; returns trajectories in job order (errored ones included) and stats."""
        jobs = list(jobs)
        stats = RolloutStats()
        results: list[Trajectory | None] = [None] * len(jobs)
        start = time.perf_counter()
        bar = _progress_bar(len(jobs)) if self.progress else None

        def record(slot: _Slot) -> bool:
            """Keeps a finished episode's trajectory; returns False while the episode goes on."""
            if slot.trajectory is None:
                return False
            results[slot.index] = slot.trajectory
            self._account(stats, slot.trajectory)
            if self.on_trajectory is not None:
                self.on_trajectory(slot.index, slot.trajectory)
            if bar is not None:
                bar.update(1, tok_s=f"{stats.tokens_generated / max(1e-9, time.perf_counter() - start):.1f}")
            return True

        with ThreadPoolExecutor(max_workers=self.options.env_workers, thread_name_prefix="rollout-env") as pool:
            if self.options.continuous_batching and getattr(self.policy, "supports_continuous", False):
                self._run_continuous(jobs, pool, record, stats)
            else:
                self._run_batched(jobs, pool, record, stats)
        if bar is not None:
            bar.close()
        stats.wall_time_s = time.perf_counter() - start
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:  # pragma: no cover - every path records a trajectory
            raise RuntimeError(f"rollout lost episodes {missing}")
        return [r for r in results if r is not None], stats

    def _run_batched(self, jobs: list[RolloutJob], pool: ThreadPoolExecutor, record: Callable[[_Slot], bool],
                     stats: RolloutStats) -> None:
        """Every episode waiting for the model goes into one ``policy.generate`` call."""
        pending = iter(enumerate(jobs))
        in_flight: set[Future[_Slot]] = set()
        waiting: list[_Slot] = []
        batch_sizes: list[int] = []

        def launch() -> None:
            while len(in_flight) + len(waiting) < self.options.max_concurrent:
                nxt = next(pending, None)
                if nxt is None:
                    return
                in_flight.add(pool.submit(self._open, _Slot(*nxt)))

        def collect(done: Iterable[Future[_Slot]]) -> None:
            for future in done:
                in_flight.discard(future)
                slot = future.result()  # _open/_step never raise
                if not record(slot):
                    waiting.append(slot)

        launch()
        while in_flight or waiting:
            if self.options.deterministic:  # lockstep: all admitted episodes, in job order
                while in_flight:
                    collect(wait(in_flight)[0])
                    launch()  # freed slots admit the next jobs, which join this batch too
                waiting.sort(key=lambda slot: slot.index)
                if not waiting:
                    continue
            else:
                # Take every episode that is ready now; block only when none is.
                done = {f for f in in_flight if f.done()}
                if not done and not waiting:
                    done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                collect(done)
                launch()
                if not waiting:
                    continue
                if in_flight and self.options.batch_wait_s > 0:
                    # Environment steps take milliseconds, generation takes seconds: let
                    # episodes still in the sandbox join this batch instead of the next, or
                    # the episodes split into cohorts that never share a batch again.
                    done, _ = wait(in_flight, timeout=self.options.batch_wait_s)
                    collect(done)
                    launch()
            batch, waiting = waiting, []
            generations = self._generate(batch, stats)
            batch_sizes.append(len(batch))
            for slot, generation in zip(batch, generations, strict=True):
                in_flight.add(pool.submit(self._step, slot, generation))
        stats.mean_batch_size = sum(batch_sizes) / len(batch_sizes) if batch_sizes else 0.0

    def _run_continuous(self, jobs: list[RolloutJob], pool: ThreadPoolExecutor, record: Callable[[_Slot], bool],
                        stats: RolloutStats) -> None:
        """One decode batch for the whole run: requests join it step by step (module docstring)."""
        pending = iter(enumerate(jobs))
        in_flight: dict[Future[_Slot], int] = {}  # sandbox work -> its slot's job index
        decoding: dict[int, _Slot] = {}
        deterministic = self.options.deterministic

        def launch() -> None:
            while len(in_flight) + len(decoding) < self.options.max_concurrent:
                nxt = next(pending, None)
                if nxt is None:
                    return
                in_flight[pool.submit(self._open, _Slot(*nxt))] = nxt[0]

        def collect(done: Iterable[Future[_Slot]]) -> None:
            # In job order, so that requests join the batch in an order the jobs fix.
            for future in sorted(done, key=in_flight.__getitem__):
                del in_flight[future]
                slot = future.result()  # _open/_step never raise
                if not record(slot):
                    assert slot.request is not None
                    decoding[slot.index] = slot
                    decoder.add(slot.index, slot.request)
            launch()

        with self.policy.continuous() as decoder:  # type: ignore[attr-defined]  # supports_continuous
            launch()
            while in_flight or decoding:
                if deterministic:  # every episode back from the sandbox before the next step
                    collect(wait(in_flight)[0] if in_flight else ())
                    while in_flight and not decoder.running and not decoder.queued:
                        collect(wait(in_flight)[0])
                else:
                    done = [f for f in in_flight if f.done()]
                    if not done and not decoder.running and not decoder.queued:
                        done = list(wait(in_flight, return_when=FIRST_COMPLETED)[0])
                    collect(done)
                if not decoder.running and not decoder.queued:
                    continue
                started = time.perf_counter()
                finished = decoder.step()
                stats.generation_time_s += time.perf_counter() - started
                for key, generation in finished:
                    slot = decoding.pop(key)  # type: ignore[call-overload]
                    stats.tokens_generated += len(generation.token_ids)
                    in_flight[pool.submit(self._step, slot, generation)] = slot.index
            stats.generation_calls = decoder.stats.steps
            stats.mean_batch_size = decoder.stats.mean_rows

    def _generate(self, batch: Sequence[_Slot], stats: RolloutStats) -> list[Generation]:
        requests = [slot.request for slot in batch]
        t0 = time.perf_counter()
        try:
            generations = self.policy.generate(requests)  # type: ignore[arg-type]
            if len(generations) != len(requests):
                raise RuntimeError(f"policy returned {len(generations)} generations for {len(requests)} requests")
        except Exception as exc:  # a policy failure ends these episodes, not the run
            generations = [Generation([], [], "error", error=f"{type(exc).__name__}: {exc}") for _ in requests]
        stats.generation_time_s += time.perf_counter() - t0
        stats.generation_calls += 1
        stats.tokens_generated += sum(len(g.token_ids) for g in generations)
        return generations

    @staticmethod
    def _account(stats: RolloutStats, trajectory: Trajectory) -> None:
        stats.episodes += 1
        stats.errored += trajectory.status == "error"
        stats.passed += bool(trajectory.passed)
        stats.sandbox_time_s += float(trajectory.metrics.get("sandbox_time_s", 0.0))
        stats.harness_time_s += float(trajectory.metrics.get("harness_time_s", 0.0))


def _tag_metrics(job: RolloutJob) -> dict[str, Any]:
    """A job's tags as its trajectory's metrics (``tag_<name>``), on every record, errors included."""
    return {f"tag_{k}": v for k, v in job.tags.items()}


def _progress_bar(total: int) -> Progress:
    """Returns the episodes' progress: a bar on a terminal, timestamped lines otherwise."""
    return Progress(total, "episodes", "ep")
