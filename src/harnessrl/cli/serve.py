"""The `serve` sub-command: a policy behind OpenAI- and Anthropic-compatible endpoints."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from typing import Any

from harnessrl.cli.common import command, policy_from_spec
from harnessrl.policy import POLICY_SPECS, Policy

API_KEY_VARIABLE = "HARNESSRL_API_KEY"
# The server's defaults (serve/app.py, serve/runner.py), repeated so that --help does not import them.
MAX_REQUEST_BYTES, BODY_TIMEOUT_S, HEADER_TIMEOUT_S = 16 << 20, 60.0, 30.0


def register(subparsers: Any) -> None:
    """Adds the `serve` sub-command."""
    p = command(subparsers, "serve", example="harnessrl serve --policy embedded --port 8000 --record-dir runs/served",
        help="serve a policy over OpenAI Chat Completions / Responses and Anthropic Messages",
        description=(
            "Serves a policy at /v1/chat/completions, /v1/responses and /v1/messages (also under "
            "/s/<session>/v1/...), recording every request's token ids per conversation."
        ),
    )
    p.add_argument("--policy", default="embedded", help=f"policy: {POLICY_SPECS}")
    p.add_argument("--checkpoint", default=None, help="serve a trained checkpoint: a run folder, a step-* folder or a model folder")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    p.add_argument("--uds", default=None, help="listen on this Unix-domain socket file instead of TCP")
    p.add_argument(
        "--api-key", default=None,
        help=f"require this key (Bearer or x-api-key); default: the {API_KEY_VARIABLE} environment variable "
        "when set (it keeps the key out of `ps`), else accept any key",
    )
    p.add_argument("--record-dir", default=None, help="append every exchange to <dir>/<session>.jsonl")
    p.add_argument("--model-name", default=None, help="model id to report (default: the policy's name)")
    p.add_argument("--max-tokens", type=int, default=1024, help="output tokens when a request names no limit")
    p.add_argument("--context-tokens", type=int, default=None, help="context window (default: the model's)")
    p.add_argument("--max-batch-size", type=int, default=64, help="requests per policy batch")
    p.add_argument("--continuous-batching", action=argparse.BooleanOptionalAction, default=None,
                   help="requests join the running decode batch at its next step (default: wherever the policy "
                   "can, the transformers policy); --no-continuous-batching: one batch at a time")
    p.add_argument("--seed", type=int, default=0, help="seed for scripted policies")
    p.add_argument("--max-request-bytes", type=int, default=None,
                   help="larger request bodies get a 413 before they are read (default: what the served "
                   f"context can hold, at most {MAX_REQUEST_BYTES})")
    p.add_argument("--max-inflight-bytes", type=int, default=None,
                   help="bytes all request bodies in flight may hold together; beyond, a 503 with Retry-After "
                   "(default: 4 largest bodies)")
    p.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S,
                   help="seconds a request body may take to arrive, else a 408 (default: %(default)s)")
    p.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S,
                   help="seconds a request's headers may take to arrive, else the connection is closed "
                   "(default: %(default)s)")
    p.set_defaults(func=run_serve)


def checkpoint_model_folder(path: str) -> Path:
    """Returns the transformers folder of a checkpoint given as a run folder (its latest
    step), a ``step-*`` folder, or a model folder."""
    from harnessrl.rl.checkpoint import latest_checkpoint

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"--checkpoint {path!r} is not a folder")
    step = latest_checkpoint(folder)
    for candidate in ([step / "model"] if step else []) + [folder / "model", folder]:
        if (candidate / "config.json").is_file():
            return candidate
        if (candidate / "adapter_config.json").is_file():
            raise ValueError(
                f"--checkpoint {path!r} is a LoRA adapter outside a run's checkpoint: pass the run "
                "folder or its step-* folder (they name the base model), or merge it into its base "
                "model (peft merge_and_unload) and pass that folder"
            )
    raise FileNotFoundError(f"--checkpoint {path!r} holds no model (no config.json in it, its model/ or checkpoints/)")


def checkpoint_policy(path: str) -> Policy:
    """Returns the policy of a checkpoint: a run's checkpoint (a run folder or a ``step-*``
    folder) loads with ``rl.checkpoint.load_checkpoint_policy`` (named after its run and
    step; a LoRA adapter is served unmerged, over its base model), any other model folder
    (``checkpoint_model_folder``) as an ``HFPolicy`` named after the folder."""
    from harnessrl.policy.hf import HFPolicy
    from harnessrl.rl.checkpoint import load_checkpoint_policy, resolve_checkpoint

    try:
        resolve_checkpoint(path)
    except FileNotFoundError:
        folder = checkpoint_model_folder(path)
        policy = HFPolicy(folder)
        policy.name = f"checkpoint:{(folder.parent if folder.name == 'model' else folder).name}"
        return policy
    return load_checkpoint_policy(path, merge_adapter=False)[0]


def load_policy(args: argparse.Namespace) -> Policy:
    if args.checkpoint:
        return checkpoint_policy(args.checkpoint)
    if args.policy == "oracle":
        raise ValueError(
            "the oracle replays gold solutions inside harnessrl episodes and cannot answer API "
            "requests; use --policy embedded, hf:<folder>, openai:<model>@<url> or random"
        )
    return policy_from_spec(args.policy, seed=args.seed)


def run_serve(args: argparse.Namespace) -> int:
    from harnessrl.serve.app import create_app
    from harnessrl.serve.recorder import ConversationRecorder
    from harnessrl.serve.runner import ServerThread

    for flag, value in (("--max-request-bytes", args.max_request_bytes),
                        ("--max-inflight-bytes", args.max_inflight_bytes), ("--body-timeout", args.body_timeout),
                        ("--header-timeout", args.header_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{flag} must be positive, got {value}")
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
    policy = load_policy(args)
    recorder = ConversationRecorder(args.record_dir)
    app = create_app(
        policy, model_name=args.model_name, api_key=api_key, recorder=recorder,
        default_max_tokens=args.max_tokens, max_batch_size=args.max_batch_size,
        context_length=args.context_tokens, max_request_bytes=args.max_request_bytes,
        max_inflight_bytes=args.max_inflight_bytes, body_timeout_s=args.body_timeout,
        continuous_batching=args.continuous_batching,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with ServerThread(app, host=args.host, port=args.port, uds=args.uds, log_level="info",
                      header_timeout_s=args.header_timeout) as server:
        where = f"unix socket {args.uds}" if args.uds else f"{server.base_url}/v1"
        print(f"harnessrl serve: {app.state.model_name} at {where}", flush=True)
        stop.wait()
    policy.close()
    recorder.close()
    return 0
