"""The control panel (hpclab/views/panel/panel.py, panel_widgets.py, panel_text.py).

Fast tests use the panel's deliberate preview mode (`Panel(None, workers=2)`: every knob and
derived number works, Run stays disabled) and need neither engines nor TensorFlow; the status
line's words are checked on stand-in runs. The `mpi` tests click Run and Stop on a panel wired to
a real 2-worker Lab and watch real runs.
"""

import logging
import re
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from hpclab.core.config import ConfigError, RunConfig
from hpclab.views.panel.panel import Panel
from hpclab.views.panel.text import plain_text, status_html, status_line
from hpclab.views.panel.widgets import KNOBS, PRECISION_HINT, models_for

SMALL = RunConfig(num_samples=4000, epochs=2)


@pytest.fixture
def preview():
    return Panel(None, workers=2, base=SMALL)


def set_knobs(panel, **values):
    for name, value in values.items():
        panel.widgets[name].value = value


# -- config building and derived numbers -------------------------------------------------------


def test_knobs_start_from_the_base_config(preview):
    assert preview.config_from_widgets() == SMALL
    assert set(KNOBS) <= set(preview.widgets)


def test_config_from_widgets_carries_every_knob(preview):
    set_knobs(
        preview,
        batch_per_worker=32,
        base_lr=0.1,
        base_batch=128,
        lr_scaling="sqrt",
        warmup_epochs=0.5,
        lr_schedule="cosine",
        optimizer="lars",
        lars_eta=0.002,
        precision="mixed_bfloat16",
        epochs=3.0,
        num_samples=8000,
        model="mlp",
    )
    assert preview.config_from_widgets() == SMALL.replace(
        batch_per_worker=32,
        base_lr=0.1,
        base_batch=128,
        lr_scaling="sqrt",
        warmup_epochs=0.5,
        lr_schedule="cosine",
        optimizer="lars",
        lars_eta=0.002,
        precision="mixed_bfloat16",
        epochs=3.0,
        num_samples=8000,
        model="mlp",
    )


@pytest.mark.parametrize(
    "changes, workers",
    [
        ({}, 2),
        ({"batch_per_worker": 32}, 2),
        ({"batch_per_worker": 32}, 4),
        ({"batch_per_worker": 256, "lr_scaling": "sqrt"}, 8),
        ({"lr_scaling": "none", "warmup_epochs": 0.0}, 3),
    ],
)
def test_derived_numbers_follow_the_knobs_and_equal_runconfig_derived(preview, changes, workers):
    before = dict(preview.derived)
    set_knobs(preview, workers=workers, **changes)
    expected = SMALL.replace(**changes).for_workers(workers).derived()
    assert preview.derived == expected
    shown = preview.widgets["derived"].value
    for key in ("global_batch", "steps_per_epoch", "total_steps"):
        assert f"<b>{expected[key]:,}</b>" in shown
    warm = SMALL.replace(**changes).for_workers(workers).warmup_text()
    assert warm in shown and (f"warm-up {expected['warmup_steps']} steps" in warm) == bool(
        expected["warmup_steps"]
    )
    assert f"<b>{expected['peak_lr']:.4g}</b>" in shown
    assert f"<b>{expected['global_batch']:,}</b> global" in preview.widgets["global_batch"].value
    if changes or workers != 2:
        assert preview.derived != before


def test_lr_rule_changes_the_scaled_peak_lr(preview):
    set_knobs(preview, workers=4, batch_per_worker=64, base_batch=64, base_lr=0.05)
    peaks = {}
    for rule in ("none", "linear", "sqrt"):
        preview.widgets["lr_scaling"].value = rule
        peaks[rule] = preview.derived["peak_lr"]
        assert (
            peaks[rule]
            == SMALL.replace(batch_per_worker=64, base_batch=64, base_lr=0.05, lr_scaling=rule)
            .for_workers(4)
            .peak_lr
        )
    assert peaks["none"] < peaks["sqrt"] < peaks["linear"]


