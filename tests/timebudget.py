"""The suite's time budget, a pytest plugin loaded by tests/conftest.py (docs/testing.md, "The budget").

- **Every test has a budget**: 20 s (:data:`TEST_BUDGET_S`) for its setup, call and teardown together, less the
  setup of the fixtures wider than a function that it was the first to need: those are timed apart, each with a
  budget of its own (:data:`FIXTURE_BUDGET_S`), since the first test to use a module's shared job should not pay
  for the module's other tests.
- **A test or fixture that needs more says so and why**: ``@pytest.mark.budget(seconds, reason="...")`` on a test,
  ``@budget(seconds, "...")`` under ``@pytest.fixture`` on a fixture. A marker without a reason is refused.
- **The fast tier** (the tests not marked ``slow``, with the fixtures they set up) has :data:`FAST_TIER_S` seconds.
- **Enforced in CI** (``CI=true``, as ``.ci/run`` is run, or ``RAPIDS_ATTN_ENFORCE_BUDGET=1``): at the end of the
  run, a test, fixture or fast tier over its budget is named and the run fails (exit 1) though every test passed.
  Elsewhere each is a warning, so a developer's busy laptop does not fail a test that is not slow.
- **Budgets are in seconds of the reference machine** (2 cores, the project's CI machine): the run times a fixed
  piece of work at its start and again at its end (:func:`host_factor`, the median of five) and scales every budget
  by how much slower this host ran (the larger of the two; 1 at least, :data:`MAX_FACTOR` at most), so a slower
  or busier host is not failed for being slow and a regression still is.
- **The time map**: ``--time-map PATH`` (or ``RAPIDS_ATTN_TIME_MAP``) writes every test's phases, every wide
  fixture, each tier's total and the run's wall clock as JSON; ``python -m tools.test_times PATH`` prints the
  tables docs/testing.md keeps.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: a test's budget in reference-machine seconds: setup, call and teardown, less the wide fixtures it set up
#: (``RAPIDS_ATTN_TEST_BUDGET_S`` sets another: the plugin's own tests do)
TEST_BUDGET_S = float(os.environ.get("RAPIDS_ATTN_TEST_BUDGET_S") or 20)
#: a fixture wider than a function: its own setup, less the wide fixtures it needed (they are timed on their own)
FIXTURE_BUDGET_S = TEST_BUDGET_S
#: the fast tier, every test not marked slow with the fixtures they set up: what a commit waits for
#: (``RAPIDS_ATTN_FAST_TIER_S`` sets another)
FAST_TIER_S = float(os.environ.get("RAPIDS_ATTN_FAST_TIER_S") or 300)
#: the most a slow host stretches a budget: past it a budget fails however slow the host is
MAX_FACTOR = 3.0
#: :func:`_probe`'s median of five on the reference machine (the 2-core CI machine, quiet), in seconds
REFERENCE_PROBE_S = 0.115


def budget(seconds: float, reason: str):
    """A wide fixture's budget, over :data:`FIXTURE_BUDGET_S`: ``@pytest.fixture(...)`` above, ``@budget(...)`` below."""
    _check_budget(seconds, reason, "budget()")

    def mark(func):
        func._time_budget = (float(seconds), reason)
        return func

    return mark


def _check_budget(seconds, reason, where: str) -> None:
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise pytest.UsageError(f"{where}: the budget must be a positive number of seconds, not {seconds!r}")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(f"{where}: a budget over the default needs a reason (reason='why it takes this long')")


def _marked(mark) -> tuple:
    """(seconds, reason) of a ``budget`` marker, given by position or by name."""
    args = list(mark.args) + [None, None]
    return mark.kwargs.get("seconds", args[0]), mark.kwargs.get("reason", args[1])


def declared_seconds(item) -> float:
    """The budget a test declares with its marker, 0 where it has none (the default's tests are short)."""
    mark = item.get_closest_marker("budget")
    return float(_marked(mark)[0] or 0) if mark is not None else 0.0


def _probe() -> float:
    """A fixed piece of interpreter and numpy work on one thread, the kind the tests do: its seconds."""
    import numpy as np

    t = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i % 7
    x = np.random.default_rng(0).standard_normal(2_000_000)
    for _ in range(5):
        x = np.tanh(x * 1.5)  # elementwise: one thread, as a BLAS call would not be
    np.sort(x)
    return time.perf_counter() - t


