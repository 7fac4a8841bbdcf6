"""A rank's sign of life: a counter published once a second from a thread of its own.

Rank 0's telemetry says how far training got, but not who is to blame when it stops: a rank that
hangs (SIGSTOP, a stuck file system, a deadlocked library) leaves every other rank waiting in the
next allreduce, and all of them fall silent together. A thread beside the training loop keeps
beating while its rank merely waits — TensorFlow and Horovod release the GIL in their calls — and
stops only when the whole process stops. The client (:mod:`hpclab.cluster.watchdog`) names the rank whose
counter stops moving.

The counter goes out through ipyparallel's datapub under its own key (the client merges keys, so
rank 0's telemetry is untouched); ipykernel's IOPub socket is a background thread's and safe to
send on from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

KEY = "hpclab_heartbeat"  # the datapub key the client reads (hpclab.cluster.run)
EVERY_S = 1.0


class Heartbeat:
    """``with Heartbeat(send):`` publishes ``{KEY: n}`` (n = 1, 2, …) every ``every_s`` seconds."""

    def __init__(self, send: Callable[[dict], None], every_s: float = EVERY_S):
        self.send, self.every_s = send, every_s
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hpclab-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            self.beats += 1
            try:
                self.send({KEY: self.beats})
            except Exception:  # noqa: BLE001 — a lost beat is what the watchdog is there to see
                pass
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2 * self.every_s)


__all__ = ["Heartbeat", "KEY", "EVERY_S"]
