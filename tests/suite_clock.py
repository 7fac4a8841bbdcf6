"""Where the suite's time goes, and a stop with a sentence when it is on course to miss its budget.

A pytest plugin (``conftest.py`` loads it). Every test's setup, call and teardown seconds are
added to its file and its kind (:func:`kind`: notebooks, the hub, the browser, Slurm, the Open
MPI venv, real engines, unit tests). At the end the terminal summary prints the table by kind
and the slowest files, and, with ``HPCLAB_TEST_TIMES=PATH``, writes every test's seconds to PATH
as JSON (``tests/durations.json`` is one such file, from a full run, read back below).

With ``HPCLAB_TEST_BUDGET_S=N`` (``.ci/run`` sets it from CI's hard limit less the stages
around ``make test``), before each test after the first the run so far is projected to its end: the seconds
still to come are the recorded seconds of the tests not yet run (``tests/durations.json``,
written by ``HPCLAB_TEST_TIMES=tests/durations.json make test`` on a quiet machine; a test not in
it counts as the median of the recorded ones; without the file only the time gone counts), scaled by this machine's pace so
far (seconds taken / seconds recorded for the tests already run, counted once a fifth of the
recorded time has gone by, and never below 1). When the projection passes N, the session stops
with one sentence naming the budget, the projection, the pace and the slowest kind, instead of
running on into CI's kill: a run that cannot finish in time says so while it can still be read.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

import pytest

RECORDED = Path(__file__).with_name("durations.json")
#: The pace is read once this share of the recorded time has run: earlier, one slow start (the
#: first engines, a cold import) would stand for the whole run.
PACE_AFTER = 0.2

KINDS = ("notebooks", "hub", "browser", "Open MPI", "Slurm", "engines", "unit")


def kind(item: pytest.Item) -> str:
    """The kind a test's time is counted under (first match in :data:`KINDS`'s order)."""
    marked = {m.name for m in item.iter_markers()}
    if "notebook" in marked:
        return "notebooks"
    if "hub" in marked:
        return "hub"
    if "browser" in marked:
        return "browser"
    if Path(str(item.fspath)).name == "test_openmpi.py":
        return "Open MPI"
    if "slurm" in marked:
        return "Slurm"
    return "engines" if "mpi" in marked else "unit"


class SuiteClock:
    """Seconds per test, per file and per kind; the budget's projection (module docstring)."""

    def __init__(self, budget_s: float | None, recorded: dict[str, float], now=time.monotonic):
        self.budget_s = budget_s
        self.recorded = recorded
        self.default_s = statistics.median(recorded.values()) if recorded else 0.0
        self.now = now
        self.start = now()
        self.seconds: dict[str, float] = defaultdict(float)
        self.kinds: dict[str, str] = {}
        self.files: dict[str, str] = {}
        self.pending: list[str] = []
        self.stopped = False  # the budget stopped the session

    def expected(self, nodeid: str) -> float:
        return self.recorded.get(nodeid, self.default_s)

    def projection(self) -> tuple[float, float]:
        """(projected seconds of the whole run, pace) from what has run so far."""
        elapsed = self.now() - self.start
        done = sum(self.expected(n) for n in self.seconds)
        todo = sum(self.expected(n) for n in self.pending if n not in self.seconds)
        pace = 1.0
        if done > 0 and done >= PACE_AFTER * (done + todo):
            pace = max(1.0, elapsed / done)
        return elapsed + pace * todo, pace

    def slowest_kind(self) -> str:
        by_kind = self.by("kind")
        return max(by_kind, key=lambda k: by_kind[k][1]) if by_kind else "none yet"

    def by(self, what: str) -> dict[str, tuple[int, float]]:
        """{kind or file: (tests, seconds)}."""
        names = self.kinds if what == "kind" else self.files
        table: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for nodeid, seconds in self.seconds.items():
            row = table[names[nodeid]]
            row[0] += 1
            row[1] += seconds
        return {k: (n, s) for k, (n, s) in table.items()}


_CLOCK: list[SuiteClock] = []


def _recorded() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(RECORDED.read_text()).items()}
    except (OSError, ValueError):
        return {}


def pytest_configure(config: pytest.Config) -> None:
    budget = os.environ.get("HPCLAB_TEST_BUDGET_S", "").strip()
    _CLOCK.append(SuiteClock(float(budget) if budget else None, _recorded()))


def pytest_collection_finish(session: pytest.Session) -> None:
    clock = _CLOCK[-1]
    clock.pending = [item.nodeid for item in session.items]
    for item in session.items:
        clock.kinds[item.nodeid] = kind(item)
        clock.files[item.nodeid] = item.nodeid.split("::", 1)[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    clock = _CLOCK[-1]
    if report.nodeid in clock.kinds:
        clock.seconds[report.nodeid] += report.duration


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    clock = _CLOCK[-1]
    if clock.budget_s is None or not clock.seconds:  # nothing has run: nothing to project from
        return
    projected, pace = clock.projection()
    if projected > clock.budget_s:
        elapsed = clock.now() - clock.start
        clock.stopped = True  # pytest prints no terminal summary for exit code 3: see below
        pytest.exit(
            f"the test stage is on course to take {projected / 60:.0f} min against its budget "
            f"of {clock.budget_s / 60:.0f} min (HPCLAB_TEST_BUDGET_S): {elapsed / 60:.0f} min "
            f"gone, this machine running at {pace:.1f}x the recorded pace "
            f"(tests/durations.json), the slowest kind so far '{clock.slowest_kind()}'; "
            "stopped before CI's hard limit, at test " + item.nodeid + ".",
            returncode=3,
        )


def table_lines(clock: SuiteClock, top: int = 30) -> list[str]:
    """The summary: seconds by kind (all of them), then the ``top`` slowest files."""
    total = sum(clock.seconds.values()) or 1.0
    lines = [f"{'kind':<12}{'tests':>7}{'seconds':>10}{'share':>8}"]
    by_kind = clock.by("kind")
    for name in KINDS:
        n, s = by_kind.get(name, (0, 0.0))
        lines.append(f"{name:<12}{n:>7}{s:>10.0f}{s / total:>8.0%}")
    lines.append(f"{'all':<12}{len(clock.seconds):>7}{total:>10.0f}")
    lines.append("")
    lines.append(f"{'slowest files':<56}{'tests':>7}{'seconds':>10}")
    files = sorted(clock.by("file").items(), key=lambda kv: -kv[1][1])
    lines += [f"{f:<56}{n:>7}{s:>10.0f}" for f, (n, s) in files[:top]]
    return lines


def _report(terminalreporter, clock: SuiteClock) -> None:
    """The table on the terminal and, with ``HPCLAB_TEST_TIMES``, every test's seconds."""
    if not clock.seconds or terminalreporter is None:
        return
    terminalreporter.section("where the time went (tests/suite_clock.py)")
    for line in table_lines(clock):
        terminalreporter.write_line(line)
    out = os.environ.get("HPCLAB_TEST_TIMES", "").strip()
    if out:
        rows = {n: round(s, 2) for n, s in sorted(clock.seconds.items())}
        Path(out).write_text(json.dumps(rows, indent=0) + "\n")
        terminalreporter.write_line(f"every test's seconds: {out}")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    _report(terminalreporter, _CLOCK[-1])


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    """After a budget stop (outside any test's output capture), the table all the same."""
    clock = _CLOCK[-1]
    if clock.stopped:
        _report(session.config.pluginmanager.get_plugin("terminalreporter"), clock)
