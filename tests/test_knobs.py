"""The knob table (hpclab/core/knobs.py) and everything generated from it agree, knob by knob:
RunConfig's fields and range checks, the CLI's options, the panel's controls and docs/knobs.md.

Fast: no TF, no MPI, no engines (the panel's widgets are built without a lab)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import typing
from pathlib import Path

import pytest

from hpclab.core import knobs
from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.core.knobs import KNOBS, Knob
from hpclab.tools import cli_fields
from hpclab.views.panel import controls
from hpclab.views.panel.widgets import KNOBS as PANEL_KNOBS
from hpclab.views.panel.widgets import build_widgets, models_for

ROOT = Path(__file__).resolve().parents[1]
IDS = [k.name for k in KNOBS]


def refusal(knob: Knob, value) -> str:
    """The one sentence RunConfig gives when ``value`` is outside ``knob``'s row."""
    return f"RunConfig.{knob.name} must be {knob.allowed()}; you passed {knob.name}={value!r}."


def outside(knob: Knob) -> list:
    """Values just outside what the row accepts (each side that has a bound)."""
    if knob.kind == "choice":
        return ["not-" + knob.choices[0], 3]
    if knob.kind == "bool":
        return ["yes", 1]
    if knob.kind == "text":
        return [5, "x" * (knob.hi + 1)]
    if knob.kind == "tags":
        return [("ok", 3)]
    if knob.kind == "shape":
        return [(32, 32), (knob.lo - 1, 32, 3), (32, knob.hi + 1, 3)]
    eps = 1 if knob.kind == "int" else max(abs(knob.lo), 1.0) * 1e-6
    below = knob.lo if knob.lo_open and knob.lo != knob.off else knob.lo - eps
    values = [below, "1", float("nan") if knob.kind == "float" else 1.5]
    if knob.hi is not None:
        values.append(knob.hi + (1 if knob.kind == "int" else max(knob.hi, 1.0) * 1e-6))
    if knob.off is not None and knob.off != knob.lo:
        values.append((knob.off + knob.lo) / 2)  # between "off" and the range
    return values


def inside(knob: Knob) -> list:
    """Values at the edges of what the row accepts."""
    if knob.kind == "choice":
        return list(knob.choices)
    if knob.kind == "bool":
        return [True, False]
    if knob.kind == "text":
        return ["", "x" * knob.hi]
    if knob.kind == "tags":
        return [(), ("a", "b")]
    if knob.kind == "shape":
        return [(knob.lo,) * 3, (knob.hi,) * 3]
    eps = 1 if knob.kind == "int" else max(abs(knob.lo), 1.0) * 1e-6
    values = [knob.lo + eps if knob.lo_open else knob.lo]
    values += [] if knob.hi is None else [knob.hi]
    values += [] if knob.off is None else [knob.off]
    return values


# -- the table itself ---------------------------------------------------------------------------


def test_every_row_is_complete_and_its_default_is_accepted():
    assert len({k.name for k in KNOBS}) == len(KNOBS), "a knob is declared twice"
    for k in KNOBS:
        assert k.kind in knobs.KINDS, k.name
        assert k.section in knobs.SECTIONS, f"{k.name}: section {k.section!r} is not in SECTIONS"
        assert k.help.strip() and k.label.strip(), k.name
        assert k.admits(k.default), f"{k.name}: the default {k.default!r} is refused by its row"
        if k.kind in ("int", "float"):
            assert k.lo is not None, f"{k.name}: a number needs a lower bound"
        assert bool(k.choices) == (k.kind == "choice"), k.name
    assert list(knobs.by_section()) == list(knobs.SECTIONS), "a section holds no knob"
    assert sum(len(rows) for rows in knobs.by_section().values()) == len(KNOBS)


def test_runconfig_fields_are_the_rows():
    fields = dataclasses.fields(RunConfig)
    assert [f.name for f in fields] == IDS  # in table order
    hints = typing.get_type_hints(RunConfig)
    for f, k in zip(fields, KNOBS):
        assert f.metadata["knob"] is k and f.metadata["help"] == k.help
        assert hints[f.name] is k.type and f.default == k.default
    assert RunConfig().to_dict() == {k.name: k.default for k in KNOBS} | {
        "image_shape": list(knobs.knob("image_shape").default),
        "tags": [],
    }


def test_sections_read_one_part_of_a_flat_config():
    cfg = RunConfig(straggler_rank=1, straggler_ms=5.0)
    assert cfg.section("straggler") == {
        "straggler_rank": 1,
        "straggler_slowdown": 0.0,
        "straggler_ms": 5.0,
    }
    merged = {}
    for section in knobs.by_section():
        merged |= cfg.section(section)
    assert merged == {k: v for k, v in dataclasses.asdict(cfg).items() if k in set(IDS)}
    with pytest.raises(ConfigError, match="no section 'stragglers'"):
        cfg.section("stragglers")


