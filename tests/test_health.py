"""The health verdict: a run that ends at chance level past warm-up is `collapsed`, with a reason.

Expected values are worked out from ln(C) and 1/C here, on constructed epoch rows; the real
engines' side (a collapsed run recorded as such, the CLI's exit code) is in tests/test_engine.py
and tests/test_cli.py.
"""

from __future__ import annotations

import math

import pytest

from hpclab.core import health

LN10 = math.log(10)  # the cross-entropy of a uniform guess over 10 classes: 2.303


def _epoch(step, loss, acc, val=None, lr=1.6):
    return {"step": step, "loss": loss, "accuracy": acc, "val_accuracy": val, "lr": lr}


@pytest.mark.parametrize(
    "loss, acc, expected",
    [
        (LN10, 0.10, True),  # exactly a uniform guess
        (50.0, 0.099, True),  # finite but worse than chance: still nothing learned
        (0.9 * LN10, 0.15, True),  # the edges count as chance
        (0.9 * LN10 - 0.01, 0.10, False),  # the loss has started to fall
        (LN10, 0.16, False),  # better than chance accuracy
        (float("nan"), 0.1, False),  # NaN is `diverged`, judged elsewhere
        (None, 0.1, False),
    ],
)
def test_at_chance_for_ten_classes(loss, acc, expected):
    assert health.at_chance(loss, acc, 10) is expected


def test_chance_scales_with_the_number_of_classes():
    assert health.at_chance(math.log(2), 0.5, 2)
    assert not health.at_chance(math.log(2) * 0.8, 0.5, 2)
    assert health.at_chance(math.log(1000), 0.0015, 1000)
    assert not health.at_chance(math.log(1000), 0.002, 1000)


def test_finished_run_at_chance_after_warmup_is_collapsed_with_a_sentence():
    status, error = health.judge(
        "finished",
        None,
        _epoch(120, 2.31, 0.1, val=0.099, lr=1e-5),  # the last LR of a decayed schedule
        warmup_steps=15,
        num_classes=10,
        peak_lr=1.6,
    )
    assert status == "collapsed"
    assert "collapsed" in error and "2.310" in error and "ln 10 = 2.303" in error
    assert "0.099" in error and "peak lr 1.6" in error and "1e-05" not in error


def test_validation_accuracy_decides_when_there_is_one():
    # training accuracy at chance, validation clearly above: not collapsed
    row = _epoch(120, 2.2, 0.1, val=0.4)
    assert health.judge("finished", None, row, warmup_steps=15, num_classes=10) == (
        "finished",
        None,
    )


@pytest.mark.parametrize(
    "status, row, warmup",
    [
        ("finished", _epoch(15, 2.31, 0.1), 15),  # still inside warm-up: it may yet learn
        ("finished", _epoch(120, 0.4, 0.9, val=0.88), 15),  # learned
        ("finished", None, 0),  # no epoch ended
        ("stopped", _epoch(120, 2.31, 0.1), 15),  # only finished runs are judged
        ("diverged", _epoch(120, 2.31, 0.1), 15),
    ],
)
def test_not_collapsed(status, row, warmup):
    assert health.judge(status, "why", row, warmup_steps=warmup, num_classes=10) == (status, "why")