def host_factor() -> tuple[float, float]:
    """(factor, probe seconds): how much slower than the reference machine this host runs, 1 to :data:`MAX_FACTOR`.
    ``RAPIDS_ATTN_HOST_FACTOR`` sets the factor instead (the plugin's own tests use it)."""
    if os.environ.get("RAPIDS_ATTN_HOST_FACTOR"):
        return float(os.environ["RAPIDS_ATTN_HOST_FACTOR"]), 0.0
    import statistics

    seconds = statistics.median(_probe() for _ in range(5))
    return min(MAX_FACTOR, max(1.0, seconds / REFERENCE_PROBE_S)), seconds


def enforced() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("RAPIDS_ATTN_ENFORCE_BUDGET") == "1"


@dataclass
class _Test:
    phases: dict[str, float] = field(default_factory=dict)
    wide: float = 0.0  # the wide fixtures this test set up (their inclusive seconds): not the test's own
    fixtures: list[str] = field(default_factory=list)
    slow: bool = False
    budget: float = TEST_BUDGET_S
    reason: str = ""

    @property
    def own(self) -> float:
        return max(0.0, sum(self.phases.values()) - self.wide)


@dataclass
class _Fixture:
    scope: str
    seconds: float  # its own setup, less the wide fixtures it needed
    first_test: str
    budget: float = FIXTURE_BUDGET_S
    reason: str = ""


