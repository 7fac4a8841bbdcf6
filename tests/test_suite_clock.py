"""The suite's clock (tests/suite_clock.py): the projection that stops a run on course to miss
CI's limit, and the stop itself in a real pytest session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from suite_clock import SuiteClock, table_lines

TESTS = Path(__file__).resolve().parent


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _clock(budget, recorded, now):
    clock = SuiteClock(budget, recorded, now)
    clock.pending = list(recorded) + ["new"]
    clock.kinds = {n: "unit" for n in clock.pending}
    clock.files = {n: "f.py" for n in clock.pending}
    return clock


def test_the_pace_is_read_after_a_fifth_and_scales_what_is_left():
    now = Clock()
    clock = _clock(150.0, {f"t{i}": 10.0 for i in range(5)}, now)
    now.t, clock.seconds["t0"] = 5.0, 5.0  # 10 of 60 recorded s done: too early for a pace
    assert clock.projection() == (5.0 + 50.0, 1.0)  # "new" counts as the median, 10 s
    now.t = 60.0
    clock.seconds["t1"] = 55.0  # 20 of 60 done in 60 s: three times the recorded pace
    projected, pace = clock.projection()
    assert pace == 3.0 and projected == 60.0 + 3.0 * 40.0
    now.t = 15.0  # faster than recorded: the pace never promises less than the record
    assert clock.projection() == (15.0 + 40.0, 1.0)


def test_a_run_past_its_budget_stops_with_the_sentence(tmp_path):
    (tmp_path / "test_two.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "suite_clock", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONPATH": str(TESTS),
            "HPCLAB_TEST_BUDGET_S": "0",
            "HPCLAB_TEST_TIMES": str(tmp_path / "t.json"),
        },
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "on course to take" in done.stdout and "HPCLAB_TEST_BUDGET_S" in done.stdout
    assert "test_two.py::test_b" in done.stdout  # stopped before the second test ran
    assert "where the time went" in done.stdout  # the table, though pytest prints no summary
    assert '"test_two.py::test_a"' in (tmp_path / "t.json").read_text()


def test_the_summary_table_has_every_kind_and_the_slowest_files():
    clock = _clock(None, {"a.py::t": 1.0, "b.py::t": 1.0}, Clock())
    clock.kinds["b.py::t"] = "notebooks"
    clock.files = {"a.py::t": "a.py", "b.py::t": "b.py", "new": "a.py"}
    clock.seconds.update({"a.py::t": 2.0, "b.py::t": 6.0})
    lines = table_lines(clock)
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:8]}
    assert list(rows) == ["notebooks", "hub", "browser", "Open", "Slurm", "engines", "unit"]
    assert rows["notebooks"] == ["1", "6", "75%"] and rows["unit"] == ["1", "2", "25%"]
    assert lines[8].split() == ["all", "2", "8"]
    assert [line.split()[0] for line in lines[11:]] == ["b.py", "a.py"]  # slowest first
