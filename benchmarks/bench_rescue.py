"""Benchmark: what Harness-S's router and rescue bookkeeping add to a training step, against the
step's rollouts themselves.

One step of 4 tasks x 4 rollouts under H0 runs through the real rollout engine and sandbox
with the ``faulty`` scripted policy (it fails in diagnosable ways, so groups die). Timed apart:

- ``rollouts``: the first pass (the baseline every GRPO step pays);
- ``router + rescue``: finding the dead groups, routing K siblings for each (validation router
  over H0's 10 space neighbours, and random), planning, replacing the groups, and the
  valid-group / effective-token metrics: everything rescue adds except its own rollouts;
- ``rescue rollouts``: the rescue groups' episodes (an executor cost, reported separately).

Prints the medians and, as the last line, ``ratio: X`` = router and bookkeeping time / first-pass
rollout time (small is good: the router must not cost what an episode costs).

    python benchmarks/bench_rescue.py [--repeats 5] [--backend auto]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.harness.registry import default_space
from harnessrl.policy.faulty import FaultyPolicy
from harnessrl.rescue.groups import (
    GroupInfo,
    RescueStats,
    apply_rescue,
    dead_groups,
    plan_rescue,
    signal_metrics,
)
from harnessrl.rescue.router import PairedValidation, RandomRouter, TaskInfo, ValidationRouter
from harnessrl.rl.advantages import grpo_advantages
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.suite import load_suite

H0 = "S0-T0-O0-C0-W0"
LIMITS = HarnessLimits(max_turns=6, max_new_tokens=16_384, context_tokens=262_144)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--k", type=int, default=8, help="rescue group size (paper: 8)")
    args = parser.parse_args()

    space = default_space()
    siblings = [c.code for c in space.neighbours(space.parse(H0))]
    tasks = list(load_suite("workspace").tasks("train", limit=4, seed=0))
    task_of = {t.id: t for t in tasks}
    policy = FaultyPolicy()
    engine = RolloutEngine(policy, max_concurrent=16, env_workers=4, backend=args.backend)
    # Evidence for the validation router: every sibling on 8 paired tasks (made up, fixed).
    record = PairedValidation(outcomes={name: {f"v{j}": (i + j) % 3 == 0 for j in range(8)}
                                        for i, name in enumerate([H0, *siblings])})
    routers = {"validation": ValidationRouter(record), "random": RandomRouter()}
    harness = {name: Harness.named(name, LIMITS) for name in [H0, *siblings]}
    first, bookkeeping, rescue_time = [], [], []
    for repeat in range(args.repeats):
        jobs = [RolloutJob(task, harness[H0], seed=repeat * 100 + i, tags={"group": g})
                for g, task in enumerate(tasks) for i in range(4)]
        t0 = time.perf_counter()
        trajectories, _ = engine.run(jobs)
        t1 = time.perf_counter()
        groups = [job.tags["group"] for job in jobs]
        infos = [GroupInfo(g, TaskInfo.of(task), H0) for g, task in enumerate(tasks)]
        dead_keys = set(dead_groups(trajectories, groups))
        dead = [info for info in infos if info.group in dead_keys]
        router = routers["validation" if repeat % 2 == 0 else "random"]
        runs = plan_rescue("siblings", dead, args.k, router, lambda h0: siblings, seed=repeat)
        t2 = time.perf_counter()
        rescued, _ = engine.run([RolloutJob(task_of[r_info.task.task_id], harness[run.harness], seed=repeat * 100 + 50 + i)
                                 for i, (run, r_info) in enumerate((r, next(d for d in dead if d.group == r.group))
                                                                   for r in runs)])
        t3 = time.perf_counter()
        stats = RescueStats(groups=len(infos), dead=len(dead), base_rollouts=len(trajectories))
        new_t, new_g = apply_rescue(trajectories, groups, runs, rescued, stats)
        signal_metrics(new_t, new_g, grpo_advantages([t.reward for t in new_t], new_g))
        stats.metrics()
        t4 = time.perf_counter()
        first.append(t1 - t0)
        bookkeeping.append((t2 - t1) + (t4 - t3))
        rescue_time.append(t3 - t2)
        print(f"repeat {repeat}: {len(dead)} dead of {len(infos)} groups, {len(runs)} rescue rollouts; "
              f"first pass {t1 - t0:.2f} s, router + rescue {1000 * bookkeeping[-1]:.2f} ms, "
              f"rescue rollouts {t3 - t2:.2f} s")
    print(f"machine: {platform.machine()} {platform.processor() or ''}".strip())
    print(f"first-pass rollouts (16 episodes): median {statistics.median(first):.3f} s")
    print(f"router + rescue bookkeeping:       median {1000 * statistics.median(bookkeeping):.3f} ms")
    print(f"rescue rollouts:                   median {statistics.median(rescue_time):.3f} s")
    print(f"ratio: {statistics.median(bookkeeping) / statistics.median(first):.5f}")


if __name__ == "__main__":
    main()
