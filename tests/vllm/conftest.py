"""The serving tier: vLLM on neuron (``make test-vllm``, its own virtual environment).

vLLM pins packages the main environment must not take (transformers<5.20,
setuptools==78.1.1), so these tests run in ``.venv-vllm`` (see the Makefile).
Where vLLM is not installed, this directory is not collected; every test in
it carries the ``vllm`` marker.
"""

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
