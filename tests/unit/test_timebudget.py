"""The time budget's warning (tests/timebudget.py): a test over the budget is named, the run still passes."""

import os
from pathlib import Path

import timebudget


def test_a_test_over_the_budget_is_named_and_the_run_still_passes(pytester, monkeypatch):
    monkeypatch.setenv("RAPIDS_ATTN_TEST_BUDGET_S", "0.3")
    here = str(Path(timebudget.__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(
        test_some="import time\n\ndef test_slow():\n    time.sleep(0.6)\n\ndef test_quick():\n    pass\n"
    )
    result = pytester.runpytest_subprocess("-p", "timebudget")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    out = result.stdout.str()
    assert "time budget: 2 tests" in out
    assert "WARNING: test_some.py::test_slow took" in out and "over the budget of 0.3 s" in out
    assert "test_quick took" not in out