# -- invalid combinations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"batch_per_worker": 5000},  # larger than the 3200 training samples
        {"base_lr": 0.0},
        {"epochs": 0.0},
        {"lars_eta": 0.0},  # (num_samples 50 cannot be typed: the field stops at the rule's 100)
    ],
)
def test_invalid_combination_shows_the_configerror_sentence_and_disables_run(preview, changes):
    field = next(iter(changes))
    with pytest.raises(ConfigError) as expected:
        SMALL.replace(**changes)
    set_knobs(preview, **changes)
    assert preview.config_error == str(expected.value)
    assert str(expected.value) in preview.status
    assert f"RunConfig.{field}" in preview.status and "Traceback" not in preview.status
    assert "#b00020" in preview.widgets["status"].value  # shown in red
    assert preview.widgets["run"].disabled
    assert preview.derived is None and "—" in preview.widgets["derived"].value
    with pytest.raises(ConfigError):
        preview.config_from_widgets()
    set_knobs(preview, **{field: getattr(SMALL, field)})  # fixing it clears the sentence
    assert preview.config_error is None and "RunConfig." not in preview.status
    assert preview.derived == SMALL.for_workers(2).derived()


def test_model_choices_follow_the_dataset(preview):
    w = preview.widgets
    assert tuple(w["model"].options) == tuple(models_for("mnist1d")) == ("mlp", "cnn1d", "linear")
    w["dataset"].value = "cifar10"
    assert "cnn1d" not in w["model"].options and w["model"].value == "resnet20"
    assert w["num_samples"].disabled and "data/" in w["samples_hint"].value
    assert preview.config_error is None  # never an invalid pair
    w["model"].value = "mlp"
    w["dataset"].value = "mnist1d"
    assert w["model"].value == "mlp"  # still valid: kept
    assert not w["num_samples"].disabled and w["samples_hint"].value == ""
    w["dataset"].value = "synthetic"
    w["model"].value = "resnet50"
    w["dataset"].value = "mnist1d"
    assert w["model"].value == "cnn1d" and preview.config_error is None


def test_lars_eta_is_shown_only_for_lars(preview):
    eta = preview.widgets["lars_eta"]
    assert eta.layout.display == "none"
    preview.widgets["optimizer"].value = "lars"
    assert eta.layout.display != "none"
    preview.widgets["optimizer"].value = "adam"
    assert eta.layout.display == "none"


def test_precision_hint_explains_gpus_and_bfloat16(preview):
    assert "GPU" in PRECISION_HINT and "bfloat16" in PRECISION_HINT
    assert PRECISION_HINT in preview.widgets["precision_hint"].value


def test_preview_cannot_run_and_says_how_to_start_a_lab(preview):
    assert preview.widgets["run"].disabled and preview.widgets["stop"].disabled
    assert "hpclab.Lab(workers=2)" in preview.status
    preview.widgets["run"].click()  # nothing happens, no error
    assert preview.run is None and preview.runs == []


def test_base_must_be_a_runconfig():
    with pytest.raises(ConfigError, match="Panel.base must be a RunConfig"):
        Panel(None, base={"epochs": 1})


def test_panel_displays_controls_and_dashboard(preview):
    assert preview.dashboard is not None
    assert preview.widget.children[-1] is preview.dashboard.widget
    assert "application/vnd.jupyter.widget-view+json" in preview._repr_mimebundle_()
    assert "hpclab-panel" in preview.widget._dom_classes
    assert all(f"hpclab-{name}" in w._dom_classes for name, w in preview.widgets.items())


def test_panel_without_dashboard_is_just_the_controls():
    panel = Panel(None, base=SMALL, dashboard=False)
    assert panel.dashboard is None
    assert panel.widget.children[-1].children[0] is panel.widgets["run"]  # the actions row last