# -- the checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("knob", KNOBS, ids=IDS)
def test_runconfig_refuses_just_outside_each_row_in_the_rows_words(knob):
    for value in outside(knob):
        assert not knob.admits(value), (knob.name, value)
        with pytest.raises(ConfigError) as info:
            RunConfig(**{knob.name: value})
        assert str(info.value) == refusal(knob, value)


@pytest.mark.parametrize("knob", KNOBS, ids=IDS)
def test_the_edges_of_each_row_pass_its_own_check(knob):
    """A value at the edge passes the row; RunConfig takes it, or refuses it by a rule between
    knobs (e.g. a batch larger than the training set), never by the row's sentence."""
    for value in inside(knob):
        assert knob.admits(value), (knob.name, value)
        try:
            RunConfig(**{knob.name: value})
        except ConfigError as exc:
            assert str(exc) != refusal(knob, value)


# -- the CLI ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parser():
    parser = argparse.ArgumentParser(prog="hpclab run")
    cli_fields.add_field_options(parser, many=False)
    return parser


def parse(parser, *argv):
    """The field values the options give, or None when argparse refuses them (exit 2)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return cli_fields.field_values(parser.parse_args(list(argv)))
    except SystemExit as exc:
        assert exc.code == 2 and "Traceback" not in err.getvalue()
        return None


@pytest.mark.parametrize("knob", KNOBS, ids=IDS)
def test_the_cli_option_takes_the_rows_kind_and_choices(parser, knob):
    name, opt = knob.name, knob.option
    if knob.kind == "choice":
        for choice in knob.choices:
            assert parse(parser, opt, choice) == {name: choice}
        assert parse(parser, opt, "not-" + knob.choices[0]) is None
    elif knob.kind == "bool":
        assert parse(parser, opt) == {name: True}
        assert parse(parser, "--no-" + opt[2:]) == {name: False}
    elif knob.kind in ("int", "float"):
        for value in inside(knob):
            got = parse(parser, opt, str(value))[name]
            assert got == value and type(got) is knob.type
        assert parse(parser, opt, "1.5" if knob.kind == "int" else "nan") is None
        assert parse(parser, opt, "x") is None
    elif knob.kind == "shape":
        assert parse(parser, opt, "8,8,1") == {name: (8, 8, 1)}
        assert parse(parser, opt, "8,8") is None
    elif knob.kind == "tags":
        assert parse(parser, opt, "a,b") == {name: ("a", "b")}
    else:
        assert parse(parser, opt, "words, with a comma") == {name: "words, with a comma"}


def test_cli_help_reads_in_the_tables_sections(parser):
    text = parser.format_help()
    starts = [text.index(f"\n{s}: {blurb}:\n") for s, blurb in knobs.SECTIONS.items()]
    assert starts == sorted(starts)
    bounds = [*starts, len(text)]
    for i, rows in enumerate(knobs.by_section().values()):
        for k in rows:
            assert bounds[i] < text.index(f"\n  {k.option}") < bounds[i + 1], k.name


# -- the panel ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def widgets():
    pytest.importorskip("ipywidgets")
    return build_widgets(RunConfig(), workers=2)


def test_every_panel_knob_is_a_row():
    assert set(PANEL_KNOBS) <= set(IDS)


@pytest.mark.parametrize("name", PANEL_KNOBS)
def test_the_panel_control_has_the_rows_bounds_choices_and_label(widgets, name):
    knob, w = knobs.knob(name), widgets[name]
    assert w.value == knob.default
    assert w.tooltip == knob.help
    if knob.kind == "choice":
        offered = models_for(RunConfig().dataset) if name == "model" else list(knob.choices)
        assert list(w.options) == offered and set(offered) <= set(knob.choices)
        if name not in controls.BUTTONS:  # a row of buttons is labelled beside it
            assert w.description == knob.label
        return
    assert w.description == knob.label
    if knob.kind == "bool":
        return
    lo = knob.lo if knob.off is None else min(knob.lo, knob.off)
    assert (w.min, w.max, w.step) == (lo, knob.hi, knob.step)
    # the field stops at the row's bounds: a value beyond them is never sent to RunConfig
    eps = 1 if knob.kind == "int" else 1e-3
    old = w.value
    try:
        w.value = lo - eps
        assert w.value == lo
        w.value = knob.hi + eps
        assert w.value == knob.hi
    finally:
        w.value = old


# -- docs/knobs.md ------------------------------------------------------------------------------


def test_docs_knobs_md_is_what_the_script_writes_from_the_table():
    spec = importlib.util.spec_from_file_location("knobs_doc", ROOT / "scripts" / "knobs_doc.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (ROOT / "docs" / "knobs.md").read_text(encoding="utf-8")
    assert page == script.render(), "docs/knobs.md is stale: run python scripts/knobs_doc.py"
    for k in KNOBS:
        assert f"| `{k.name}` |" in page
