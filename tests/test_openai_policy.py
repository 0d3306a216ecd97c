"""OpenAIPolicy against a real local HTTP server that imitates vLLM / SGLang completions:
exact ids and log-probs, request fields, finish reasons, ordering under concurrency, batching,
retries, dead servers, text-only mode, and a whole T0 episode driven through the server."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harnessrl.harness import Harness
from harnessrl.harness.base import Message
from harnessrl.harness.chat import ByteTokenizer
from harnessrl.policy.base import GenerationRequest, SamplingParams
from harnessrl.policy.openai import OpenAIPolicy, ServerError, parse_chatml, parse_token_choice
from harnessrl.rollout.episode import run_episode
from harnessrl.tasks import Action, FileEquals, Task

BYTES = ByteTokenizer()
STOP_IDS = BYTES.stop_token_ids  # (257, 258)

Sample = tuple[list[int], list[float], str]


def fake_sample(prompt: list[int], max_tokens: int, stop_ids: list[int]) -> Sample:
    """The server's deterministic "sampling": a few ids derived from the prompt, then the first
    stop id if any; cut at max_tokens (finish ``length``)."""
    total = sum(prompt)
    ids = [(total * 31 + 7 * k) % 256 for k in range(3 + total % 5)]
    finish = "stop"
    if stop_ids:
        ids.append(stop_ids[0])
    if len(ids) > max_tokens:
        ids, finish = ids[:max_tokens], "length"
    return ids, [-((i % 17) + 1) / 8 - k / 1024 for k, i in enumerate(ids)], finish


class FakeServer:
    """A ThreadingHTTPServer on 127.0.0.1 with ``/v1/completions`` and ``/v1/chat/completions``.

    ``style``: ``vllm`` answers token prompts like vLLM (``logprobs.tokens`` as ``token_id:<id>``
    only when ``return_tokens_as_token_ids`` is sent; ``token_ids`` + ``prompt_token_ids`` when
    ``return_token_ids`` is sent and ``echo_ids`` is on); ``sglang`` puts the ids in
    ``output_token_ids`` and token *texts* in ``logprobs.tokens``. Text prompts get
    ``text_reply``'s answer. ``fail_statuses`` are answered (in order) before any success.
    """

    def __init__(self, style: str = "vllm") -> None:
        self.style = style
        self.echo_ids = False
        self.sampler: Callable[[list[int], int, list[int]], Sample] = fake_sample
        self.text_reply: Callable[[Any], tuple[str, str]] = lambda prompt: ("ls -la", "stop")
        self.delay: Callable[[dict[str, Any]], float] = lambda body: 0.0
        self.fail_statuses: list[int] = []
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.bodies.append(body)
                    server.paths.append(self.path)
                    server.auth.append(self.headers.get("Authorization"))
                    status = server.fail_statuses.pop(0) if server.fail_statuses else 200
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay(body))
                    if status != 200:
                        payload: dict[str, Any] = {"error": {"message": f"injected {status}", "code": status}}
                    else:
                        payload = server.respond(self.path, body)
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def respond(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/v1/chat/completions":
            text, finish = self.text_reply(body["messages"])
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            return {"object": "chat.completion", "model": body["model"], "choices": [choice]}
        assert path == "/v1/completions", path
        prompt = body["prompt"]
        if isinstance(prompt, str):
            text, finish = self.text_reply(prompt)
            return {"choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
        prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt]
        choices = [self.token_choice(i, p, body) for i, p in enumerate(prompts)]
        return {"object": "text_completion", "model": body["model"], "choices": choices[::-1]}

    def token_choice(self, index: int, prompt: list[int], body: dict[str, Any]) -> dict[str, Any]:
        ids, logprobs, finish = self.sampler(prompt, body["max_tokens"], body.get("stop_token_ids", []))
        choice: dict[str, Any] = {"index": index, "text": BYTES.decode(ids), "finish_reason": finish}
        if self.style == "sglang":
            choice["output_token_ids"] = ids
            tokens = [BYTES.decode([i]) for i in ids]
        elif body.get("return_tokens_as_token_ids"):
            tokens = [f"token_id:{i}" for i in ids]
        else:
            tokens = [BYTES.decode([i]) for i in ids]
        if self.echo_ids and body.get("return_token_ids"):
            choice["token_ids"], choice["prompt_token_ids"] = ids, prompt
        if body.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": tokens, "token_logprobs": logprobs,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)],
                "text_offset": list(range(len(ids))),
            }
        return choice

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.close()


def make_policy(server: FakeServer, **options: Any) -> OpenAIPolicy:
    options.setdefault("tokenizer", BYTES)
    options.setdefault("backoff_s", 0.01)
    options.setdefault("timeout_s", 5.0)
    return OpenAIPolicy("fake-model", server.base_url, **options)


def prompt_of(text: str) -> list[int]:
    return BYTES.render([Message("system", "You are terse.", "system"), Message("user", text, "task")]).ids


def request(text: str, **params: Any) -> GenerationRequest:
    params.setdefault("stop_token_ids", STOP_IDS)
    return GenerationRequest(prompt_of(text), SamplingParams(**params))


# ------------------------------------------------------------------ token mode


@pytest.mark.parametrize("style,echo_ids", [("vllm", False), ("vllm", True), ("sglang", False)])
def test_ids_and_logprobs_are_parsed_exactly(server: FakeServer, style: str, echo_ids: bool) -> None:
    server.style, server.echo_ids = style, echo_ids
    policy = make_policy(server)
    req = request("What is 2+2?", seed=5, max_new_tokens=64)
    [generation] = policy.generate([req])
    ids, logprobs, finish = fake_sample(req.prompt_ids, 64, list(STOP_IDS))
    assert generation.error is None
    assert generation.token_ids == ids and generation.token_ids[-1] == BYTES.im_end_id
    assert generation.logprobs == logprobs  # exact floats through JSON
    assert generation.finish_reason == finish == "stop"
    assert policy.name == "openai:fake-model"
    assert policy.token_exact and policy.capabilities["text_only"] is False


def test_request_carries_exact_prompt_ids_and_per_request_params(server: FakeServer) -> None:
    policy = make_policy(server, api_key="sk-local", max_concurrency=4)
    requests = [
        request("first", seed=11, max_new_tokens=7, temperature=0.7, top_p=0.9),
        request("second", seed=None, max_new_tokens=300, temperature=0.0, stop_token_ids=(257,)),
    ]
    policy.generate(requests)
    bodies = sorted(server.bodies, key=lambda b: b["max_tokens"])
    assert server.paths == ["/v1/completions"] * 2 and server.auth == ["Bearer sk-local"] * 2
    first, second = bodies
    assert first["prompt"] == requests[0].prompt_ids and second["prompt"] == requests[1].prompt_ids
    assert (first["seed"], first["max_tokens"], first["temperature"], first["top_p"]) == (11, 7, 0.7, 0.9)
    assert first["stop_token_ids"] == [257, 258] and second["stop_token_ids"] == [257]
    assert "seed" not in second and second["temperature"] == 0.0
    for body in bodies:
        assert body["model"] == "fake-model" and body["logprobs"] == 1 and body["n"] == 1
        assert body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True


def test_no_api_key_sends_no_authorization_and_extra_body_adds_or_removes_fields(server: FakeServer) -> None:
    policy = make_policy(server, extra_body={"top_k": 20, "return_token_ids": None})
    policy.generate([request("hi")])
    assert server.auth == [None]
    assert server.bodies[0]["top_k"] == 20 and "return_token_ids" not in server.bodies[0]


def test_finish_reasons_are_mapped(server: FakeServer) -> None:
    policy = make_policy(server)
    req = request("a long answer please", max_new_tokens=2)
    [cut] = policy.generate([req])
    assert cut.finish_reason == "length" and len(cut.token_ids) == 2
    assert cut.token_ids[-1] not in STOP_IDS
    base = {"logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]}}
    assert parse_token_choice({**base, "finish_reason": "length"}).finish_reason == "length"
    for reason in ("stop", "abort", "eos", None):
        assert parse_token_choice({**base, "finish_reason": reason}).finish_reason == "stop"


def test_malformed_token_responses_are_error_generations(server: FakeServer) -> None:
    # A server that ignores return_tokens_as_token_ids sends token texts: not usable ids.
    policy = make_policy(server, extra_body={"return_tokens_as_token_ids": None})
    [generation] = policy.generate([request("hi")])
    assert generation.finish_reason == "error" and "token_id:<id>" in str(generation.error)
    # A server that changed the prompt (e.g. prepended a BOS) is caught by the echoed ids.
    with pytest.raises(ServerError, match="changed the prompt"):
        parse_token_choice({"prompt_token_ids": [1, 2, 3], "token_ids": [4]}, prompt_ids=[2, 3])
    with pytest.raises(ServerError, match="1 token ids but 2 log-probabilities"):
        parse_token_choice({"token_ids": [4], "logprobs": {"token_logprobs": [-1.0, -2.0]}})
    with pytest.raises(ServerError, match=r"no logprobs\.token_logprobs"):
        parse_token_choice({"token_ids": [4]})


def test_invalid_requests_fail_alone_without_reaching_the_server(server: FakeServer) -> None:
    policy = make_policy(server)
    good = request("ok")
    results = policy.generate([
        GenerationRequest([], SamplingParams()), good, request("x", max_new_tokens=-1),
        request("y", temperature=-1.0), request("z", top_p=0.0), request("w", max_new_tokens=0),
    ])
    assert [g.finish_reason for g in results] == ["error", "stop", "error", "error", "error", "length"]
    assert "empty prompt" in str(results[0].error) and "max_new_tokens" in str(results[2].error)
    assert results[5].token_ids == [] and results[5].error is None  # a zero budget needs no server
    assert [b["prompt"] for b in server.bodies] == [good.prompt_ids]


def test_a_batch_of_twenty_goes_concurrently_and_returns_in_order(server: FakeServer) -> None:
    # Even prompts answer late, so responses arrive out of order.
    server.delay = lambda body: 0.05 if sum(body["prompt"]) % 2 == 0 else 0.0
    policy = make_policy(server, max_concurrency=8)
    requests = [request(f"task number {i}", seed=i, max_new_tokens=32) for i in range(20)]
    results = policy.generate(requests)
    assert len(results) == 20 and server.max_in_flight > 1
    for req, generation in zip(requests, results, strict=True):
        ids, logprobs, _ = fake_sample(req.prompt_ids, 32, list(STOP_IDS))
        assert (generation.token_ids, generation.logprobs) == (ids, logprobs)
    policy.close()


def test_batch_prompts_sends_one_request_per_group_of_equal_params(server: FakeServer) -> None:
    policy = make_policy(server, batch_prompts=True)
    requests = [request(f"task number {i}", seed=i % 2, max_new_tokens=32) for i in range(20)]
    results = policy.generate(requests)
    assert len(server.bodies) == 2
    assert sorted(len(b["prompt"]) for b in server.bodies) == [10, 10]
    for body in server.bodies:
        assert [requests.index(r) % 2 for r in requests if r.prompt_ids in body["prompt"]] == [body["seed"]] * 10
    for req, generation in zip(requests, results, strict=True):  # choices came back reversed
        ids, logprobs, _ = fake_sample(req.prompt_ids, 32, list(STOP_IDS))
        assert (generation.token_ids, generation.logprobs) == (ids, logprobs)


# ------------------------------------------------------------------ retries and failures


def test_server_errors_and_rate_limits_are_retried_then_succeed(server: FakeServer) -> None:
    server.fail_statuses = [500, 503, 429]
    policy = make_policy(server, max_retries=3)
    [generation] = policy.generate([request("retry me")])
    assert generation.error is None and generation.finish_reason == "stop"
    assert len(server.bodies) == 4 and all(b == server.bodies[0] for b in server.bodies)


def test_retries_run_out_and_client_errors_are_not_retried(server: FakeServer) -> None:
    server.fail_statuses = [500, 500]
    [exhausted] = make_policy(server, max_retries=1).generate([request("a")])
    assert exhausted.finish_reason == "error" and "after 2 attempts" in str(exhausted.error)
    assert "injected 500" in str(exhausted.error)
    server.bodies.clear()
    server.fail_statuses = [400]
    [rejected] = make_policy(server, max_retries=3).generate([request("b")])
    assert rejected.finish_reason == "error" and "HTTP 400" in str(rejected.error)
    assert "injected 400" in str(rejected.error) and len(server.bodies) == 1


def test_a_dead_server_gives_error_generations_not_exceptions() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = OpenAIPolicy("m", f"http://127.0.0.1:{port}/v1", tokenizer=BYTES, timeout_s=1.0,
                          max_retries=2, backoff_s=0.01)
    results = policy.generate([request("a"), request("b"), request("c")])
    assert [g.finish_reason for g in results] == ["error"] * 3
    assert all(g.token_ids == [] and "after 3 attempts" in str(g.error) for g in results)
    policy.close()


def test_a_hanging_server_times_out_into_an_error(server: FakeServer) -> None:
    server.delay = lambda body: 1.0
    [generation] = make_policy(server, timeout_s=0.2, max_retries=0).generate([request("slow")])
    assert generation.finish_reason == "error" and "timed out" in str(generation.error).lower()


# ------------------------------------------------------------------ text-only mode


def test_text_mode_sends_text_and_retokenizes_the_reply(server: FakeServer) -> None:
    policy = make_policy(server, mode="text")
    stopped, cut = request("list files", seed=3), request("list more")
    server.text_reply = lambda prompt: ("ls -la", "stop") if "files" in prompt else ("ls -la /tm", "length")
    first, second = policy.generate([stopped, cut])
    bodies = {b["prompt"]: b for b in server.bodies}
    body = bodies[BYTES.decode(stopped.prompt_ids)]
    assert body["prompt"].startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert body["stop"] == ["<|im_end|>", "<|endoftext|>"] and body["seed"] == 3
    assert "logprobs" not in body and "stop_token_ids" not in body and "return_token_ids" not in body
    assert first.token_ids == BYTES.completion_ids("ls -la") and first.finish_reason == "stop"
    assert second.token_ids == BYTES.encode("ls -la /tm") and second.finish_reason == "length"
    assert all(math.isnan(x) for x in first.logprobs + second.logprobs)
    assert len(first.logprobs) == len(first.token_ids)
    assert policy.token_exact is False
    assert policy.capabilities["text_only"] is True and policy.capabilities["logprobs"] is False


def test_chat_text_mode_sends_the_chatml_prompt_as_messages(server: FakeServer) -> None:
    policy = make_policy(server, mode="text", chat=True)
    server.text_reply = lambda messages: ("cat notes.txt", "stop")
    [generation] = policy.generate([request("read the notes")])
    assert server.paths == ["/v1/chat/completions"]
    assert server.bodies[0]["messages"] == [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "read the notes"},
    ]
    assert generation.token_ids == BYTES.completion_ids("cat notes.txt")
    assert policy.capabilities == {"token_exact": False, "logprobs": False, "text_only": True,
                                   "endpoint": "/chat/completions"}


def test_parse_chatml_round_trips_and_rejects_what_a_chat_endpoint_cannot_take() -> None:
    text = "<|im_start|>system\nA\nB<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert parse_chatml(text) == [{"role": "system", "content": "A\nB"}, {"role": "user", "content": "q"}]
    with pytest.raises(ValueError, match="cannot continue"):
        parse_chatml(text + "partial")
    with pytest.raises(ValueError, match="outside ChatML"):
        parse_chatml("stray " + text)


def test_invalid_configurations_are_rejected() -> None:
    with pytest.raises(ValueError, match="mode"):
        OpenAIPolicy("m", tokenizer=BYTES, mode="logits")
    with pytest.raises(ValueError, match="chat=True needs mode='text'"):
        OpenAIPolicy("m", tokenizer=BYTES, chat=True)


def test_default_tokenizer_is_the_embedded_models(server: FakeServer) -> None:
    pytest.importorskip("transformers")
    from harnessrl.harness.chat import HFChatTokenizer
    from harnessrl.policy import embedded

    folder = embedded.default_cache_root() / embedded.EMBEDDED_CACHE_SUBDIR
    if not (folder / embedded.MARKER_FILE).is_file():
        pytest.skip("the embedded model is not converted yet (test_hf_policy converts it)")
    policy = OpenAIPolicy("smollm2", server.base_url, mode="text")
    assert isinstance(policy.tokenizer, HFChatTokenizer)
    prompt = policy.tokenizer.render([Message("user", "hello there", "task")]).ids
    [generation] = policy.generate([GenerationRequest(prompt, SamplingParams())])
    assert server.bodies[0]["prompt"] == "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    assert generation.token_ids == [*policy.tokenizer.encode("ls -la"), policy.tokenizer.im_end_id]


# ------------------------------------------------------------------ end to end


def test_an_episode_through_the_server_passes_a_t0_task(server: FakeServer, tmp_path: Path) -> None:
    harness = Harness.named("S0-T0-O0-C0-W0")
    task = Task(
        id="hello-file",
        instruction="Create a file named hello.txt containing the word hello.",
        verifier=FileEquals("hello.txt", "hello"),
        gold=[Action.write("hello.txt", "hello\n"), Action.submit("")],
    )
    actions = [harness.tools.render(action, thought="Doing it.") for action in task.gold]

    def sampler(prompt: list[int], max_tokens: int, stop_ids: list[int]) -> Sample:
        # The turn is the number of assistant headers before the generation prompt.
        turn = BYTES.decode(prompt).count("<|im_start|>assistant\n") - 1
        ids = BYTES.completion_ids(actions[turn])
        return ids, [-0.25] * len(ids), "stop"

    server.sampler = sampler
    trajectory = run_episode(harness, task, make_policy(server), seed=7)
    assert trajectory.passed and trajectory.status == "submitted", (trajectory.status, trajectory.error)
    assert trajectory.policy == "openai:fake-model"
    assert [t.completion_ids for t in trajectory.turns] == [BYTES.completion_ids(a) for a in actions]
    assert all(t.completion_logprobs == [-0.25] * len(t.completion_ids) for t in trajectory.turns)
    assert [b["prompt"] for b in server.bodies] == [t.prompt_ids for t in trajectory.turns]
    assert all(b["seed"] == 7 and b["stop_token_ids"] == list(STOP_IDS) for b in server.bodies)
