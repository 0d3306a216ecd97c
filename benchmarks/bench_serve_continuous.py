"""Continuous batching in `harnessrl serve` against one batch at a time, with clients that arrive while others wait.

Agent programs talk to the server on their own clocks: a request arrives while the batch before
it is still sampling. Baseline: ``--no-continuous-batching``, the worker runs one
``generate_stream`` batch at a time and a request waits for the batch in progress to end.
Continuous (the default over ``HFPolicy``): the request joins the running decode batch at its
next step (``policy/continuous.py``). Both serve the embedded model in this process
(``ServerThread``), one after the other and again (baseline, continuous, baseline, continuous),
to the same workload: ``--clients`` threads, each sending ``--requests`` chat requests one
after another, the first ones staggered by ``--stagger`` seconds, asking for 16 to
``--max-tokens`` tokens (fixed by the request's index, the same on both sides; seeded, so both
sides sample the same tokens up to float rounding).

Prints per run the median and 90th percentile of a request's latency, the completion tokens per
wall second and the wall time; then ``ratio: X`` = the baseline's median latency over continuous
batching's (above 1: requests are answered sooner).

    python benchmarks/bench_serve_continuous.py [--clients 6] [--requests 3] [--max-tokens 96] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import httpx
import torch

from harnessrl.policy.hf import HFPolicy
from harnessrl.serve.app import create_app
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.runner import ServerThread

QUESTIONS = ["Write a short story about a lighthouse.", "List five uses of a paperclip.",
             "Explain how a bicycle stays upright.", "Describe the sea at night.",
             "What makes a good breakfast?", "Tell me about the moon."]


def ask(client: httpx.Client, index: int, max_tokens: int) -> tuple[float, int]:
    """Sends request ``index``; returns its latency and completion tokens."""
    tokens = 16 + (index * 37) % (max_tokens - 15)
    body = {"model": "m", "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
            "max_tokens": tokens, "seed": index, "temperature": 1.0}
    start = time.perf_counter()
    response = client.post("/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return time.perf_counter() - start, int(response.json()["usage"]["completion_tokens"])


def run(policy: HFPolicy, continuous: bool, args: argparse.Namespace) -> dict:
    """One pass of the workload against a server with or without continuous batching."""
    policy.clear_prefix_cache()
    app = create_app(policy, model_name="m", recorder=ConversationRecorder(), continuous_batching=continuous)
    latencies: list[float] = []
    tokens: list[int] = []
    lock = threading.Lock()
    with ServerThread(app) as server:

        def client_loop(client_index: int) -> None:
            time.sleep(client_index * args.stagger)
            with httpx.Client(base_url=server.base_url) as client:
                for request in range(args.requests):
                    latency, completion = ask(client, client_index * args.requests + request, args.max_tokens)
                    with lock:
                        latencies.append(latency)
                        tokens.append(completion)

        start = time.perf_counter()
        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        batches = app.state.engine.batcher.batches
    latencies.sort()
    return {"median_s": statistics.median(latencies), "p90_s": latencies[int(0.9 * (len(latencies) - 1))],
            "tokens_per_s": sum(tokens) / wall, "wall_s": wall, "tokens": sum(tokens), "batches": batches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--requests", type=int, default=3, help="requests per client, one after another")
    parser.add_argument("--stagger", type=float, default=0.5, help="seconds between the clients' first requests")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side, interleaved")
    args = parser.parse_args()

    load_start = os.getloadavg()
    policy = HFPolicy(dtype=args.dtype)
    print(f"{args.clients} clients x {args.requests} requests, 16-{args.max_tokens} tokens each, staggered "
          f"{args.stagger} s, embedded model ({policy.dtype}), {torch.get_num_threads()} threads")
    warm = argparse.Namespace(**{**vars(args), "clients": 2, "requests": 1})
    run(policy, True, warm)  # warm-up: packing, first calls
    results: dict[str, list[dict]] = {"one batch at a time": [], "continuous": []}
    for repeat in range(args.repeats):
        for name, continuous in (("one batch at a time", False), ("continuous", True)):
            figures = run(policy, continuous, args)
            results[name].append(figures)
            print(f"run {repeat + 1} {name:>19}: latency median {figures['median_s']:6.2f} s, p90 {figures['p90_s']:6.2f} s; "
                  f"{figures['tokens_per_s']:5.1f} tokens/s; {figures['tokens']} tokens in {figures['wall_s']:.1f} s; "
                  f"{figures['batches']} batches / decoder sessions")
    median = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()}
    base, other = median["one batch at a time"], median["continuous"]
    print(f"median latency: one batch at a time {base['median_s']:.2f} s, continuous {other['median_s']:.2f} s; "
          f"tokens/s {base['tokens_per_s']:.1f} against {other['tokens_per_s']:.1f}")
    load_end = os.getloadavg()
    print(f"load average (1 min): start {load_start[0]:.1f}, end {load_end[0]:.1f}")
    print(f"throughput ratio: {other['tokens_per_s'] / base['tokens_per_s']:.2f}")
    print(f"ratio: {base['median_s'] / other['median_s']:.2f}")


if __name__ == "__main__":
    main()
