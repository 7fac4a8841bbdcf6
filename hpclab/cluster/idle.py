"""Stop a lab's engines once they have been idle for a while; the next run starts them again.

An idle engine is not idle: Horovod's background thread negotiates with the other ranks every
``HOROVOD_CYCLE_TIME`` (an MPI_Allreduce in ``CacheCoordinator::sync``), and MPICH busy-polls
while it waits for the slower rank, so a 2-engine lab burns about half a core per engine while
its user reads (benchmarks/README.md, "Measurements behind rules in the code"). Nothing short of
ending that thread stops it: a longer cycle still spins (0.39 of a core at 5 ms), MPICH's
``MPIR_CVAR_ENABLE_HEAVY_YIELD`` only lowers it (about 0.17), and ``hvd.shutdown()`` followed by
``hvd.init()`` crashes Horovod 0.28.1 once the cycle time and fusion buffer are set from the
environment (``ParameterManager::BayesianParameter::SetValue`` writes past a vector emptied by
the fixed values). So the engines themselves go, and with them their memory; the cost moves to
the first run after the pause, which starts fresh engines (a cold start, seconds).

:class:`IdleStop` is a thread of the client's that checks once a second; ``Lab.run`` and
``Lab.apply`` enter :meth:`IdleStop.active`, which starts stopped engines again and keeps them
from being stopped under a call.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref

from hpclab.core.errors import ConfigError

log = logging.getLogger(__name__)
POLL_S = 1.0  # how often the thread looks; the pause is measured to within this


def check_after(after_s) -> float | None:
    """``after_s`` as seconds (None: never stop), or a ConfigError naming the value."""
    if after_s is None:
        return None
    ok = isinstance(after_s, (int, float)) and not isinstance(after_s, bool)
    if not ok or not math.isfinite(after_s) or after_s <= 0:
        raise ConfigError(
            f"Lab.idle_stop_s must be a number of seconds > 0, or None to keep idle engines; "
            f"you passed idle_stop_s={after_s!r}."
        )
    return float(after_s)


class IdleStop:
    """Stops ``lab``'s engines after ``after_s`` seconds with no run and no ``apply`` call.

    ``stopped`` is set each time it stops them (an event to wait on) and cleared when they start
    again; ``asleep`` says whether the next call must start them."""

    def __init__(self, lab, after_s: float | None):
        self.after_s = after_s
        self.asleep = False
        self.stopped = threading.Event()
        self._lab = weakref.ref(lab)  # the thread must not keep a forgotten lab alive
        self._lock = threading.RLock()
        self._busy = 0
        self._idle_since: float | None = None
        self._end = threading.Event()
        self._thread: threading.Thread | None = None
        if after_s is not None:
            self._thread = threading.Thread(
                target=self._watch, name="hpclab-idle-stop", daemon=True
            )
            self._thread.start()

    @contextlib.contextmanager
    def active(self):
        """Around a call that needs the engines: starts them if they were stopped for idling,
        and none are stopped until it returns; the idle clock restarts when it does."""
        with self._lock:
            self._busy += 1
            try:
                if self.asleep:
                    log.info("starting the engines again (stopped while idle).")
                    self.asleep = False
                    self.stopped.clear()
                    self._lab().start()
            except BaseException:
                self._busy -= 1
                raise
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                self._idle_since = None

    def cancel(self) -> None:
        """The lab was stopped on purpose: nothing to start again at the next call."""
        self.asleep = False

    def close(self) -> None:
        self._end.set()

    def _watch(self) -> None:
        while not self._end.wait(POLL_S):
            lab = self._lab()
            if lab is None:
                return
            try:
                self._check(lab, time.monotonic())
            except Exception as exc:  # noqa: BLE001 — a failed stop must not end the watch
                log.warning("stopping the idle engines failed: %r", exc)
            del lab

    def _check(self, lab, now: float) -> None:
        run = lab.current_run
        # lab.view is set once start() has finished: a start in progress is not idle
        up = lab.healthy and lab.view is not None
        idle = up and self._busy == 0 and (run is None or run.done)
        if not idle:
            self._idle_since = None
            return
        if self._idle_since is None:
            self._idle_since = now
            return
        if now - self._idle_since < self.after_s:
            return
        with self._lock:
            run = lab.current_run
            if self._busy or not lab.healthy or lab.view is None or (run and not run.done):
                return
            lab.stop()
            self.asleep = True
            self._idle_since = None
        log.info(
            "stopped the engines after %g s idle (they spin while idle); the next run starts them.",
            self.after_s,
        )
        self.stopped.set()


__all__ = ["IdleStop", "check_after"]
