import gc

import pytest
import torch


def pytest_collection_finish(session):
    """What collection built (the OpInfo database alone is large) lives for
    the whole session: freezing it keeps every later gc.collect() (the
    conformance checks call it twice per op) from scanning it again."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _synchronized():
    """Every test starts and ends with the device idle, so a failure in one
    test's asynchronous work cannot surface in the next test."""
    yield
    for i in range(torch.neuron.device_count()):
        torch.neuron.synchronize(i)
