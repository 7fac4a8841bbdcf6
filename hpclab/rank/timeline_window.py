"""Horovod's timeline over a window of steps of a run (``RunConfig.timeline_steps``).

Every rank calls ``hvd.start_timeline`` after the run's first call and ``hvd.stop_timeline`` once
the window's steps are done (or the run ends); Horovod's coordinator, rank 0, writes the file and
then summarises it (:mod:`hpclab.core.timeline`). Ranks take the same steps, so they switch it at the
same call without talking to each other.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpclab.core.timeline import FILE, summarise

FLUSH_S = 3.0  # Horovod's writer thread closes the file shortly after stop_timeline


class TimelineWindow:
    def __init__(self, hvd, run_dir: Path, steps: int, world: int):
        self.hvd, self.path = hvd, Path(run_dir) / FILE
        self.steps = int(steps) if world > 1 else 0  # one rank: no collective to record
        self.start: int | None = None
        self.done = False
        self.summary: dict | None = None

    def after_call(self, step: int, last: bool = False) -> None:
        """Start after the first call, stop ``steps`` steps later (or at the run's end)."""
        if not self.steps or self.done:
            return
        if self.start is None:
            if last:
                return
            self.hvd.start_timeline(str(self.path), mark_cycles=False)
            self.start = step
        elif last or step - self.start >= self.steps:
            self.hvd.stop_timeline()
            self.done = True
            if self.hvd.rank() == 0:
                self.summary = self._summarise(step - self.start)

    def _summarise(self, steps: int) -> dict:
        deadline = time.monotonic() + FLUSH_S
        while time.monotonic() < deadline:  # the writer thread flushes asynchronously
            if self.path.exists() and self.path.stat().st_size > 0:
                try:
                    out = summarise(self.path, steps)
                    if out["events"]:
                        return out
                except (OSError, ValueError):
                    pass
            time.sleep(0.1)
        return {"file": FILE, "steps": steps, "ms_per_step": {}, "tensors": [], "events": 0}
