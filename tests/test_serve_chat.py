"""The Chat Completions endpoint through the official openai client, the runner, recording."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from harnessrl.harness.base import SPAN_POLICY
from harnessrl.harness.chat import ByteTokenizer
from harnessrl.policy.base import Generation, GenerationRequest, Policy, SamplingParams
from harnessrl.serve.app import create_app
from harnessrl.serve.engine import PolicyBatcher, PolicyFailure
from harnessrl.serve.prompt import PromptRenderer
from harnessrl.serve.recorder import ConversationRecorder
from harnessrl.serve.runner import ServerThread
from serve_helpers import WEATHER_TOOL, Scripted, running

TOOLS = [{"type": "function", "function": WEATHER_TOOL}]


def client(server, path: str = "/v1", **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + path, api_key=kwargs.pop("api_key", "anything"), max_retries=0, **kwargs)


def test_chat_completion_returns_policy_text_and_real_usage():
    with running() as (server, policy, _):
        reply = client(server).chat.completions.create(
            model="test-model", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
        )
    assert reply.choices[0].message.content == "echo: hi there"
    assert reply.choices[0].finish_reason == "stop"
    expected_prompt = PromptRenderer(ByteTokenizer()).render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}], []
    )
    assert reply.usage.prompt_tokens == len(expected_prompt)
    assert reply.usage.completion_tokens == len("echo: hi there") + 1  # and the stop token
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert policy.contexts[0].api == "chat"
    assert policy.contexts[0].messages[0] == {"role": "system", "content": "Be brief."}


def test_tool_call_is_parsed_and_its_result_rendered_back():
    with running() as (server, policy, _):
        api = client(server)
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        first = api.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me check."
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        assert call.id.startswith("call_")
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        second = api.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "The weather is sunny."
    assert second.choices[0].message.tool_calls is None
    context = policy.contexts[1]
    assert context.tools == [WEATHER_TOOL]
    assert context.messages[-1] == {"role": "tool", "tool_call_id": call.id, "name": "get_weather", "content": "sunny", "is_error": False}
    prompt = ByteTokenizer().decode(policy_prompt(server, policy))
    assert '"name": "get_weather"' in prompt.split("<|im_start|>user")[0]  # tools in the system prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


def policy_prompt(server, policy) -> list[int]:
    return server.app.state.recorder.records(policy.contexts[-1].session)[-1]["prompt_ids"]


def test_streaming_chat_completion_with_tool_call_deltas_and_usage():
    with running() as (server, _, _):
        stream = client(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
            stream=True, stream_options={"include_usage": True},
        )
        content, calls, finish, usage = "", {}, None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for delta in choice.delta.tool_calls or ():
                    entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                    entry["id"] = delta.id or entry["id"]
                    entry["name"] += (delta.function.name or "") if delta.function else ""
                    entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
                finish = choice.finish_reason or finish
    assert content == "Let me check."
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Oslo"}
    assert calls[0]["id"].startswith("call_")
    assert usage is not None and usage.completion_tokens > 10 and usage.prompt_tokens > 100


def test_stop_strings_cut_text_and_recorded_ids():
    with running(Scripted(lambda context: "alpha béta END gamma")) as (server, _, recorder):
        api = client(server)
        reply = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stop=["END", "béta"])
        # The next prompt shows the reply as the client has it, not the cut ids.
        api.chat.completions.create(model="m", messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "alpha "}, {"role": "user", "content": "y"}])
    assert reply.choices[0].message.content == "alpha "
    assert reply.choices[0].finish_reason == "stop"
    record, following = recorder.records(recorder.sessions()[0])
    # The sampled ids are kept up to the one that completed the stop string (é is two bytes).
    assert ByteTokenizer().decode(record["completion_ids"]) == "alpha béta"
    shown = ByteTokenizer().decode(following["prompt_ids"])
    assert "<|im_start|>assistant\nalpha <|im_end|>" in shown and "béta" not in shown
    assert reply.usage.completion_tokens == len("alpha béta".encode())


def test_max_tokens_and_context_window_limit_the_output():
    long_text = "word " * 100
    with running(Scripted(lambda context: long_text), context_length=400) as (server, _, _):
        api = client(server)
        short = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], max_completion_tokens=7)
        assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 7
        legacy = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], max_tokens=3)
        assert legacy.usage.completion_tokens == 3
        # Asking for more than the window holds is clamped to the room left.
        clamped = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "b" * 300}], max_tokens=10_000)
        assert clamped.usage.prompt_tokens + clamped.usage.completion_tokens == 400
        assert clamped.choices[0].finish_reason == "length"
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(model="m", messages=[{"role": "user", "content": "c" * 500}])
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "maximum context length is 400 tokens" in error["message"]


def test_logprobs_and_n_choices():
    with running() as (server, _, _):
        reply = client(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "ab"}], logprobs=True, n=3, seed=1
        )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    tokens = [entry.token for entry in reply.choices[0].logprobs.content]
    assert "".join(tokens) == "echo: ab<|im_end|>"
    assert all(entry.logprob == 0.0 for entry in reply.choices[0].logprobs.content)
    assert reply.usage.completion_tokens == 3 * (len("echo: ab") + 1)


def test_session_from_path_or_header_names_the_conversation():
    with running() as (server, policy, recorder):
        client(server, "/s/task-7/v1").chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}])
        client(server, default_headers={"X-Harnessrl-Session": "task-8"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "two"}]
        )
    assert sorted(recorder.sessions()) == ["task-7", "task-8"]
    assert [c.session for c in policy.contexts] == ["task-7", "task-8"]


def test_unnamed_requests_are_grouped_by_message_prefix_into_trajectories():
    with running() as (server, _, recorder):
        api = client(server)
        histories = {"a": [{"role": "user", "content": "first a"}], "b": [{"role": "user", "content": "first b"}]}
        for turn in range(3):
            for name, history in histories.items():
                reply = api.chat.completions.create(model="m", messages=history)
                history += [{"role": "assistant", "content": reply.choices[0].message.content},
                            {"role": "user", "content": f"{name} again {turn}"}]
    assert len(recorder.sessions()) == 2
    for session in recorder.sessions():
        trajectory = recorder.to_trajectory(session, task_id="t", config="ext:test", passed=True)
        assert len(trajectory.turns) == 3 and trajectory.reward == 1.0
        assert trajectory.turns[0].observation.endswith("again 0")
        # Token-in, token-out: each prompt extends the previous prompt and sampled ids, so the
        # whole conversation is one training sequence whose policy tokens are the sampled ids.
        (sample,) = trajectory.training_samples()
        sampled = [i for turn in trajectory.turns for i in turn.completion_ids]
        assert [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m] == sampled
        later_prompt = trajectory.turns[2]
        labels = later_prompt.prompt_labels()
        assert labels.count(SPAN_POLICY) == sum(len(t.completion_ids) for t in trajectory.turns[:2])


def test_side_requests_in_a_named_session_get_threads_of_their_own():
    with running() as (server, _, recorder):
        api = client(server, "/s/agent-run/v1")
        history = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "step 0"}]
        for turn in range(3):
            reply = api.chat.completions.create(model="m", messages=history)
            history += [{"role": "assistant", "content": reply.choices[0].message.content},
                        {"role": "user", "content": f"step {turn + 1}"}]
            # What agent programs do between turns: a title or summary request of their own.
            api.chat.completions.create(model="m", messages=[{"role": "system", "content": "Write a title."},
                                                              {"role": "user", "content": f"conversation {turn}"}])
    assert recorder.sessions() == ["agent-run"]
    records = recorder.records("agent-run")
    assert [r["thread"] for r in records] == [0, 1, 0, 2, 0, 3]
    trajectory = recorder.to_trajectory("agent-run")
    assert [t.text for t in trajectory.turns] == ["echo: step 0", "echo: step 1", "echo: step 2"]
    assert trajectory.metrics["threads"] == 4 and trajectory.metrics["session_requests"] == 6
    assert len(trajectory.training_samples()) == 1
    assert recorder.to_trajectory("agent-run", thread=2).turns[0].text == "echo: conversation 1"


def test_a_client_that_rewrites_a_per_request_context_message_stays_in_one_thread():
    # OpenClaw's pattern: each request carries a fresh context message that the next request
    # leaves out, so no request extends the previous one as a prefix; the server's own last
    # reply is still there, and the conversation must stay one thread (one trajectory).
    with running() as (server, _, recorder):
        api = client(server, "/s/claw/v1")
        history = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "step 0"}]
        for turn in range(3):
            context = {"role": "user", "content": f"[context for request {turn}]"}
            reply = api.chat.completions.create(model="m", messages=[*history, context])
            history += [{"role": "assistant", "content": reply.choices[0].message.content},
                        {"role": "user", "content": f"step {turn + 1}"}]
    records = recorder.records("claw")
    assert [r["thread"] for r in records] == [0, 0, 0]
    # Only what the client sent after the last reply is new in each later request.
    assert [m["content"] for m in records[2]["new_messages"]] == ["step 2", "[context for request 2]"]
    trajectory = recorder.to_trajectory("claw")
    assert [t.text for t in trajectory.turns] == [
        "echo: [context for request 0]", "echo: [context for request 1]", "echo: [context for request 2]"]
    assert trajectory.metrics["threads"] == 1


def test_records_are_written_as_jsonl_and_load_back(tmp_path):
    recorder = ConversationRecorder(tmp_path)
    with running(recorder=recorder) as (server, _, _):
        client(server, "/s/job/v1").chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    loaded = ConversationRecorder.load(tmp_path)
    assert loaded.sessions() == ["job"]
    assert loaded.to_trajectory("job").turns[0].completion_ids == recorder.records("job")[0]["completion_ids"]


def test_concurrent_requests_share_policy_batches_and_get_their_own_answers():
    release = threading.Event()
    policy = Scripted()
    inner = policy.generate

    def gated(requests):
        release.wait(timeout=30)
        return inner(requests)

    policy.generate = gated
    with running(policy) as (server, _, _):
        engine = server.app.state.engine
        answers = {}

        def ask(i):
            answers[i] = client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while engine.batcher._queue.qsize() < 7 and time.monotonic() < deadline:
            time.sleep(0.01)  # one request is in the gated batch, seven wait for the next
        release.set()
        for thread in threads:
            thread.join()
    assert {i: a.choices[0].message.content for i, a in answers.items()} == {i: f"echo: q{i}" for i in range(8)}
    assert engine.batcher.batches == 2 and engine.batcher.requests == 8


def test_api_key_is_checked_when_configured():
    with running(api_key="sekret") as (server, _, _):
        with pytest.raises(openai.AuthenticationError) as caught:
            client(server, api_key="wrong").models.list()
        assert caught.value.body["code"] == "invalid_api_key"
        assert [m.id for m in client(server, api_key="sekret").models.list()] == ["test-model"]


def test_malformed_chat_requests_get_openai_shaped_400s():
    with running() as (server, _, _):
        url = server.base_url + "/v1/chat/completions"
        cases = {
            b"{not json": None,
            b"[1, 2]": None,
            json.dumps({"model": "m"}).encode(): "messages",
            json.dumps({"messages": []}).encode(): "messages",
            json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(): "messages[0].role",
            json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(): "max_tokens",
            json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(): "temperature",
            json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}).encode(): "tools[0].function",
        }
        for body, param in cases.items():
            response = httpx.post(url, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, body
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
        missing = httpx.post(server.base_url + "/v1/nothing", json={})
        assert missing.status_code == 404 and "error" in missing.json()


def test_server_thread_serves_on_a_unix_socket(tmp_path):
    socket_path = tmp_path / "serve.sock"
    app = create_app(Scripted(), model_name="uds-model")
    with ServerThread(app, uds=socket_path) as server:
        http = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url=server.base_url)
        api = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", http_client=http, max_retries=0)
        reply = api.chat.completions.create(model="uds-model", messages=[{"role": "user", "content": "via socket"}])
        assert reply.choices[0].message.content == "echo: via socket"
    assert not server._thread


def test_sdk_stream_helper_accumulates_tool_calls():
    with running() as (server, _, _), client(server).chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "Weather in Quito?"}], tools=TOOLS
    ) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Quito"}
    assert final.choices[0].finish_reason == "tool_calls" and final.choices[0].message.content == "Let me check."


def test_generation_does_not_block_the_event_loop():
    release, started = threading.Event(), threading.Event()
    policy = Scripted()
    inner = policy.generate

    def slow(requests):
        started.set()
        release.wait(timeout=30)
        return inner(requests)

    policy.generate = slow
    with running(policy) as (server, _, _):
        answer = {}
        asking = threading.Thread(target=lambda: answer.setdefault("reply", client(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "slow"}])))
        asking.start()
        assert started.wait(timeout=30)
        # While the policy is busy, the server still answers other requests.
        assert httpx.get(server.base_url + "/health", timeout=10).json()["status"] == "ok"
        assert [m.id for m in client(server).models.list()] == ["test-model"]
        release.set()
        asking.join()
    assert answer["reply"].choices[0].message.content == "echo: slow"


class FailingPolicy(Scripted):
    def generate(self, requests):
        return [Generation([], [], "error", error="out of memory") for _ in requests]


def test_policy_errors_are_500s_in_each_apis_shape():
    with running(FailingPolicy()) as (server, _, recorder):
        chat = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        messages = httpx.post(server.base_url + "/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
        responses = httpx.post(server.base_url + "/v1/responses", json={"input": "x"})
    assert chat.status_code == messages.status_code == responses.status_code == 500
    assert chat.json()["error"]["type"] == "server_error" and "out of memory" in chat.json()["error"]["message"]
    assert responses.json()["error"]["type"] == "server_error"
    assert messages.json() == {"type": "error", "error": {"type": "api_error", "message": "out of memory"}}
    assert recorder.sessions() == []  # nothing was sampled, nothing recorded


class Ticking(Policy):
    """Writes ``a`` every 10 ms up to ``max_new_tokens``, handing each to the token sink: a
    slow model, whose generation can be in progress when the server closes."""

    name = "ticking"
    tokenizer = ByteTokenizer()

    def __init__(self) -> None:
        self.seen: list[int] = []  # max_new_tokens of every request it ran

    def generate(self, requests):
        return self.generate_stream(requests, lambda index, ids: None)

    def generate_stream(self, requests, on_tokens):
        generations = []
        for index, request in enumerate(requests):
            self.seen.append(request.params.max_new_tokens)
            ids = []
            for _ in range(request.params.max_new_tokens):
                time.sleep(0.01)
                ids.append(ord("a"))
                on_tokens(index, ids[-1:])
            generations.append(Generation(ids, [0.0] * len(ids), "length"))
        return generations


def test_closing_the_batcher_ends_the_generation_in_progress_and_fails_the_queued_requests():
    policy = Ticking()
    batcher = PolicyBatcher(policy)
    sampling = threading.Event()
    endless = batcher.submit(GenerationRequest([1], SamplingParams(max_new_tokens=10**9)), lambda ids: sampling.set())
    assert sampling.wait(timeout=30)
    queued = batcher.submit(GenerationRequest([1], SamplingParams(max_new_tokens=3)))
    batcher.close()  # returns once the worker stopped: both futures are settled
    with pytest.raises(PolicyFailure, match="BatcherClosed: the server closed during this generation"):
        endless.result(timeout=0)
    with pytest.raises(PolicyFailure, match="the server closed before this request ran"):
        queued.result(timeout=0)
    assert policy.seen == [10**9]  # the queued request never reached the policy
    later = batcher.submit(GenerationRequest([1], SamplingParams(max_new_tokens=3)))  # a new worker
    assert later.result(timeout=30).token_ids == [ord("a")] * 3
    batcher.close()


def test_a_request_whose_caller_gave_up_is_not_run():
    policy = Ticking()
    batcher = PolicyBatcher(policy)
    sampling = threading.Event()
    first = batcher.submit(GenerationRequest([1], SamplingParams(max_new_tokens=30)), lambda ids: sampling.set())
    assert sampling.wait(timeout=30)
    abandoned = batcher.submit(GenerationRequest([1], SamplingParams(max_new_tokens=7)))
    assert abandoned.cancel()
    kept = batcher.submit(GenerationRequest([1], SamplingParams(max_new_tokens=2)))
    assert len(first.result(timeout=30).token_ids) == 30 and len(kept.result(timeout=30).token_ids) == 2
    assert policy.seen == [30, 2]
    batcher.close()
