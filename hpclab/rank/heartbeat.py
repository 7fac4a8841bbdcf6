"""A rank's sign of life and of progress: a counter and the rank's stage, published once a
second from a thread of its own.

Rank 0's telemetry says how far training got, but not who is to blame when it stops: a rank that
hangs (SIGSTOP, a stuck file system, a deadlocked library) leaves every other rank waiting in the
next allreduce, and all of them fall silent together. A thread beside the training loop keeps
beating while its rank merely waits — TensorFlow and Horovod release the GIL in their calls — and
stops only when the whole process stops. The client (:mod:`hpclab.cluster.watchdog`) names the rank whose
counter stops moving.

Life is not progress: a rank blocked in a read on a hung file system, or waiting in a collective
for a rank that is, keeps beating. So each beat also carries what the rank is doing
(:data:`STAGES`: its data, building, compiling, training, evaluating) and for how long, on the
rank's own clock (:class:`Progress`); the watchdog names a rank whose stage has lasted past its
bound, and tells one stuck in its own work apart from ranks waiting for it in a collective.

The beat goes out through ipyparallel's datapub under its own key (the client merges keys, so
rank 0's telemetry is untouched); ipykernel's IOPub socket is a background thread's and safe to
send on from any thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

KEY = "hpclab_heartbeat"  # the datapub key the client reads (hpclab.cluster.run)
EVERY_S = 1.0

#: What a rank can be doing, as the watchdog's sentence says it; the stages named in
#: ``WAITING`` wait in a collective for every other rank (Horovod matches them across ranks).
STAGES = {
    "start": "starting the run",
    "data": "reading its data",
    "generate": "generating and caching its data set",
    "data_wait": "waiting in a collective for rank 0 to read and cache the data",
    "build": "building its model and receiving rank 0's weights (a collective)",
    "compile": "tracing and compiling its training step",
    "training": "in a training call (computing, or in the gradient allreduce)",
    "evaluation": "evaluating on held-out data",
    "checkpoint": "writing a checkpoint of the run's state (rank 0)",
    "finish": "finishing the run (gathering the record)",
}
WAITING = ("data_wait", "build", "training", "finish")


class Progress:
    """This rank's stage and since when, on its own monotonic clock (a paused client or a
    clock step elsewhere changes nothing); ``longest_call_s`` lets the watchdog scale its bound
    on a training call with the calls this run has made."""

    def __init__(self) -> None:
        self.enter("start")

    def enter(self, stage: str, step: int | None = None) -> None:
        self.stage, self.step, self.since = stage, step, time.monotonic()
        if stage == "start":
            self.longest_call_s = 0.0

    @contextlib.contextmanager
    def during(self, stage: str, step: int | None = None):
        """``stage`` for the block, then back to the stage before (its clock restarted)."""
        before = self.stage, self.step
        self.enter(stage, step)
        try:
            yield
        finally:
            self.enter(*before)

    def call_took(self, seconds: float) -> None:
        self.longest_call_s = max(self.longest_call_s, float(seconds))

    def report(self) -> dict:
        return {
            "stage": self.stage,
            "step": self.step,
            "for_s": round(time.monotonic() - self.since, 3),
            "longest_call_s": round(self.longest_call_s, 3),
        }


#: This engine's progress: one rank per engine process, one run at a time.
PROGRESS = Progress()


class Heartbeat:
    """``with Heartbeat(send):`` publishes ``{KEY: {"n": n, **progress}}`` (n = 1, 2, …) every
    ``every_s`` seconds; entering it starts the run's progress at ``start``."""

    def __init__(
        self, send: Callable[[dict], None], every_s: float = EVERY_S, progress: Progress = PROGRESS
    ):
        self.send, self.every_s, self.progress = send, every_s, progress
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hpclab-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            self.beats += 1
            try:
                self.send({KEY: {"n": self.beats, **self.progress.report()}})
            except Exception:  # noqa: BLE001 — a lost beat is what the watchdog is there to see
                pass
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> Heartbeat:
        self.progress.enter("start")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2 * self.every_s)


__all__ = ["Heartbeat", "KEY", "EVERY_S", "PROGRESS", "Progress", "STAGES", "WAITING"]
