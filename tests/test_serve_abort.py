"""A client that goes away stops its generation: ``HFPolicy`` ends a row whose token sink
returns False (the rest of the batch samples what it would have), and the real server, over
a real model, stops sampling for a client that disconnected mid-answer on any of the three
APIs, streamed or not, counts it in ``/health``, and serves the next request."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from harnessrl.policy.base import GenerationRequest, SamplingParams
from serve_helpers import running

pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.policy.hf import HFPolicy

GATE = 6  # the served policy pauses after this many tokens until the client has gone
MAX_TOKENS = 300


def test_a_sink_returning_false_ends_only_its_row(tiny_model):
    policy = HFPolicy(tiny_model, device="cpu", max_prefix_cache_tokens=0)
    stop = tuple(policy.tokenizer.stop_token_ids)
    requests = [
        GenerationRequest([1, 2, 3, 4, 5], SamplingParams(1.0, 1.0, 30, stop, seed=7)),
        GenerationRequest([9, 8, 7], SamplingParams(1.0, 1.0, 30, stop, seed=3)),
    ]
    heard = {0: 0, 1: 0}

    def sink(index, ids):
        heard[index] += len(ids)
        return False if index == 0 and heard[0] == 4 else None

    streamed = policy.generate_stream(requests, sink)
    plain = policy.generate(requests)
    assert streamed[0].finish_reason == "abort" and streamed[0].token_ids == plain[0].token_ids[:4]
    assert streamed[0].logprobs == plain[0].logprobs[:4] and heard[0] == 4
    # the other row samples exactly what it samples in a batch nobody left
    assert (streamed[1].token_ids, streamed[1].logprobs, streamed[1].finish_reason) == (
        plain[1].token_ids, plain[1].logprobs, plain[1].finish_reason)
    assert len(plain[0].token_ids) > 4  # it would have gone on


class GatedPolicy(HFPolicy):
    """An ``HFPolicy`` that, at its ``GATE``-th sampled token, waits (30 s at most) until the
    test lets it go on, and keeps what each batch returned."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sampled = 0
        self.paused = threading.Event()
        self.go_on = threading.Event()
        self.batches: list[list] = []

    def gate(self, ids) -> None:
        self.sampled += len(ids)
        if self.sampled == GATE:
            self.paused.set()
            self.go_on.wait(timeout=30)

    def generate_stream(self, requests, on_tokens):
        def gated(index, ids):
            answer = on_tokens(index, ids)
            self.gate(ids)
            return answer

        generations = super().generate_stream(requests, gated)
        self.batches.append(generations)
        return generations

    @contextlib.contextmanager
    def continuous(self):
        """The server's continuous batching (its default over HFPolicy): the same gate on each
        request's token sink; each step's finished generations count as a batch."""
        with super().continuous() as decoder:
            add, step = decoder.add, decoder.step

            def gated_add(key, request, on_tokens=None):
                def gated(ids):
                    answer = on_tokens(ids) if on_tokens is not None else None
                    self.gate(ids)
                    return answer

                add(key, request, gated)

            def recorded_step():
                finished = step()
                if finished:
                    self.batches.append([generation for _, generation in finished])
                return finished

            decoder.add, decoder.step = gated_add, recorded_step
            yield decoder


ASKS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story."}],
                                      "max_tokens": MAX_TOKENS}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "Tell me a story."}],
                                  "max_tokens": MAX_TOKENS}),
    "responses": ("/v1/responses", {"input": "Tell me a story.", "max_output_tokens": MAX_TOKENS}),
}


def health(server) -> dict:
    return httpx.get(server.base_url + "/health", timeout=10).json()


def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("api", sorted(ASKS))
def test_a_client_that_disconnects_mid_answer_stops_its_generation(tiny_model, api, stream):
    answer_then_leave(tiny_model, api, stream, leave=socket.socket.close)


def test_a_half_closed_connection_is_a_client_gone(tiny_model):
    """What the agent relay (external/relay.py) does upstream when the agent in the sandbox
    dies: it shuts its writing side; the server takes that as the client gone."""
    answer_then_leave(tiny_model, "chat", False, leave=lambda sock: sock.shutdown(socket.SHUT_WR))


def answer_then_leave(tiny_model, api, stream, leave) -> None:
    policy = GatedPolicy(tiny_model, device="cpu", max_prefix_cache_tokens=0)
    path, body = ASKS[api]
    with running(policy) as (server, _, _):
        payload = json.dumps({"model": "m", **body, "stream": stream}).encode()
        sock = socket.create_connection((server.host, server.port), timeout=30)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        assert policy.paused.wait(timeout=30)  # sampling: GATE tokens in
        if stream:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # the stream had begun
        leave(sock)
        wait_for(lambda: health(server)["abandoned_requests"] == 1, "the server to see the disconnect")
        policy.go_on.set()
        wait_for(lambda: health(server)["aborted_generations"] == 1, "the generation to stop")
        wait_for(lambda: len(policy.batches) == 1, "the batch to return")
        (gone,) = policy.batches[0]
        # it stopped at the first token after the client left, not at MAX_TOKENS
        assert gone.finish_reason == "abort" and len(gone.token_ids) == GATE + 1
        # the server goes on: the next client is answered in full
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
        assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 5
        assert health(server)["aborted_generations"] == 1 and health(server)["abandoned_requests"] == 1
    sock.close()


