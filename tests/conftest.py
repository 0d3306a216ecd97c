"""Shared pytest options: `--runslow` runs the tests marked slow (full sweeps)."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long sweep; runs with --runslow")
    config.addinivalue_line(
        "markers", "external_agent: runs an npm-installed external agent; skips when it is not installed")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow sweep: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
