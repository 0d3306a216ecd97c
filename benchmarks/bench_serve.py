"""Benchmark: requests/s and added latency of `harnessrl serve` over a direct policy call.

The same Chat Completions request (a system prompt, two tools, a user question; the answer
is a sentence and one tool call) is answered two ways, samples interleaved (direct, server,
server, direct, ...) so load from elsewhere hits both alike:

* **direct** (the baseline): ``policy.generate([request])`` on the prompt ids the server
  renders for that request;
* **server**: the same request as JSON over loopback HTTP (``httpx``, one kept-alive
  connection) to a ``ServerThread`` (parsing, rendering, batching, tool-call parsing,
  recording and the response's JSON included). The official ``openai`` client's own cost
  is shown on a separate line (it builds pydantic objects on both sides of the call).

Then ``--concurrency`` client *processes* (so that they do not share the server's GIL) send
``--requests`` requests in all, and the server's requests/s is measured (the batcher
gathers concurrent requests into shared ``generate`` calls). The policy
is a fast scripted one by default, so that the server's own cost is what is measured;
``--model`` uses the embedded SmolLM2 (CPU) with ``--max-tokens`` output tokens instead.
The last line is ``ratio: X`` = median server latency / median direct latency.

``--ttft`` measures streaming instead: ``--samples`` streamed chat requests (the official
``openai`` client, no tools, so the answer is text) with the embedded model, each timed to its
first content delta (time to first token) and to its last; the last line is ``ttft_ratio: X``
= median time to first token / median total time (1.0 when nothing streams before the end).

    python benchmarks/bench_serve.py [--samples 200] [--concurrency 8] [--requests 400] [--model]
    python benchmarks/bench_serve.py --ttft [--samples 5] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time

import httpx
import openai

from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.scripted import CallbackPolicy
from harnessrl.serve.app import create_app
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.runner import ServerThread

SYSTEM = "You are a careful software engineer. " * 30
TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Runs a shell command.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Reads a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]
ANSWER = 'I will list the files first.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'


def messages(index: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Task {index}: find the failing test."}]


def body(index: int, max_tokens: int) -> dict:
    return {"model": "bench", "messages": messages(index), "tools": TOOLS, "max_tokens": max_tokens, "temperature": 0.0}


def client_process(base_url: str, indices: list[int], max_tokens: int, ready: object, start: object) -> None:
    """One concurrent client: connects, says it is ready, waits for the start signal, then
    sends its requests in turn."""
    with httpx.Client(base_url=base_url, timeout=600) as client:
        client.get("/v1/models")  # connect before the clock starts
        ready.release()  # type: ignore[attr-defined]
        start.wait()  # type: ignore[attr-defined]
        for index in indices:
            response = client.post("/v1/chat/completions", json=body(index, max_tokens))
            response.raise_for_status()


def load_policy(use_model: bool):
    if use_model:
        from harnessrl.policy.hf import HFPolicy

        return HFPolicy(device="cpu", max_batch_size=16)
    return CallbackPolicy(lambda context: ANSWER, name="scripted")


def time_to_first_token(samples: int, max_tokens: int) -> None:
    """Prints the median time to the first streamed content delta and to the end of the stream."""
    policy = load_policy(True)
    app = create_app(policy, model_name="bench", recorder=ConversationRecorder())
    first_s, total_s, deltas = [], [], []
    with ServerThread(app) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        for index in range(samples + 1):  # the first is a warm-up
            started = time.perf_counter()
            first, count = None, 0
            stream = client.chat.completions.create(model="bench", messages=messages(index), max_tokens=max_tokens,
                                                    temperature=0.0, stream=True)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first if first is not None else time.perf_counter() - started
                    count += 1
            if index:
                first_s.append(first if first is not None else time.perf_counter() - started)
                total_s.append(time.perf_counter() - started)
                deltas.append(count)
    first_ms, total_ms = statistics.median(first_s) * 1e3, statistics.median(total_s) * 1e3
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"policy: {policy.name}, max_tokens {max_tokens}, {samples} streamed requests, "
          f"median {statistics.median(deltas):.0f} content deltas each")
    print(f"time to first token      median {first_ms:9.1f} ms")
    print(f"time to last token       median {total_ms:9.1f} ms")
    print(f"ttft_ratio: {first_ms / total_ms:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="sequential samples per path")
    parser.add_argument("--concurrency", type=int, default=8, help="client processes for the throughput run")
    parser.add_argument("--requests", type=int, default=400, help="requests in the throughput run")
    parser.add_argument("--model", action="store_true", help="use the embedded SmolLM2 instead of a scripted policy")
    parser.add_argument("--max-tokens", type=int, default=None, help="output tokens per request (default: 256 scripted, 16 model)")
    parser.add_argument("--ttft", action="store_true", help="measure time to first streamed token with the embedded model")
    args = parser.parse_args()
    if args.ttft:
        time_to_first_token(min(args.samples, 20), args.max_tokens or 64)
        return
    args.max_tokens = args.max_tokens or (16 if args.model else 256)

    policy = load_policy(args.model)
    app = create_app(policy, model_name="bench", recorder=ConversationRecorder())
    engine = app.state.engine
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_tokens, stop_token_ids=tuple(policy.tokenizer.stop_token_ids))
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"], "parameters": t["function"]["parameters"]} for t in TOOLS]

    with ServerThread(app) as server:
        http = httpx.Client(base_url=server.base_url, timeout=600)
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)

        def direct(index: int) -> float:
            prompt = engine.renderer.render(messages(index), tools).ids  # what the server renders
            started = time.perf_counter()
            policy.generate([GenerationRequest(prompt, params)])
            return time.perf_counter() - started

        def served(index: int) -> float:
            started = time.perf_counter()
            http.post("/v1/chat/completions", json=body(index, args.max_tokens)).raise_for_status()
            return time.perf_counter() - started

        def with_openai(index: int) -> float:
            started = time.perf_counter()
            client.chat.completions.create(model="bench", messages=messages(index), tools=TOOLS,
                                           max_tokens=args.max_tokens, temperature=0.0)
            return time.perf_counter() - started

        for index in range(5):  # warm-up: connections, caches
            direct(index), served(index), with_openai(index)
        direct_s, served_s, openai_s = [], [], []
        for index in range(args.samples):
            runs = [(direct, direct_s), (served, served_s), (with_openai, openai_s)]
            for run, samples in runs if index % 2 == 0 else runs[::-1]:
                samples.append(run(index))

        # Throughput: concurrent client processes.
        batches_before, requests_before = engine.batcher.batches, engine.batcher.requests
        context = multiprocessing.get_context("spawn")
        ready, start = context.Semaphore(0), context.Event()
        shares = [list(range(i, args.requests, args.concurrency)) for i in range(args.concurrency)]
        processes = [context.Process(target=client_process, args=(server.base_url, share, args.max_tokens, ready, start)) for share in shares]
        for process in processes:
            process.start()
        for _ in processes:  # every client has imported and connected
            ready.acquire()
        started = time.perf_counter()
        start.set()
        for process in processes:
            process.join()
        elapsed = time.perf_counter() - started
        if any(process.exitcode for process in processes):
            raise SystemExit("a client process failed")
        batches = engine.batcher.batches - batches_before
        batched = engine.batcher.requests - requests_before

    direct_ms, served_ms = statistics.median(direct_s) * 1e3, statistics.median(served_s) * 1e3
    openai_ms = statistics.median(openai_s) * 1e3
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"policy: {policy.name}, max_tokens {args.max_tokens}, prompt {len(engine.renderer.render(messages(0), tools))} tokens")
    print(f"direct policy.generate   median {direct_ms:8.2f} ms  ({1e3 / direct_ms:8.1f} calls/s sequential)")
    print(f"server (httpx, JSON)     median {served_ms:8.2f} ms  ({1e3 / served_ms:8.1f} requests/s sequential)")
    print(f"added latency            median {served_ms - direct_ms:8.2f} ms per request")
    print(f"server (openai client)   median {openai_ms:8.2f} ms  (client objects add {openai_ms - served_ms:.2f} ms)")
    print(f"server, {args.concurrency} concurrent client processes: {args.requests / elapsed:.1f} requests/s "
          f"({batched / max(batches, 1):.1f} requests per policy batch)")
    print(f"ratio: {served_ms / direct_ms:.2f}")


if __name__ == "__main__":
    main()
