"""A prompt that cannot fit the served context is refused for its length before it is
tokenized (a 4 MiB prompt costs no tokenizer call, and a small request beside it is served),
and the request body limit follows the served context by default (serve/limits.py)."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from harnessrl.policy.hf import HFPolicy
from harnessrl.policy.scripted import RandomPolicy
from harnessrl.serve.app import MAX_REQUEST_BYTES, create_app
from harnessrl.serve.limits import BODY_BASE_BYTES, JSON_BYTES_PER_TEXT_BYTE
from harnessrl.serve.runner import ServerThread

CONTEXT = 2048
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


@pytest.fixture(scope="module")
def policy(tiny_model) -> HFPolicy:
    loaded = HFPolicy(str(tiny_model), device="cpu", dtype="float32")
    yield loaded
    loaded.close()


class EncodedLengths:
    """Records the length of every text the tokenizer encodes (and encodes it)."""

    def __init__(self, tokenizer) -> None:
        self.lengths: list[int] = []
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        self.lengths.append(len(text))
        return self._encode(text)


def body(path: str, text: str) -> dict:
    return {"max_tokens": 4, "messages": [{"role": "user", "content": text}]}


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(policy) -> None:
    huge = "lorem ipsum dolor " * ((4 << 20) // 18)  # about 4 MiB of text
    app = create_app(policy, context_length=CONTEXT, max_request_bytes=MAX_REQUEST_BYTES)
    tokenizer = app.state.engine.renderer.tokenizer  # the server's own copy
    seen = tokenizer.encode = EncodedLengths(tokenizer)
    with ServerThread(app) as server:
        def post(path: str, text: str) -> httpx.Response:
            return httpx.post(server.base_url + path, json=body(path, text), timeout=300)

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            big_chat, big_messages, small = pool.map(post, [CHAT, MESSAGES, CHAT], [huge, huge, "hello"])
        over = post(CHAT, "lorem ipsum " * 1500)  # over the context, but only tokenizing tells
    assert small.status_code == 200, small.text[:300]
    assert big_chat.status_code == 400 and big_chat.json()["error"]["code"] == "context_length_exceeded"
    assert f"maximum context length is {CONTEXT} tokens" in big_chat.json()["error"]["message"]
    assert "resulted in at least" in big_chat.json()["error"]["message"], big_chat.text[:300]
    assert big_messages.status_code == 400 and "prompt is too long: at least" in big_messages.json()["error"]["message"]
    assert max(seen.lengths) < 100_000, max(seen.lengths)  # the 4 MiB text was never tokenized
    assert over.status_code == 400 and "at least" not in over.json()["error"]["message"]
    assert "resulted in " in over.json()["error"]["message"]


def test_the_body_limit_follows_the_served_context_by_default(policy) -> None:
    bound = policy.tokenizer.max_token_bytes()
    assert bound is not None and 1 <= bound <= 256
    app = create_app(policy, context_length=CONTEXT)
    limit = BODY_BASE_BYTES + JSON_BYTES_PER_TEXT_BYTE * bound * CONTEXT
    assert app.state.max_request_bytes == limit < MAX_REQUEST_BYTES
    with ServerThread(app) as server:
        url = server.base_url + CHAT
        refused = httpx.post(url, content=b'{"messages": [], "pad": "' + b"x" * limit + b'"}',
                             headers={"content-type": "application/json"}, timeout=60)
        served = httpx.post(url, json=body(CHAT, "hello"), timeout=60)
    assert refused.status_code == 413 and str(limit) in refused.json()["error"]["message"]
    assert served.status_code == 200
    # bytes a token stands for: 1 for the byte tokenizer; no context known: the ceiling
    assert create_app(RandomPolicy(), context_length=4000).state.max_request_bytes == BODY_BASE_BYTES + 6 * 4000
    assert create_app(RandomPolicy()).state.max_request_bytes == MAX_REQUEST_BYTES
    assert create_app(policy, context_length=CONTEXT, max_request_bytes=1234).state.max_request_bytes == 1234
