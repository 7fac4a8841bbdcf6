"""What a running ``hpclab`` command shows on stderr: status lines and the progress of one run.

stdout is kept for results (``hpclab run --json`` prints exactly one line there), so everything
said while working goes to stderr through :func:`say` and :class:`Progress`.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any


def say(message: str) -> None:
    """One status line on stderr."""
    print(message, file=sys.stderr, flush=True)


def _val_text(value: Any) -> str:
    """An epoch's held-out accuracy; above 16 ranks short epochs skip the full validation
    (hpclab.core.plan.RunPlan.full_eval_due) and their rows carry NaN."""
    v = num(value)
    return f"val_acc {v:.3f}" if math.isfinite(v) else "val_acc not evaluated this epoch"


def num(value: Any, default: float = float("nan")) -> float:
    """A telemetry value as a float (None, missing or NaN-able junk become `default`)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) else default


class Progress:
    """Progress of one run on stderr: a tqdm bar on a terminal, a line per epoch otherwise."""

    def __init__(self, total_steps: int, enabled: bool):
        self.enabled, self.total_steps = enabled, total_steps
        self.bar = None
        self.epochs_seen = 0  # the number of the last epoch printed
        self._lock = threading.Lock()  # called from the run's monitor thread and at the end

    def start(self) -> None:
        """Once the run has started (so the bar's clock does not count the engines' start-up)."""
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total_steps, unit="step", file=sys.stderr, dynamic_ncols=True, leave=True
            )

    def __call__(self, run) -> None:  # Run.on_update: from the run's monitor thread
        with self._lock:
            self._update(run)

    def _update(self, run) -> None:
        if not self.enabled:
            return
        if sys.stderr.isatty():
            bar = self.bar  # close() may run meanwhile on the main thread
            last = run.last_row  # the newest row only: the cost stays flat over a long run
            if bar is None or last is None:
                return
            bar.n = int(num(last.get("step"), 0))
            bar.set_postfix(
                {
                    "loss": f"{num(last.get('loss')):.3g}",
                    "samples/s": f"{num(last.get('samples_per_sec')):,.0f}",
                    "lr": f"{num(last.get('lr')):.3g}",
                },
                refresh=False,
            )
            bar.refresh()
        else:
            new = run.epoch_rows(after=self.epochs_seen)  # only the epochs not yet printed
            for row in new:
                say(
                    f"  epoch {int(num(row.get('epoch'), 0))}: "
                    f"step {int(num(row.get('step'), 0))}, "
                    f"loss {num(row.get('loss')):.4g}, "
                    f"{_val_text(row.get('val_accuracy'))}, "
                    f"{num(row.get('samples_per_sec')):,.0f} samples/s"
                )
            if new:
                self.epochs_seen = int(new[-1]["epoch"])

    def close(self, run=None) -> None:
        """Draw the last state of `run` (if given), then stop drawing."""
        with self._lock:
            if run is not None:
                self._update(run)
            self.enabled = False
            bar, self.bar = self.bar, None
            if bar is not None:
                bar.close()


__all__ = ["say", "num", "Progress"]
