"""The serial test phase (notebook 06): how much one held-out evaluation speeds up with N.

Amdahl (1967, "Validity of the single processor approach to achieving large scale computing
capabilities", AFIPS): a part of the work that does not shrink with N bounds the speed-up at
1 / (s + (1 − s) / N), s its share at N = 1. With ``validation="rank0"`` rank 0 evaluates the
whole held-out set while the others wait in the allreduce that ends it: the evaluation is such a
serial part. ``"sharded"`` gives every rank 1/N of it.

:func:`evaluation_speedups` reads the evaluation's own time from each run's history: the
milliseconds of one evaluation of the held-out subset (``eval_ms`` of the rows that end with
one, ~40 a run; their fast end, QUANTILE, so slow moments do not move it) and its speed-up
S = t(1) / t(N) against the 1-worker runs: the mechanism, measured directly. The whole run's
rate (evaluation included) shows it too, but through the training part's run-to-run noise:
identical 2-second runs on two shared cores differ by up to ±20 % in training time, more than
the gap (about a tenth of a run) that the evaluation leaves between the two modes (measured
2026-11-27).

At one worker the two modes do the same work (the whole set on the only rank), so a sweep over
both modes at 1 and N workers holds a repeat: :func:`repeat_noise` is the relative difference
of the two 1-worker runs' times, the yardstick :func:`rank0_is_serial` judges the difference with.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from hpclab.views.charts.facts import facts_of

#: The smallest gap between the modes' evaluation times that counts as one, whatever the repeat
#: says: two runs' times 10 % apart are within what one slow core moves them by on a shared machine.
MIN_GAP = 0.10

#: Which quantile of a run's evaluation times stands for one evaluation. Interference on a shared
#: machine only adds time, so the fast end of the distribution is the work itself (Chen & Revels
#: 2016, "Robust benchmarking in noisy environments", arXiv:1608.04295, on the minimum): with
#: two ranks evaluating at once, a run's times were seen to split into a 12 ms and a 30 ms mode,
#: which moved the median by 2x. The 10th percentile of ~40 evaluations is the 4th fastest.
QUANTILE = 0.10

MS = "ms per evaluation (10th percentile)"


def evaluation_speedups(records: Iterable[Any]) -> pd.DataFrame:
    """One row per run: validation mode, workers, evaluations, the ms of one (the QUANTILE of the
    run's) and the speed-up against the mean of the 1-worker runs' (NaN without one)."""
    rows = []
    for f in facts_of(records):
        ms = f.history.get("eval_ms", pd.Series(dtype=float))
        ms = ms[ms > 0]
        rows.append(
            {
                "label": f.label,
                "validation": f.config.get("validation", "sharded"),
                "workers": f.workers,
                "evaluations": len(ms),
                MS: float(ms.quantile(QUANTILE)) if len(ms) else float("nan"),
            }
        )
    table = pd.DataFrame(rows, columns=["label", "validation", "workers", "evaluations", MS])
    one = table.loc[table["workers"] == 1, MS].mean()
    table["speed-up vs 1 worker"] = one / table[MS]
    return table


def repeat_noise(table: pd.DataFrame) -> float:
    """Relative difference of the 1-worker runs' evaluation times (the same work in both modes):
    the measurement's noise; NaN with fewer than two 1-worker runs."""
    one = table.loc[table["workers"] == 1, MS]
    if len(one) < 2:
        return float("nan")
    return float((one.max() - one.min()) / one.mean())


def rank0_is_serial(table: pd.DataFrame, workers: int) -> tuple[bool, str]:
    """Whether rank-0 evaluation at ``workers`` takes longer than sharded evaluation by more
    than twice the repeat's noise (and at least MIN_GAP), and the figures that say so."""
    by_mode = table[table["workers"] == workers].set_index("validation")
    at_n, speedups = by_mode[MS], by_mode["speed-up vs 1 worker"]
    ratio = float(at_n["rank0"] / at_n["sharded"])
    noise = repeat_noise(table)
    needed = 1 + max(2 * noise, MIN_GAP)
    return ratio > needed, (
        f"one evaluation at {workers} workers: rank0 {at_n['rank0']:.1f} ms, sharded "
        f"{at_n['sharded']:.1f} ms (×{ratio:.2f}; needed ×{needed:.2f}: twice the 1-worker "
        f"repeat's {noise:.0%}, at least {MIN_GAP:.0%}); speed-up vs 1 worker rank0 "
        f"{speedups['rank0']:.2f}, sharded {speedups['sharded']:.2f}"
    )
