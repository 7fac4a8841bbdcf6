"""The control panel's two folded sections: "where the time goes" (notebooks 06 and 07) and
"beyond synchronous SGD" (notebooks 08 and 09), laid out as Accordions, closed.

Their controls are made with every other knob's (:mod:`hpclab.views.panel.widgets`, from the knob
table); the names of the knobs they hold are ``TIME_KNOBS`` and ``ADVANCED_KNOBS`` there.
ipywidgets comes in as the ``W`` argument, so importing this module stays fast.
"""

from __future__ import annotations

from typing import Any


def arrange(w: dict[str, Any], column, labelled, W: Any) -> tuple[Any, Any]:
    """The two folded sections (Accordions, closed), laid out with the panel's ``column`` and
    ``labelled`` (a knob's row of buttons, by name, with the knob's label) helpers."""
    time_box = W.HBox(
        [
            column(
                "Imbalance, and who validates",
                w["straggler_rank"],
                w["straggler_slowdown"],
                w["batch_skew"],
                labelled("validation"),
                w["timeline_steps"],
            ),
            column(
                "Input and shuffle",
                labelled("augment"),
                w["augment_cost"],
                labelled("shards"),
                labelled("shuffle"),
            ),
        ],
        layout={"flex_flow": "row wrap"},
    )
    time_section = W.Accordion(children=[time_box], selected_index=None)
    time_section.set_title(0, "Where the time goes: straggler, validation, input, timeline")
    time_section.add_class("hpclab-time-section")
    advanced_box = W.HBox(
        [
            column(
                "Model averaging",
                labelled("update"),
                w["average_every"],
                w["groups"],
                w["staleness"],
            ),
            column(
                "Silent data corruption",
                labelled("sdc_target"),
                w["sdc_layer"],
                w["sdc_bit"],
                w["sdc_rank"],
                w["sdc_step"],
                w["spike_factor"],
                w["rollback"],
            ),
        ],
        layout={"flex_flow": "row wrap"},
    )
    advanced = W.Accordion(children=[advanced_box], selected_index=None)
    advanced.set_title(0, "Beyond synchronous SGD: model averaging, silent data corruption")
    advanced.add_class("hpclab-advanced-section")
    return time_section, advanced


__all__ = ["arrange"]
