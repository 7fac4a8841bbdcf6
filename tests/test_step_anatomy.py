"""The interval benchmarks/step_anatomy.py puts on a median of paired ratios."""

import numpy as np
import pytest

from hpclab.rank.probes.step_anatomy import median_interval


def test_the_median_interval_is_the_binomial_order_statistics():
    """n = 100: 1.96 x sqrt(100) / 2 = 9.8 ranks either side of the middle, so x[40] and x[60]
    of the sorted values (the exact binomial interval is x[39]..x[60])."""
    values = np.random.default_rng(0).permutation(100).astype(float)
    assert median_interval(values) == (49.5, 40.0, 60.0)


def test_the_interval_narrows_as_pairs_accumulate_and_covers_the_true_median():
    rng = np.random.default_rng(1)
    widths = []
    for n in (50, 200, 800):
        ratios = 1.0 + rng.standard_t(2, size=n) * 0.05  # heavy tails, as paired calls show
        mid, lo, hi = median_interval(ratios)
        assert lo <= 1.0 <= hi and lo <= mid <= hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_too_few_pairs_for_an_interval_is_an_error_naming_the_count():
    with pytest.raises(ValueError, match="at least 20 values.*got 5"):
        median_interval([1.0] * 5)