def test_the_time_section_sets_the_lessons_of_notebooks_06_and_07(preview):
    """A straggler, uneven batches, rank-0 validation, online augmentation, shards by label and
    a timeline of 100 steps, all from the folded "where the time goes" section."""
    from hpclab.views.panel.widgets import TIME_KNOBS

    section = next(c for c in preview.widget.children if "hpclab-time-section" in c._dom_classes)
    assert section.selected_index is None  # folded until opened: the main knobs stay in front
    changes = dict(
        straggler_rank=1, straggler_slowdown=30.0, validation="rank0", augment="online",
        augment_cost=20, shards="by_label", shuffle="local", timeline_steps=100, batch_skew=50.0,
    )  # fmt: skip
    assert set(changes) == set(TIME_KNOBS)
    set_knobs(preview, **changes)
    assert preview.config_error is None
    assert preview.config_from_widgets() == SMALL.replace(**changes)
    set_knobs(preview, straggler_rank=2)  # the preview's 2 workers are ranks 0 and 1
    assert "straggler_rank" in preview.config_error and preview.widgets["run"].disabled


def test_the_advanced_section_sets_model_averaging_and_a_bit_flip_with_rollback(preview):
    """Hybrid groups (2 groups of the 2 ranks: local SGD) averaged every 8 steps, bit 30 of layer 1's weights on rank 1 at step 20, the detector
    at 3x with rollback, all from the folded "beyond synchronous SGD" section; a flip on a rank
    the run does not have, or rollback without the detector, shows the config's own sentence."""
    from hpclab.views.panel.widgets import ADVANCED_KNOBS

    section = next(
        c for c in preview.widget.children if "hpclab-advanced-section" in c._dom_classes
    )
    assert section.selected_index is None
    changes = dict(
        update="hybrid", average_every=8, groups=2, sdc_target="weights", sdc_layer=1,
        sdc_bit=30, sdc_rank=1, sdc_step=20, spike_factor=3.0, rollback=True, staleness=0,
    )  # fmt: skip
    assert set(changes) == set(ADVANCED_KNOBS)
    set_knobs(preview, **changes)
    assert preview.config_error is None
    assert preview.config_from_widgets() == SMALL.replace(**changes)
    set_knobs(preview, sdc_rank=2)
    assert "sdc_rank" in preview.config_error and preview.widgets["run"].disabled
    set_knobs(preview, sdc_rank=1, spike_factor=0.0)
    assert "rollback must be False unless spike_factor > 0" in preview.config_error
    set_knobs(preview, spike_factor=3.0, staleness=4)  # stale gradients are synchronous SGD's
    assert "staleness must be 0 with update other than 'sync'" in preview.config_error
    set_knobs(preview, staleness=0, groups=3)  # 3 groups of this panel's 2 workers
    assert "groups must be a divisor of workers (2) with update 'hybrid'" in preview.config_error
    set_knobs(preview, update="sync", staleness=4)
    assert preview.config_error is None
    assert preview.config_from_widgets().staleness == 4


# -- the status line's words (stand-in runs: no engines) -----------------------------------------


def stand_in_run(status, rows=(), summary=None, error=None):
    return SimpleNamespace(
        status=status,
        history=pd.DataFrame(list(rows)),
        config=SMALL,
        workers=2,
        summary=summary or {},
        error=error,
        run_id="20250101-000000-abcd",
    )


def test_status_line_says_starting_then_step_epoch_and_speed():
    text, bad = status_line(stand_in_run("running"))
    assert text.startswith("running on 2 workers: starting") and not bad
    rows = [
        {"step": 10, "epoch": float("nan"), "samples_per_sec": None},
        {"step": 20, "epoch": 0.4, "samples_per_sec": 12345.6},
    ]
    text, bad = status_line(stand_in_run("running", rows))
    total = SMALL.for_workers(2).total_steps
    assert text == f"running: step 20/{total:,} · epoch 0.40 · 12,346 samples/s" and not bad


def test_status_line_says_how_a_run_ended():
    done = {"val_accuracy": 0.9123, "steps": 100, "wall_time_s": 4.25}
    text, bad = status_line(stand_in_run("finished", summary=done))
    assert (
        text == "finished: val accuracy 0.912 after 100 steps in 4.2 s (run 20250101-000000-abcd)"
    )
    text, _ = status_line(stand_in_run("stopped", summary={"steps": 7}))
    assert text.startswith("stopped at step 7/") and "no validation yet" in text
    text, bad = status_line(stand_in_run("failed", error="rank 1 died first"))
    assert (text, bad) == ("failed: rank 1 died first", True)


