"""The `harnessrl serve` sub-command: a real process on a Unix socket, recording to a folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.cli import main
from harnessrl.cli.serve import checkpoint_model_folder
from harnessrl.rl.checkpoint import STATE_FILE

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_serve_process_answers_on_a_unix_socket_and_records(tmp_path):
    socket_path, records = tmp_path / "s.sock", tmp_path / "records"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "serve", "--policy", "random", "--uds", str(socket_path),
         "--record-dir", str(records), "--api-key", "k", "--context-tokens", "300"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://localhost") as client:
            response = client.post("/s/task-3/v1/chat/completions", headers={"Authorization": "Bearer k"},
                                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40})
            refused = client.get("/v1/models")
            too_long = client.post("/v1/messages", headers={"x-api-key": "k"},
                                   json={"max_tokens": 5, "messages": [{"role": "user", "content": "z" * 400}]})
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert response.status_code == 200, output
    assert refused.status_code == 401
    assert too_long.status_code == 400 and "> 300 maximum" in too_long.json()["error"]["message"]
    assert process.returncode == 0, output
    (line,) = (records / "task-3.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["session"] == "task-3" and record["completion_ids"]
    assert len(record["completion_ids"]) == response.json()["usage"]["completion_tokens"]


def test_serve_refuses_the_oracle_with_a_clear_error(capsys):
    assert main(["serve", "--policy", "oracle"]) == 2
    assert "cannot answer API requests" in capsys.readouterr().err


def test_checkpoint_folder_is_found_in_a_run_a_step_or_a_model_folder(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step-000004" / "model"
    step.mkdir(parents=True)
    (step / "config.json").write_text("{}")
    (step / "model.safetensors").write_bytes(b"weights")
    (step.parent / STATE_FILE).write_text("{}")  # with the weights and optimizer: a complete checkpoint
    (step.parent / "optim.pt").write_bytes(b"optimizer")
    assert checkpoint_model_folder(str(tmp_path / "run")) == step
    assert checkpoint_model_folder(str(step.parent)) == step
    assert checkpoint_model_folder(str(step)) == step
    with pytest.raises(FileNotFoundError, match="holds no model"):
        checkpoint_model_folder(str(tmp_path))
