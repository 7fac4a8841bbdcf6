"""The report's "what these runs show": sentences computed from recorded runs (tests/fakes.py).

Each test writes a sweep with hand-chosen outcomes and checks that the sentences say what those
numbers say — including where a rule did not help — and change when the numbers change.
"""

from __future__ import annotations

from fakes import write_run

from hpclab.records.store import load_run
from hpclab.views.charts.lessons import WINDOW_TAG, findings
from hpclab.views.charts.report import render_report

BASE = dict(num_samples=20000, base_lr=0.05, base_batch=64, momentum=0.9)


def _run(root, per_worker, acc, status="finished", **fields):
    return load_run(
        write_run(
            root, batch_per_worker=per_worker, val_accs=[acc], status=status, **{**BASE, **fields}
        )
    )


def _demo(root, lars_at_2048=("finished", 0.81), linear_128=0.95):
    runs = [
        _run(root, 64, 0.93, lr_scaling="none"),
        _run(root, 256, 0.71, lr_scaling="none"),
        _run(root, 1024, 0.36, lr_scaling="none"),
        _run(root, 64, linear_128, lr_scaling="linear"),
        _run(root, 256, 0.90, lr_scaling="linear"),
        _run(root, 1024, 0.10, "collapsed", lr_scaling="linear"),
        _run(root, 64, 0.83, optimizer="lars", lars_eta=0.01, lr_scaling="linear"),
        _run(
            root,
            1024,
            lars_at_2048[1],
            lars_at_2048[0],
            optimizer="lars",
            lars_eta=0.01,
            lr_scaling="linear",
        ),  # fmt: skip
    ]
    return findings(runs)


def test_the_demo_story_in_words(tmp_path):
    said = _demo(tmp_path)
    text = " ".join(said)
    assert said[0].startswith(
        "Without learning-rate scaling (momentum SGD, lr 0.05 at every batch)"
    )
    assert "fell from 0.930 at global batch 128 to 0.360 at 2,048" in said[0]
    assert "16x fewer steps" in said[0]
    assert "raised accuracy at global batch 128 (0.930 → 0.950, peak lr 0.1)" in text
    assert "512 (0.710 → 0.900, peak lr 0.4)" in text
    assert "at global batch 2,048 (peak lr 1.6) it collapsed" in text
    assert (
        "At global batch 2,048 and peak lr 1.6, where momentum SGD collapsed, LARS (η 0.01) "
        "trained, to 0.810, with the same schedule." in text
    )
    # where LARS did not win, the report says so too
    assert "At global batch 128, LARS (η 0.01) reached 0.830, below momentum SGD's 0.950." in text


def test_sentences_follow_the_numbers(tmp_path):
    said = " ".join(_demo(tmp_path, lars_at_2048=("diverged", float("nan")), linear_128=0.90))
    assert "LARS (η 0.01) also diverged with the same schedule" in said
    assert "It did not help at global batch 128 (0.930 → 0.900, peak lr 0.1)" in said
    assert "raised accuracy at global batch 512" in said


def test_learning_rate_windows_are_described_per_optimizer(tmp_path):
    runs = []
    sgd = {0.1: 0.81, 0.2: 0.90, 0.8: 0.58, 1.6: "diverged", 3.2: "collapsed"}
    lars = {0.1: 0.51, 0.8: 0.88, 1.6: 0.91, 3.2: 0.73, 6.4: "collapsed"}
    for opt, table in (("momentum", sgd), ("lars", lars)):
        for peak, out in table.items():
            status, acc = (out, 0.1) if isinstance(out, str) else ("finished", out)
            runs.append(
                _run(
                    tmp_path,
                    1024,
                    acc,
                    status,
                    optimizer=opt,
                    lars_eta=0.01,
                    lr_scaling="linear",
                    base_lr=peak / 32,
                    tags=[WINDOW_TAG],
                )  # fmt: skip
            )
    said = findings(runs)
    assert said == [
        "At global batch 2,048, momentum SGD trained at peak lr 0.1–0.8 (best 0.900 at 0.2); "
        "from 1.6 it diverged (5 peak LRs from 0.1 to 3.2).",
        "At global batch 2,048, LARS (η 0.01) trained at peak lr 0.1–3.2 (best 0.910 at 1.6); "
        "from 6.4 it collapsed (5 peak LRs from 0.1 to 6.4).",
        "At global batch 2,048 the band of peak learning rates that trained spanned 32x for "
        "LARS (η 0.01) and 8x for momentum SGD (highest over lowest peak LR that trained).",
    ]
    page = render_report(runs)
    assert "What these runs show" in page and "The learning-rate window" in page
    assert "Accuracy vs global batch" not in page  # window runs are not a batch sweep


def test_no_comparison_no_findings(tmp_path):
    assert findings([_run(tmp_path, 64, 0.9)]) == []
    assert "What these runs show" not in render_report([_run(tmp_path, 128, 0.8)])


def test_an_optimizer_on_another_lr_scale_is_not_said_to_share_the_peak(tmp_path):
    runs = [
        _run(tmp_path, 1024, 0.10, "collapsed", lr_scaling="linear"),  # peak 1.6
        _run(tmp_path, 1024, 0.95, optimizer="lamb", base_lr=0.000625, lr_scaling="linear"),
    ]
    (said,) = findings(runs)[-1:]
    assert said == (
        "At global batch 2,048, where momentum SGD collapsed (peak lr 1.6), LAMB trained, to "
        "0.950, at peak lr 0.02."
    )
