"""``hpclab.plan_panel(...)``: the planner's panel (:mod:`hpclab.views.panel.plan_section`) wired
to the planner (:mod:`hpclab.studies.planner`). The views may not import the studies, so the
wiring lives here: the section gets ``plan`` and ``measure`` as functions."""

from __future__ import annotations

import dataclasses
from pathlib import Path


def plan_panel(lab=None, *, measurements=None, target: float = 0.8):
    """The planner's panel. ``measurements``: a recorded measurement (a ``Measurements`` or its
    JSON file) to plan from at once; ``lab``: a started Lab the "Measure here" button measures
    on (a few minutes). A target cluster's network entered in the panel keeps the link between
    ranks of a node measured here."""
    from hpclab.core.errors import ConfigError
    from hpclab.studies import planner
    from hpclab.views.panel.plan_section import PlanSection

    if isinstance(measurements, str | Path):
        measurements = planner.Measurements.load(measurements)
    if lab is None and measurements is None:
        raise ConfigError("plan_panel needs a lab to measure on, or measurements= recorded ones.")

    def plan(*, measurements, network=None, **kwargs):
        if network is not None and network.intra is None:
            measured = planner.fit_hardware(measurements).network.intra
            network = dataclasses.replace(network, intra=measured)
        return planner.plan(measurements=measurements, network=network, **kwargs)

    def measure():
        return planner.measure(lab, target=section.widgets["target"].value)

    section = PlanSection(
        plan,
        measurements=measurements,
        measure=measure if lab is not None else None,
        target=target,
    )
    if measurements is not None:
        section.update()
    return section


__all__ = ["plan_panel"]
