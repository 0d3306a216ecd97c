"""Benchmark: the serve figures of the first adversarial run (issue 30), measured again in one run.

One `harnessrl serve --policy embedded` process (the embedded SmolLM2, one thread, a Unix
socket) and the hostile requests that run measured:

* **a short request alone** (the baseline): a 4-token chat answer, the median of ``--samples``;
* **beside the largest prompt the server admits**: a body just under its body limit (which
  follows the served context) whose prompt is over the context, so it is refused (400); a short
  request sent 0.01 s after it (while the body is still arriving): its latency, and the large
  one's status and time to answer;
* **beside a 15.9 MiB body** (under the old 16 MiB limit, the first run's stall): the same;
* **batch poisoning**: three requests at once, one with ``temperature`` (then ``top_p``) 1e-300:
  every status (before: 500 for the poisoned one and for 2 of its 3 batch-mates);
* **absurd ``max_tokens``**: NaN, Infinity, 1e400, 2^63, -1: every status (before: 200 except -1).

The last line is ``ratio: X`` = the short request's latency beside the largest admitted prompt
/ its latency alone (the first run: a 4-token request waited 205 s behind a 15.9 MiB prompt).

    python benchmarks/bench_serve_hostile.py [--samples 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench_serve_memory import body_of, post, start

SHORT = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}).encode()


def timed(socket_path: Path, body: bytes) -> tuple[int, float]:
    started = time.perf_counter()
    status, _ = post(socket_path, body)
    return status, time.perf_counter() - started


def beside(socket_path: Path, large: bytes) -> tuple[tuple[int, float], tuple[int, float]]:
    """Sends ``large``, then the short request 0.01 s later (while the large body is still being
    read); returns both (status, seconds)."""
    out: dict[str, tuple[int, float]] = {}
    thread = threading.Thread(target=lambda: out.__setitem__("large", timed(socket_path, large)))
    thread.start()
    time.sleep(0.01)
    out["short"] = timed(socket_path, SHORT)
    thread.join()
    return out["large"], out["short"]


def together(socket_path: Path, bodies: list[bytes]) -> list[int]:
    """Sends ``bodies`` at once, each on its own connection; returns their statuses in order."""
    statuses = [0] * len(bodies)
    threads = [threading.Thread(target=lambda i=i: statuses.__setitem__(i, post(socket_path, bodies[i])[0]))
               for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3, help="short requests alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as folder:
        socket_path = Path(folder) / "serve.sock"
        process = start("embedded", socket_path)
        try:
            status, reply = post(socket_path, b"", declared=1 << 40)
            limit = int(re.search(rb"limit of (\d+) bytes", reply).group(1))  # type: ignore[union-attr]
            for _ in range(2):
                post(socket_path, SHORT)  # warm-up
            alone = statistics.median(timed(socket_path, SHORT)[1] for _ in range(args.samples))
            print(f"body limit {limit / (1 << 20):.2f} MiB (413 for a larger declaration: {status})")
            print(f"short request alone: {alone:.2f} s (median of {args.samples})")
            results = {}
            for name, size in (("largest admitted", limit - 64), ("15.9 MiB", int(15.9 * (1 << 20)))):
                (large_status, large_s), (short_status, short_s) = beside(socket_path, body_of(size))
                results[name] = short_s
                print(f"beside the {name} body ({size / (1 << 20):.2f} MiB): it got {large_status} in {large_s:.2f} s; "
                      f"the short request {short_status} in {short_s:.2f} s ({short_s / alone:.2f}x alone)")
            for field in ("temperature", "top_p"):
                poisoned = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                                       field: 1e-300}).encode()
                normal = json.dumps({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4,
                                     "temperature": 0.7}).encode()
                print(f"{field} 1e-300 with two batch-mates: statuses {together(socket_path, [poisoned, normal, normal])}"
                      " (the poisoned one first)")
            absurd = {}
            for text in ("NaN", "Infinity", "1e400", str(2**63), "-1"):
                body = b'{"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": ' + text.encode() + b"}"
                absurd[text] = post(socket_path, body)[0]
            print(f"max_tokens: {absurd}")
        finally:
            process.terminate()
            process.wait(timeout=60)
    print(f"ratio: {results['largest admitted'] / alone:.2f}")


if __name__ == "__main__":
    main()
