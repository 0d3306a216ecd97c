"""Shared pytest options: `--runslow` runs the tests marked slow (full sweeps)."""

import os
import sys

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_configure(config):
    _share_the_cores()
    config.addinivalue_line("markers", "slow: a long sweep; runs with --runslow")
    config.addinivalue_line(
        "markers", "external_agent: runs an npm-installed external agent; skips when it is not installed")


def _share_the_cores():
    """Under pytest-xdist (`make test` runs one worker per core), each worker and the programs
    it starts get an equal share of the cores as torch threads (``OMP_NUM_THREADS``, unless
    set): two workers each running torch on every core make four threads fight for two cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    torch = sys.modules.get("torch")
    if torch is not None:  # imported before this hook: set its pool too
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow sweep: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def sandbox():
    """A fresh sandbox of the default backend (the tool-interface tests run their calls in it);
    a test module with a ``sandbox`` fixture of its own uses that one instead."""
    from harnessrl.sandbox import open_sandbox

    with open_sandbox() as box:
        yield box


def save_tiny_model(tmp_path_factory, name: str = "tiny", **overrides):
    """Saves a randomly initialised 2-layer model with SmolLM2's architecture and tokenizer
    (config fields in ``overrides`` replace the defaults) and returns its folder."""
    torch = pytest.importorskip("torch", reason="torch is installed by `make test`")
    transformers = pytest.importorskip("transformers", reason="transformers is installed by `make test`")
    from harnessrl.policy.embedded import embedded_model_dir

    source = embedded_model_dir()
    config = transformers.AutoConfig.from_pretrained(source)
    config.update({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    out = tmp_path_factory.mktemp(name) / "model"
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A randomly initialised 2-layer model with SmolLM2's architecture and tokenizer."""
    return save_tiny_model(tmp_path_factory)


@pytest.fixture(scope="session")
def mini_swe_agent() -> str:
    """mini-swe-agent installed into the agents cache (from PyPI; once per machine)."""
    from harnessrl.external.agents import get_agent
    from harnessrl.external.install import install

    agent = get_agent("mini-swe-agent")
    install(agent.name, agent.plan())
    return agent.name


def usable_backend_or_skip(name: str) -> str:
    """Returns sandbox backend ``name`` when this machine can run it, else skips the test."""
    from harnessrl.sandbox.backends import probe_backend

    usable, _uid, reason = probe_backend(name)
    if not usable:
        pytest.skip(f"backend {name} is not usable on this machine: {reason}")
    return name


# In CI (or with HARNESSRL_REQUIRE_SANDBOX_BACKENDS=1) a sandbox backend that cannot run fails
# the tests that need it: the adversarial suite must have run on both real backends.
REQUIRE_SANDBOX_BACKENDS = bool(os.environ.get("CI")) or os.environ.get("HARNESSRL_REQUIRE_SANDBOX_BACKENDS") == "1"


def required_backend(name: str) -> str:
    """Returns sandbox backend ``name`` when this machine can run it; otherwise fails the test
    in CI (see REQUIRE_SANDBOX_BACKENDS) and skips it elsewhere."""
    from harnessrl.sandbox.backends import probe_backend

    usable, _uid, reason = probe_backend(name)
    if not usable:
        message = f"backend {name} is not usable on this machine: {reason}"
        if REQUIRE_SANDBOX_BACKENDS:
            pytest.fail(message + " (required here: install bubblewrap and allow user namespaces)")
        pytest.skip(message)
    return name
