"""The float16-underflow lesson's client side: the chart, the table and the take-aways read the
probe's result (hpclab.rank.probes.fp16_exponents; the probe itself runs in notebook 14's test)."""

from __future__ import annotations

import numpy as np

from hpclab.studies import fp16
from hpclab.views.charts.exponents import KINDS, exponent_histogram, takeaways, underflow_table

BINS = list(range(-40, 13))


def _shares(flushed: float) -> dict:
    return {
        "below_subnormal": flushed,
        "below_normal": 2 * flushed,
        "flushed": flushed,
        "structural_zero": 0.01,
    }


def _result(seed: int, late: float) -> dict:
    rng = np.random.default_rng(seed)
    points = []
    for epoch, share in ((0, 0.001), (3, late)):
        counts = {k: rng.integers(0, 50, len(BINS)).tolist() for k in KINDS}
        points.append(
            {
                "epoch": epoch,
                "val_accuracy": 0.1 + epoch / 10,
                "elements": {k: int(sum(c)) for k, c in counts.items()},
                "histogram": counts,
                "unscaled": {"activation": _shares(share), "weight": _shares(share / 30)},
                "scaled": {"activation": _shares(share / 4), "weight": _shares(share / 300)},
            }
        )
    return {
        "bins": BINS,
        "normal": -14,
        "subnormal": -24,
        "scale_log2": 15.0,
        "points": points,
        "seed": seed,
    }


def test_chart_table_and_takeaways_read_the_probe_result(tmp_path):
    saved = {"seeds": [0, 1], "results": [_result(0, 0.30), _result(1, 0.34)]}
    fig = exponent_histogram(saved["results"][0])
    assert len(fig.data) == 2 * 2 * len(KINDS)  # two points × two kinds × unscaled/scaled
    shares = np.array(fig.data[0].y)
    assert np.isclose(shares.sum(), 1.0)  # a share of all the kind's elements
    assert list(fig.data[1].x) == [b + 15.0 for b in BINS]  # the scaled bars move by log2 S
    table = underflow_table(saved["results"][0])
    assert len(table) == 2 * 2 * len(KINDS)
    flushed = fp16.flushed(saved)
    assert (
        flushed[(1, 3, "unscaled")]
        == saved["results"][1]["points"][1]["unscaled"]["activation"]["flushed"]
    )
    lines = takeaways(saved)
    assert len(lines) == len(KINDS) + 1
    assert "30.0%–34.0%" in lines[0] and "spread 4.0%" in lines[0], lines[0]
    assert "the scale saves 75% of it at each seed" in lines[0], lines[0]  # scaled = unscaled / 4
