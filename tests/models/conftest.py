"""Fixtures of the model zoo tests, and the coverage report they generate.

Every test here is parametrized by ``family`` and marked with the coverage
column it proves (``@pytest.mark.coverage("forward")``). After each test the
outcome and the ops that needed a host round trip are recorded; with
``TORCHNEURON_MODEL_COVERAGE=<path>`` the session ends by writing the table
to that path (``make model-coverage`` writes ``docs/model_coverage.md``).
"""

import os

import pytest

import torchneuron
from tests.models import coverage_report


def pytest_configure(config):
    config.addinivalue_line("markers", "coverage(column): the model coverage column a test proves")


@pytest.fixture(autouse=True)
def _clear_op_tracking():
    torchneuron.clear_op_tracking()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    marker = item.get_closest_marker("coverage")
    family = getattr(item, "callspec", None) and item.callspec.params.get("family")
    if marker is None or family is None:
        return report
    # A failure in setup or teardown fails the cell too; a pass needs the call.
    if report.when == "call" or report.failed:
        round_trips = _host_round_trips() if report.when == "call" else {}
        coverage_report.record(family.name, marker.args[0], report.passed and report.when == "call",
                               round_trips, item.nodeid)
    return report


def _host_round_trips() -> dict:
    """Ops computed on the host (data-dependent shapes) and scalar reads
    (``.item()``, ``if tensor:``), each of which waits for the device."""
    trips = torchneuron.get_fallback_ops()
    reads = torchneuron.get_executed_ops().get("aten::_local_scalar_dense")
    if reads:
        trips["aten::_local_scalar_dense"] = reads
    return trips


def pytest_sessionfinish(session):
    path = os.environ.get("TORCHNEURON_MODEL_COVERAGE")
    if path and coverage_report.cells():
        coverage_report.write(path)

