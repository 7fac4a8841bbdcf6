"""The planner's panel (hpclab.plan_panel, views/panel/plan_section.py): its knobs become
`hpclab.plan`'s arguments, a bad value is one sentence that keeps the last plan, a target
cluster entered in it reaches the plan's assumptions, and a measurement runs off the kernel's
thread. No engines: the measurement is a recorded one (tests/test_planner.py's known numbers)."""

from __future__ import annotations

import pytest
from test_planner import recorded

import hpclab
from hpclab.core.errors import ConfigError
from hpclab.studies import planner
from hpclab.views.panel.plan_section import PlanSection, parse_counts


def test_a_recorded_measurement_is_planned_at_once_with_the_panels_choices():
    section = hpclab.plan_panel(measurements=recorded())
    assert section.error is None and section.result is not None
    assert sorted({r["workers"] for r in section.result.allocation.rows}) == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
    ]
    assert section.widgets["measure"].disabled  # no lab: nothing to measure on
    section.widgets["workers"].value = "1, 2, 4"
    section.widgets["batches"].value = "64 128"
    section.update()
    rows = section.result.allocation.rows
    assert {r["workers"] for r in rows} == {1, 2, 4}
    assert {r["global_batch"] for r in rows} == {64, 128}


def test_a_bad_choice_is_one_sentence_and_the_last_plan_stays():
    section = hpclab.plan_panel(measurements=recorded())
    before = section.result
    section.widgets["workers"].value = "1, two, 4"
    section.update()
    assert section.result is before
    assert "ranks (GPUs) must be whole numbers" in section.error and "'1, two, 4'" in section.error
    assert "1, two, 4" in section.widgets["status"].value
    section.widgets["workers"].value = "1, 2"
    section.widgets["per_node"].value = 4  # a cluster needs its network too
    section.update()
    assert "needs both GPUs per node and the network" in section.error


def test_an_entered_cluster_reaches_the_plans_assumptions():
    section = hpclab.plan_panel(measurements=recorded())
    w = section.widgets
    w["per_node"].value, w["inter_gbit"].value, w["device_rate"].value = 4, 200.0, 2500.0
    section.update()
    kinds = {(a.kind, a.what.split(":")[0]) for a in section.result.allocation.assumptions}
    assert section.error is None
    assert any(k == "entered" for k, _ in kinds), kinds
    nodes = {r["workers"]: r for r in section.result.allocation.rows}
    assert nodes[64]["step_s"] > 0


def test_a_measurement_runs_off_the_kernels_thread_then_plans():
    section = PlanSection(planner.plan, measure=lambda: recorded())
    assert section.result is None and "Measure here first" in section.widgets["status"].value
    thread = section.measure_then_plan()
    thread.join(timeout=60)
    assert not thread.is_alive() and section.error is None and section.result is not None
    assert not section.widgets["plan"].disabled and not section.widgets["measure"].disabled


def test_counts_are_parsed_or_refused_by_name():
    assert parse_counts("ranks", "4, 1,2 2") == [1, 2, 4]
    for bad in ("", "0", "-1, 2", "x"):
        with pytest.raises(ConfigError, match="ranks must be whole numbers"):
            parse_counts("ranks", bad)
    with pytest.raises(ConfigError, match="needs a lab to measure on"):
        hpclab.plan_panel()