class TimeBudget:
    """One run's budget and time map (an instance per pytest run, so a run inside a test keeps its own)."""

    def __init__(self, config):
        self.config = config
        self.tests: dict[str, _Test] = {}
        self.fixtures: dict[str, _Fixture] = {}
        self.current: str | None = None
        self._stack: list[float] = []  # per wide fixture being set up: the wide fixtures set up inside it
        self.factor, self.probe_s = 1.0, 0.0
        self.started = time.time()
        self.tier_over: str | None = None
        self.over: list[str] = []  # what was over its budget, judged at the end of the run
        self.workers = 0  # pytest-xdist workers whose times were added up here (0: the tests ran in this process)

    # -- where the time goes -----------------------------------------------------------------------------------

    def pytest_sessionstart(self, session):
        self.factor, self.probe_s = host_factor()
        self.started = time.time()

    def pytest_collection_modifyitems(self, items):
        for item in items:
            mark = item.get_closest_marker("budget")
            if mark is not None:
                _check_budget(*_marked(mark), f"{item.nodeid}: @pytest.mark.budget")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        mark = item.get_closest_marker("budget")
        t = self.tests.setdefault(item.nodeid, _Test())
        t.slow = item.get_closest_marker("slow") is not None
        if mark is not None:
            t.budget, t.reason = declared_seconds(item), _marked(mark)[1]
        self.current = item.nodeid
        try:
            return (yield)
        finally:
            self.current = None

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        wide = fixturedef.scope != "function"
        if wide:
            self._stack.append(0.0)
        start = time.perf_counter()
        try:
            return (yield)
        finally:
            if wide:
                inclusive = time.perf_counter() - start
                nested = self._stack.pop()
                if self._stack:
                    self._stack[-1] += inclusive
                elif self.current is not None:
                    self.tests[self.current].wide += inclusive
                key = f"{fixturedef.baseid or '<conftest>'}::{fixturedef.argname}"
                seconds, reason = getattr(fixturedef.func, "_time_budget", (FIXTURE_BUDGET_S, ""))
                self.fixtures[key] = _Fixture(fixturedef.scope, inclusive - nested, self.current or "", seconds, reason)
                if self.current is not None:
                    self.tests[self.current].fixtures.append(key)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        t = self.tests.get(item.nodeid)
        if t is None:
            return report
        t.phases[call.when] = call.duration
        return report

    def probe_again(self) -> None:
        """The host's factor once more at the end of the run, when the tests have loaded it: the larger counts."""
        factor, seconds = host_factor()
        if factor > self.factor:
            self.factor, self.probe_s = factor, seconds

    def over_budget(self, nodeid: str) -> list[str]:
        t, f = self.tests[nodeid], self.factor
        lines = []
        if t.own > t.budget * f:
            lines.append(
                f"{nodeid} took {t.own:.1f} s, over its budget of {t.budget:g} s"
                + (f" (x{f:.2f} on this host)" if f > 1 else "")
                + ": make it smaller, share its job through a wider fixture, or mark it "
                "@pytest.mark.budget(seconds, reason='why')"
            )
        for key in t.fixtures:
            x = self.fixtures[key]
            if x.first_test == nodeid and x.seconds > x.budget * f:
                lines.append(
                    f"fixture {key} ({x.scope}) took {x.seconds:.1f} s to set up, over its budget of {x.budget:g} s: "
                    "make it smaller or give it @budget(seconds, 'why') from timebudget"
                )
        return lines

    # -- the tiers ------------------------------------------------------------------------------------------------

    def tiers(self) -> dict:
        out = {}
        for name, slow in (("fast", False), ("slow", True)):
            tests = {n for n, t in self.tests.items() if t.slow is slow}
            fixtures = sum(x.seconds for x in self.fixtures.values() if x.first_test in tests)
            own = sum(self.tests[n].own for n in tests)
            out[name] = {
                "tests": len(tests),
                "test_seconds": own,
                "fixture_seconds": fixtures,
                "seconds": own + fixtures,
            }
        return out

    # -- pytest-xdist: each worker times its own tests; the controller adds them up -----------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        raw = getattr(node, "workeroutput", {}).get("rapids_attn_time_map")
        if not raw:
            return
        m = json.loads(raw)
        self.workers += 1
        self.factor = max(self.factor, m["host_factor"])
        self.probe_s = max(self.probe_s, m["probe_seconds"])
        here = node.gateway.id  # a session fixture is set up once in each worker: each is its own entry
        for n, t in m["tests"].items():
            fixtures = [f"{k} [{here}]" for k in t["fixtures"]]
            self.tests[n] = _Test(t["phases"], t["wide_fixtures"], fixtures, t["slow"], t["budget"], t["reason"])
        for k, x in m["fixtures"].items():
            self.fixtures[f"{k} [{here}]"] = _Fixture(
                x["scope"], x["seconds"], x["first_test"], x["budget"], x["reason"]
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if hasattr(self.config, "workeroutput"):  # a pytest-xdist worker: the controller judges
            self.probe_again()
            self.config.workeroutput["rapids_attn_time_map"] = json.dumps(self.time_map())
            return
        if not self.workers:
            self.probe_again()
        fast = self.tiers()["fast"]
        share = fast["seconds"] / max(1, self.workers)
        if fast["tests"] and share > FAST_TIER_S * self.factor:
            self.tier_over = (
                f"the fast tier (the {fast['tests']} tests not marked slow) took {fast['seconds']:.0f} s in its tests and"
                f" their fixtures"
                + (f", {share:.0f} s over {self.workers} workers" if self.workers > 1 else "")
                + f", over its budget of {FAST_TIER_S:g} s"
                + (f" (x{self.factor:.2f} on this host)" if self.factor > 1 else "")
            )
        self.over = [line for n in self.tests for line in self.over_budget(n)]
        if self.tier_over:
            self.over.append(self.tier_over)
        if self.over and enforced() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        path = self.config.getoption("time_map") or os.environ.get("RAPIDS_ATTN_TIME_MAP")
        if path:
            Path(path).write_text(json.dumps(self.time_map(), indent=1))

    def time_map(self) -> dict:
        return {
            "wall_seconds": time.time() - self.started,
            "workers": self.workers,
            "host_factor": self.factor,
            "probe_seconds": self.probe_s,
            "tiers": self.tiers(),
            "tests": {
                n: {
                    "phases": t.phases,
                    "own": t.own,
                    "wide_fixtures": t.wide,
                    "fixtures": t.fixtures,
                    "slow": t.slow,
                    "budget": t.budget,
                    "reason": t.reason,
                }
                for n, t in self.tests.items()
            },
            "fixtures": {
                k: {
                    "scope": x.scope,
                    "seconds": x.seconds,
                    "first_test": x.first_test,
                    "budget": x.budget,
                    "reason": x.reason,
                }
                for k, x in self.fixtures.items()
            },
        }

    def pytest_terminal_summary(self, terminalreporter):
        tr, f = terminalreporter, self.factor
        tiers = self.tiers()
        tr.write_sep("-", "time budget")
        tr.write_line(
            f"{len(self.tests)} tests; fast tier {tiers['fast']['seconds']:.0f} s ({tiers['fast']['tests']} tests), "
            f"slow tier {tiers['slow']['seconds']:.0f} s ({tiers['slow']['tests']} tests), in tests and their fixtures; "
            f"wall {time.time() - self.started:.0f} s; host factor {f:.2f} (probe {self.probe_s:.3f} s, reference "
            f"{REFERENCE_PROBE_S} s); budgets {'enforced' if enforced() else 'warned about'}"
        )
        over = self.over
        if not over:
            tr.write_line(f"every test, fixture and tier inside its budget (a test {TEST_BUDGET_S:g} s unless marked)")
        for line in over:
            tr.write_line(
                ("OVER BUDGET: " if enforced() else "WARNING: ") + line, red=enforced(), yellow=not enforced()
            )


def pytest_addoption(parser):
    parser.addoption("--time-map", default=None, help="write every test's and wide fixture's seconds here (JSON)")


def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds, reason): this test's time budget, over the default 20 s")
    config.pluginmanager.register(TimeBudget(config), "rapids-attn-time-budget")
