import pytest
import torch


@pytest.fixture(autouse=True)
def _synchronized():
    """Every test starts and ends with the device idle, so a failure in one
    test's asynchronous work cannot surface in the next test."""
    yield
    for i in range(torch.neuron.device_count()):
        torch.neuron.synchronize(i)
