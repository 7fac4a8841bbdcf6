"""The serial test phase's measurement (notebook 06): one evaluation's time per run (the fast end
of the run's evaluations), its speed-up against 1 worker, and the verdict judged against the
1-worker repeat."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from hpclab.views.charts import serial_phase


def _run(validation: str, workers: int, eval_ms: list[float]) -> SimpleNamespace:
    """A finished run as the charts read it: rows without an evaluation have eval_ms 0."""
    interleaved = [ms for e in eval_ms for ms in (0.0, e)]
    history = pd.DataFrame({"step": np.arange(len(interleaved)), "eval_ms": interleaved})
    return SimpleNamespace(
        config={"validation": validation, "batch_per_worker": 64},
        history=history,
        epochs=pd.DataFrame(),
        workers=workers,
        summary={"world_size": workers, "status": "finished"},
        label=f"{validation} ×{workers}",
    )


def _sweep(sharded_2: float, rank0_2: float, one: tuple[float, float]) -> pd.DataFrame:
    """Four runs as the notebook's sweep makes them, each with 10 evaluations."""
    spread = [1.0] * 4 + [3.0] * 6  # slow moments, even most of a run's, do not move the figure
    return serial_phase.evaluation_speedups(
        [
            _run("sharded", 2, [sharded_2 * s for s in spread]),
            _run("rank0", 2, [rank0_2 * s for s in spread]),
            _run("sharded", 1, [one[0] * s for s in spread]),
            _run("rank0", 1, [one[1] * s for s in spread]),
        ]
    )


def test_times_speedups_and_the_repeat_noise_come_from_the_runs_evaluations():
    table = _sweep(10.0, 20.0, (18.0, 22.0))
    by = table.set_index(["validation", "workers"])
    assert by.loc[("sharded", 2), serial_phase.MS] == 10.0
    assert by.loc[("sharded", 2), "evaluations"] == 10
    assert by.loc[("sharded", 2), "speed-up vs 1 worker"] == 2.0  # against the 1-worker mean
    assert by.loc[("rank0", 2), "speed-up vs 1 worker"] == 1.0
    assert serial_phase.repeat_noise(table) == 0.2  # 4 ms of 20


def test_rank0_counts_as_serial_only_beyond_twice_the_repeat_and_the_minimum_gap():
    serial, said = serial_phase.rank0_is_serial(_sweep(10.0, 15.0, (20.0, 20.0)), workers=2)
    assert serial and "×1.50; needed ×1.10" in said  # a quiet repeat: the 10 % floor decides
    serial, said = serial_phase.rank0_is_serial(_sweep(10.0, 15.0, (16.0, 24.0)), workers=2)
    assert not serial and "needed ×1.80" in said  # a repeat 40 % apart cannot tell 1.5 apart
    serial, _ = serial_phase.rank0_is_serial(_sweep(10.0, 10.5, (20.0, 20.0)), workers=2)
    assert not serial  # 5 % is within what one slow core moves a run's time by