def test_a_queued_request_whose_client_left_is_never_run(tiny_model):
    """While one request samples (paused), a second client sends a request and leaves: it is
    skipped, not run, once the first is done."""
    policy = GatedPolicy(tiny_model, device="cpu", max_prefix_cache_tokens=0)
    with running(policy) as (server, _, _):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        first: dict = {}

        def ask_first() -> None:
            first["answer"] = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "One"}], max_tokens=GATE + 3)

        asker = threading.Thread(target=ask_first)
        asker.start()
        assert policy.paused.wait(timeout=30)
        payload = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Two"}],
                              "max_tokens": MAX_TOKENS}).encode()
        sock = socket.create_connection((server.host, server.port), timeout=30)
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        wait_for(lambda: health(server)["queued_requests"] == 1, "the second request to be queued")
        sock.close()
        wait_for(lambda: health(server)["abandoned_requests"] == 1, "the server to see the disconnect")
        policy.go_on.set()
        asker.join(timeout=60)
        assert first["answer"].usage.completion_tokens == GATE + 3
        wait_for(lambda: health(server)["queued_requests"] == 0, "the worker to reach the second request")
        state = health(server)
        assert state["batches"] == 1 and state["requests"] == 1 and state["aborted_generations"] == 0
        assert policy.sampled == GATE + 3


def test_a_request_arriving_mid_answer_joins_the_running_batch(tiny_model):
    """Continuous batching (the server's default over HFPolicy): a request that arrives while
    another is sampling joins that decode batch at its next step instead of waiting for it to
    end; both are answered in full, by one decoder."""
    policy = GatedPolicy(tiny_model, device="cpu", max_prefix_cache_tokens=0)
    with running(policy) as (server, _, _):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        answers: dict = {}

        def ask(name: str, tokens: int) -> None:
            answers[name] = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": name}], max_tokens=tokens)

        first = threading.Thread(target=ask, args=("One", 60))
        first.start()
        assert policy.paused.wait(timeout=30)  # the first request is sampling
        second = threading.Thread(target=ask, args=("Two", 8))
        second.start()
        wait_for(lambda: health(server)["queued_requests"] == 1, "the second request to be queued")
        policy.go_on.set()
        first.join(timeout=60)
        second.join(timeout=60)
        assert answers["One"].usage.completion_tokens == 60 and answers["Two"].usage.completion_tokens == 8
        state = health(server)
        assert state["batches"] == 1 and state["requests"] == 2
        # the second finished first: it joined 6 tokens into the first's 60 and needed 8
        assert [len(batch[0].token_ids) for batch in policy.batches] == [8, 60]


def test_requests_waiting_in_the_decoder_count_as_queued_and_one_whose_client_left_is_not_run(tiny_model):
    """Continuous batching with every row taken: a request that joined the decoder waits there
    for a row; ``queued_requests`` (``PolicyBatcher.queued``) counts it, and once its client
    has gone it is answered unrun when the row frees, without a prefill."""
    from harnessrl.serve.engine import PolicyBatcher

    policy = HFPolicy(tiny_model, device="cpu", max_prefix_cache_tokens=0, max_batch_size=1)
    prefills: list[int] = []
    prefill_row = policy._prefill_row
    policy._prefill_row = lambda ids, columns: prefills.append(len(ids)) or prefill_row(ids, columns)
    batcher = PolicyBatcher(policy, continuous=True)
    paused, go_on = threading.Semaphore(0), threading.Semaphore(0)

    def first_tokens(ids) -> None:  # the running request pauses at each of its first two tokens
        if first_tokens.heard < 2:
            first_tokens.heard += 1
            paused.release()
            assert go_on.acquire(timeout=30)
    first_tokens.heard = 0
    gone = threading.Event()
    try:
        first = batcher.submit(GenerationRequest([5, 6, 7], SamplingParams(max_new_tokens=4)), first_tokens)
        assert paused.acquire(timeout=30)  # its first token
        second = batcher.submit(GenerationRequest([9, 8, 7, 6], SamplingParams(max_new_tokens=4)), None, gone.is_set)
        assert batcher.queued == 1  # in the batcher's queue
        go_on.release()
        assert paused.acquire(timeout=30)  # its second token: the second request has joined the decoder
        assert batcher.queued == 1  # now waiting in the decoder for the one row
        gone.set()
        go_on.release()
        assert len(first.result(timeout=60).token_ids) == 4
        answer = second.result(timeout=60)
    finally:
        batcher.close()
        policy.close()
    assert answer.finish_reason == "abort" and answer.token_ids == []
    assert prefills == [3] and batcher.queued == 0 and batcher.aborted == 1
