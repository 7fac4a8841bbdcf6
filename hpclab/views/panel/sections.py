"""The control panel's two folded sections: "where the time goes" (notebooks 06 and 07) and
"beyond synchronous SGD" (notebooks 08 and 09), their widgets and their layout.

Kept apart from :mod:`hpclab.views.panel.widgets` (the main knobs), which calls :func:`build`
and :func:`arrange`; the names of the knobs they hold are ``TIME_KNOBS`` and ``ADVANCED_KNOBS``
there. ipywidgets comes in as the ``W`` argument, so importing this module stays fast.
"""

from __future__ import annotations

from typing import Any

from hpclab.core.catalog import (
    AUGMENTS,
    FLOAT32_BITS,
    MAX_AUGMENT_COST,
    MAX_WORKERS,
    SDC_TARGETS,
    SHARDS,
    SHUFFLES,
    UPDATES,
    VALIDATIONS,
)
from hpclab.core.config import RunConfig

DESC = {"description_width": "130px"}  # the knobs' label width, shared with panel_widgets
WIDE = {"width": "300px"}


def build(w: dict[str, Any], b: RunConfig, W: Any) -> None:
    """Both sections' widgets into ``w``, with their values from ``b``."""
    _time_widgets(w, b, W)
    _advanced_widgets(w, b, W)


def arrange(w: dict[str, Any], column, labelled, W: Any) -> tuple[Any, Any]:
    """The two folded sections (Accordions, closed), laid out with the panel's ``column`` and
    ``labelled`` helpers."""
    time_box = W.HBox(
        [
            column(
                "Imbalance, and who validates",
                w["straggler_rank"],
                w["straggler_slowdown"],
                w["batch_skew"],
                labelled("validation", w["validation"]),
                w["timeline_steps"],
            ),
            column(
                "Input and shuffle",
                labelled("augment", w["augment"]),
                w["augment_cost"],
                labelled("shards", w["shards"]),
                labelled("shuffle", w["shuffle"]),
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
                labelled("update", w["update"]),
                w["average_every"],
                w["groups"],
                w["staleness"],
            ),
            column(
                "Silent data corruption",
                labelled("flip", w["sdc_target"]),
                w["sdc_layer"], w["sdc_bit"], w["sdc_rank"], w["sdc_step"],
                w["spike_factor"], w["rollback"],
            ),
        ],
        layout={"flex_flow": "row wrap"},
    )  # fmt: skip
    advanced = W.Accordion(children=[advanced_box], selected_index=None)
    advanced.set_title(0, "Beyond synchronous SGD: model averaging, silent data corruption")
    advanced.add_class("hpclab-advanced-section")
    return time_section, advanced


def _time_widgets(w: dict[str, Any], b: RunConfig, W: Any) -> None:
    """The knobs of "where the time goes": a straggler, who validates, the input's work, the
    shards and shuffle, and a Horovod timeline of n steps (hpclab.core.pop, hpclab.core.timeline)."""
    numbers = (  # name, widget, min, max, step, label, tooltip
        ("straggler_rank", W.BoundedIntText, -1, MAX_WORKERS - 1, 1, "straggler rank",
         "the rank slowed on purpose (-1: none)"),
        ("straggler_slowdown", W.BoundedFloatText, 0, 95, 5, "its speed lost %",
         "30: that rank's useful work takes 1/0.7 = 1.43x as long"),
        ("batch_skew", W.BoundedFloatText, 0, 90, 10, "rank 0's batch +%",
         "rank 0's batch this % larger, the others' smaller (the same global batch)"),
        ("augment_cost", W.BoundedIntText, 1, MAX_AUGMENT_COST, 10, "augment cost",
         "noise passes per batch: more work, the same statistics"),
        ("timeline_steps", W.BoundedIntText, 0, 100_000, 50, "timeline steps",
         "record Horovod's timeline over this many steps into the run folder (0: off)"),
    )  # fmt: skip
    _numbers(w, b, W, numbers)
    choices = (("validation", VALIDATIONS), ("augment", AUGMENTS), ("shards", SHARDS))
    for name, options in (*choices, ("shuffle", SHUFFLES)):
        w[name] = W.ToggleButtons(
            options=options, value=getattr(b, name), style={"button_width": "72px"}
        )


def _advanced_widgets(w: dict[str, Any], b: RunConfig, W: Any) -> None:
    """The knobs of "beyond synchronous SGD": model averaging, one bit flip and the loss-spike
    detector with rollback (hpclab.rank.features.averaging, hpclab.rank.features.sdc)."""
    numbers = (  # name, widget, min, max, step, label, tooltip
        ("average_every", W.BoundedIntText, 1, 100_000, 1, "average every H",
         "local_sgd, hybrid: steps between model averages (1: the same as sync)"),
        ("groups", W.BoundedIntText, 1, MAX_WORKERS, 1, "hybrid: groups",
         "synchronous groups of consecutive ranks, models averaged across them (divides workers)"),
        ("staleness", W.BoundedIntText, 0, 64, 1, "stale by steps",
         "sync: apply the averaged gradient of this many steps ago (asynchrony's cost)"),
        ("sdc_layer", W.BoundedIntText, 0, 10_000, 1, "flip: layer",
         "which layer with weights (0: the first convolution or dense layer)"),
        ("sdc_bit", W.BoundedIntText, 0, FLOAT32_BITS - 1, 1, "flip: bit",
         "31 sign, 30-23 exponent, 22-0 mantissa (float32)"),
        ("sdc_rank", W.BoundedIntText, 0, MAX_WORKERS - 1, 1, "flip: rank", "the rank hit"),
        ("sdc_step", W.BoundedIntText, 0, 10_000_000, 10, "flip: step", "the step hit"),
        ("spike_factor", W.BoundedFloatText, 0, 1e6, 0.5, "spike factor",
         "the detector fires when a step's loss > this x its running mean (0: off)"),
    )  # fmt: skip
    _numbers(w, b, W, numbers)
    for name, options in (("update", UPDATES), ("sdc_target", SDC_TARGETS)):
        w[name] = W.ToggleButtons(
            options=options, value=getattr(b, name), style={"button_width": "80px"}
        )
    w["rollback"] = W.Checkbox(
        value=b.rollback, description="roll back on a spike", indent=False, layout=WIDE
    )


def _numbers(w: dict[str, Any], b: RunConfig, W: Any, numbers) -> None:
    """Number fields from a table of (name, widget, min, max, step, label, tooltip)."""
    for name, kind, lo, hi, step, label, tip in numbers:
        w[name] = kind(
            value=getattr(b, name), min=lo, max=hi, step=step, description=label, tooltip=tip,
            style=DESC, layout=WIDE,
        )  # fmt: skip


__all__ = ["build", "arrange"]
