"""The time budget (tests/timebudget.py) on small suites of its own, each run by pytest in a subprocess: a test over
its budget is a warning in a developer's run and fails CI's; a marked budget with a reason lets a test take
longer; a module's shared fixture is timed apart from the test that first needs it, against a budget of its own;
the fast tier is held to its budget; and under pytest-xdist the workers' times are added up in one place.

The budgets here are fractions of a second (``RAPIDS_ATTN_TEST_BUDGET_S``), the host factor is pinned to 1
(``RAPIDS_ATTN_HOST_FACTOR``), and each slow test sleeps past its budget by a wide margin."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import timebudget

SUITE = """
import time

import pytest
from timebudget import budget


@pytest.fixture(scope="module")
def shared():
    time.sleep(0.6)  # a module's shared job: timed apart from the test that first needs it
    return 1


@pytest.fixture(scope="module")
@budget(5, "a shared job that is long on purpose")
def shared_and_declared():
    time.sleep(0.6)
    return 1


def test_slow():
    time.sleep(0.6)


@pytest.mark.budget(5, reason="long on purpose")
def test_slow_and_declared():
    time.sleep(0.6)


def test_quick():
    pass


def test_uses_the_shared_fixture(shared):
    pass


def test_uses_the_declared_fixture(shared_and_declared):
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    here = str(Path(timebudget.__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("RAPIDS_ATTN_TEST_BUDGET_S", "0.3")
    monkeypatch.setenv("RAPIDS_ATTN_HOST_FACTOR", "1")
    for var in ("CI", "RAPIDS_ATTN_ENFORCE_BUDGET", "RAPIDS_ATTN_FAST_TIER_S", "RAPIDS_ATTN_TIME_MAP"):
        monkeypatch.delenv(var, raising=False)
    pytester.makepyfile(test_some=SUITE)
    return pytester


def test_outside_ci_a_test_over_its_budget_is_named_and_the_run_passes(suite):
    result = suite.runpytest_subprocess("-p", "timebudget", "-p", "no:xdist", "--time-map", "map.json")
    result.assert_outcomes(passed=5)
    assert result.ret == 0
    out = result.stdout.str()
    assert "budgets warned about" in out
    assert "WARNING: test_some.py::test_slow took" in out and "over its budget of 0.3 s" in out
    assert "test_slow_and_declared took" not in out and "test_quick took" not in out
    # the module fixture is timed apart: the test that first needed it is not over, the fixture is
    assert "test_uses_the_shared_fixture took" not in out
    assert "WARNING: fixture test_some.py::shared (module) took" in out
    assert "shared_and_declared (module) took" not in out
    m = json.loads((suite.path / "map.json").read_text())
    t = m["tests"]["test_some.py::test_uses_the_shared_fixture"]
    assert t["wide_fixtures"] >= 0.6 and t["own"] < 0.3
    assert m["fixtures"]["test_some.py::shared"]["seconds"] >= 0.6
    assert m["fixtures"]["test_some.py::shared_and_declared"]["budget"] == 5
    assert m["tests"]["test_some.py::test_slow_and_declared"]["budget"] == 5
    assert m["tiers"]["fast"]["tests"] == 5 and m["tiers"]["fast"]["seconds"] >= 2.4


def test_in_ci_a_test_or_fixture_over_its_budget_fails_the_run(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_subprocess("-p", "timebudget", "-p", "no:xdist")
    result.assert_outcomes(passed=5)  # every test passed, and the run fails all the same
    assert result.ret == 1
    out = result.stdout.str()
    assert "budgets enforced" in out
    over = [line for line in out.splitlines() if line.startswith("OVER BUDGET: ")]
    assert len(over) == 2, over
    assert over[0].startswith("OVER BUDGET: test_some.py::test_slow took")
    assert over[1].startswith("OVER BUDGET: fixture test_some.py::shared (module) took")


def test_in_ci_a_fast_tier_over_its_budget_fails_the_run(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("RAPIDS_ATTN_TEST_BUDGET_S", "100")
    monkeypatch.setenv("RAPIDS_ATTN_FAST_TIER_S", "1")
    result = suite.runpytest_subprocess("-p", "timebudget", "-p", "no:xdist")
    result.assert_outcomes(passed=5)
    assert result.ret == 1
    assert "OVER BUDGET: the fast tier (the 5 tests not marked slow) took" in result.stdout.str()


def test_a_budget_without_a_reason_is_refused(pytester, monkeypatch):
    here = str(Path(timebudget.__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(test_bare="import pytest\n\n@pytest.mark.budget(60)\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "timebudget", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "a budget over the default needs a reason" in result.stderr.str()


def test_under_xdist_the_workers_times_are_added_up_and_an_over_budget_test_still_fails(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_subprocess("-p", "timebudget", "-n", "2", "--time-map", "map.json")
    result.assert_outcomes(passed=5)
    assert result.ret == 1
    m = json.loads((suite.path / "map.json").read_text())
    assert m["workers"] == 2 and len(m["tests"]) == 5 and m["tiers"]["fast"]["tests"] == 5
    out = result.stdout.str()
    assert "OVER BUDGET: test_some.py::test_slow took" in out
    assert re.search(r"^OVER BUDGET: fixture test_some.py::shared \[gw[01]\] \(module\) took", out, re.MULTILINE)


def test_the_host_factor_stretches_every_budget_within_its_bounds(monkeypatch):
    monkeypatch.delenv("RAPIDS_ATTN_HOST_FACTOR", raising=False)
    monkeypatch.setattr(timebudget, "_probe", lambda: timebudget.REFERENCE_PROBE_S * 1.5)
    assert timebudget.host_factor()[0] == pytest.approx(1.5)
    monkeypatch.setattr(timebudget, "_probe", lambda: timebudget.REFERENCE_PROBE_S / 2)  # a faster host: no less
    assert timebudget.host_factor()[0] == 1.0
    monkeypatch.setattr(timebudget, "_probe", lambda: timebudget.REFERENCE_PROBE_S * 100)  # capped
    assert timebudget.host_factor()[0] == timebudget.MAX_FACTOR


def test_the_time_map_prints_as_the_tables_docs_testing_keeps(tmp_path, capsys):
    from tools.test_times import main

    m = {
        "wall_seconds": 12.0,
        "workers": 2,
        "host_factor": 1.0,
        "probe_seconds": 0.1,
        "tiers": {
            "fast": {"tests": 1, "test_seconds": 2.0, "fixture_seconds": 1.0, "seconds": 3.0},
            "slow": {"tests": 1, "test_seconds": 9.0, "fixture_seconds": 0.0, "seconds": 9.0},
        },
        "tests": {
            "tests/a.py::test_x": {"phases": {"setup": 1.0, "call": 0.4}, "own": 1.4, "slow": False, "budget": 20},
            "tests/b.py::test_y": {"phases": {"call": 9.0}, "own": 9.0, "slow": True, "budget": 60},
        },
        "fixtures": {"tests/a.py::job [gw0]": {"scope": "module", "seconds": 1.0, "first_test": "tests/a.py::test_x"}},
    }
    path = tmp_path / "map.json"
    path.write_text(json.dumps(m))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| fast | 1 | 2 | 1 | 3 |" in out and "| slow | 1 | 9 | 0 | 9 |" in out
    assert out.index("`tests/b.py::test_y` | slow") < out.index("`tests/a.py::test_x` | fast")
    assert "| `tests/a.py::job [gw0]` | module | 1.0 |" in out
    assert "| `tests/b.py` | 1 | 9 |" in out and "| `tests/a.py` | 1 | 2 |" in out  # the file's fixture counted
    (tmp_path / "bad.json").write_text("{")
    assert main([str(tmp_path / "bad.json")]) == 2
