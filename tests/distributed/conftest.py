import pytest

from tests.distributed.world import World


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/distributed/" in str(item.fspath):
            item.add_marker(pytest.mark.distributed)


@pytest.fixture(scope="session")
def _worlds():
    worlds = {}
    yield worlds
    for w in worlds.values():
        w.close()


@pytest.fixture
def world(_worlds):
    """Two ranks with one neuron device each and a "neuron" process group,
    shared by the tests until a test kills it (a timeout or a dead rank)."""
    w = _worlds.get("neuron")
    if w is None or not w.alive:
        w = _worlds["neuron"] = World(2)
    return w
