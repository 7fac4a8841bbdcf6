"""The checkpoint-interval formulas of notebook 11 (hpclab.studies.fault_tolerance), without
engines: Young's interval minimises the first-order waste; Daly's tends to Young's as C/M → 0,
corrects it by the expansion's terms, and caps at M where checkpointing costs more than it
saves. The notebook's own runs check the measured side (tests/test_notebooks.py, _claim_11)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpclab.core.errors import ConfigError
from hpclab.studies import fault_tolerance as ft


@pytest.mark.parametrize("cost, mtbf", [(0.05, 86_400.0), (30.0, 157_680.0), (600.0, 3_600.0)])
def test_young_minimises_the_first_order_waste(cost, mtbf):
    young = ft.young_interval(cost, mtbf)
    assert young == pytest.approx(math.sqrt(2 * cost * mtbf))
    grid = np.geomspace(young / 10, young * 10, 2001)
    best = grid[np.argmin([ft.waste(t, cost, mtbf) for t in grid])]
    assert best == pytest.approx(young, rel=5e-3)


def test_daly_refines_young_and_caps_at_the_mtbf():
    mtbf = 3_600.0
    for cost in (1e-3, 1e-1, 10.0):
        r = cost / (2 * mtbf)
        expect = math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - cost
        assert ft.daly_interval(cost, mtbf) == pytest.approx(expect)
    tiny = 1e-6
    assert ft.daly_interval(tiny, mtbf) == pytest.approx(ft.young_interval(tiny, mtbf), rel=1e-3)
    assert ft.daly_interval(2 * mtbf, mtbf) == mtbf


def test_the_intervals_table_and_bad_input():
    table = ft.intervals(0.05, mtbf_hours=(1, 24))
    assert list(table["job_mtbf_h"]) == [1, 24]
    assert table["young_interval_s"].is_monotonic_increasing
    assert (table["waste_at_young"] < 0.01).all()
    with pytest.raises(ConfigError, match="cost_s must be a finite number of seconds > 0"):
        ft.young_interval(0, 3600)
    with pytest.raises(ConfigError, match="interval_s must be > 0 seconds"):
        ft.waste(0, 1, 3600)
