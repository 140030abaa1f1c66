"""A pytest plugin that keeps the suite's time budget visible (issue 32), loaded by tests/conftest.py.

Every run names its slowest tests (``--durations=15`` in pyproject's addopts). This plugin adds, at the end of
the run, the number of tests and the seconds spent in them, and a warning naming every test that took longer
than ``RAPIDS_ATTN_TEST_BUDGET_S`` seconds (default 120; setup, call and teardown together, so a module
fixture's job counts against the first test that uses it). A warning only: a slow shared host must not fail
CI, but a slow test is seen the day it lands rather than the day CI runs past its limit.
"""

from __future__ import annotations

import os

_seconds: dict[str, float] = {}


def budget_s() -> float:
    return float(os.environ.get("RAPIDS_ATTN_TEST_BUDGET_S", "120"))


def pytest_runtest_logreport(report):
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    budget = budget_s()
    over = sorted(((s, n) for n, s in _seconds.items() if s > budget), reverse=True)
    terminalreporter.write_sep("-", f"time budget: {len(_seconds)} tests, {sum(_seconds.values()):.0f} s in tests")
    if not over:
        terminalreporter.write_line(f"no test took longer than its budget of {budget:g} s")
    for seconds, nodeid in over:
        terminalreporter.write_line(
            f"WARNING: {nodeid} took {seconds:.1f} s, over the budget of {budget:g} s per test "
            "(RAPIDS_ATTN_TEST_BUDGET_S): make it smaller, share its job through a fixture, or mark it slow",
            yellow=True,
        )