def test_status_html_escapes_and_plain_text_reads_it_back():
    markup = status_html("a <b> & c", True, "RunConfig.epochs must be > 0")
    assert "&lt;b&gt;" in markup and "#b00020" in markup
    assert plain_text(markup) == "a <b> & c\nRunConfig.epochs must be > 0"


# -- real engines ------------------------------------------------------------------------------

# 100 steps per epoch at 2 x 16, one step per compiled call, and far more epochs than the test
# waits for: it stops the run mid-way, so a slow, shared machine cannot end it first.
LIVE = RunConfig(num_samples=4000, epochs=50, batch_per_worker=16, steps_per_call=1)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.mpi
def test_lab_panel_shows_a_panel_for_the_lab(lab):
    widget = lab.panel()
    assert "hpclab-panel" in widget._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in widget._repr_mimebundle_()


@pytest.mark.mpi
def test_run_and_stop_buttons_drive_a_real_run(lab, caplog):
    panel = Panel(lab, base=LIVE)
    w = panel.widgets
    assert panel.status == "ready"
    assert not w["run"].disabled and w["stop"].disabled

    w["batch_per_worker"].value = 5000  # invalid: Run disabled
    assert w["run"].disabled and "RunConfig.batch_per_worker" in panel.status
    w["batch_per_worker"].value = 16
    assert not w["run"].disabled

    w["run"].click()
    run = panel.run
    assert run is not None and lab.current_run is run and run.config == LIVE
    assert panel.status.startswith("running")
    assert w["run"].disabled and not w["stop"].disabled

    wait_for(lambda: len(run.history) >= 2, 180, "the first telemetry rows")
    n = len(run.history)
    wait_for(lambda: len(run.history) > n, 30, "the history to grow")
    assert not run.done
    wait_for(lambda: re.match(r"running: step [\d,]+/5,000", panel.status), 5, "step x/y")
    wait_for(lambda: len(panel.dashboard.trace("thr/global").x) >= 2, 5, "the live chart")

    t0 = time.monotonic()
    w["stop"].click()
    assert w["stop"].disabled  # one stop request
    wait_for(lambda: run.done, 15, "the run to stop")
    assert run.status == "stopped", run.error
    wait_for(lambda: panel.status.startswith("stopped at step"), 5, "the stopped status")
    assert time.monotonic() - t0 < 15
    assert not w["run"].disabled and w["stop"].disabled

    # a second run: the first one is overlaid, and this one finishes on its own
    w["epochs"].value = 1.0
    w["run"].click()
    second = panel.run
    assert second is not run and panel.runs == [run, second]
    assert [o.run_id for o in panel.dashboard.overlays] == [run.run_id]
    wait_for(lambda: second.done, 120, "the second run to finish")
    assert second.status == "finished", second.error
    wait_for(lambda: panel.status.startswith("finished: val accuracy"), 5, "the finished status")
    assert not w["run"].disabled and w["stop"].disabled
    # the panel and dashboard kept up: no on_update callback raised
    assert run.callback_errors == 0 and second.callback_errors == 0
    assert not [
        r for r in caplog.records if r.name == "hpclab.cluster.run" and r.levelno >= logging.ERROR
    ]


@pytest.mark.mpi
def test_changing_workers_restarts_the_engines_on_run(lab):
    panel = Panel(lab, base=LIVE.replace(epochs=0.5))
    seen = []
    panel.widgets["status"].observe(lambda c: seen.append(c["new"]), names="value")
    try:
        panel.widgets["workers"].value = 1
        assert "Run restarts" in panel.widgets["workers_note"].value
        assert panel.derived == panel.config_from_widgets().for_workers(1).derived()
        panel.widgets["run"].click()  # restarts, then starts
        assert lab.workers == 1 and panel.run.workers == 1
        assert any("restarting the engines with 1 worker " in s for s in seen)
        assert panel.widgets["workers_note"].value == ""
        wait_for(lambda: panel.run.done, 180, "the 1-worker run to finish")
        assert panel.run.status == "finished", panel.run.error
    finally:
        if lab.workers != 2:
            lab.restart(workers=2)
