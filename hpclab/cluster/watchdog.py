"""Which rank stopped responding: the client's reading of every rank's heartbeat.

Each rank publishes a counter once a second from a thread beside its training loop
(:mod:`hpclab.rank.heartbeat`). A rank that hangs — SIGSTOP, a stuck file system, a deadlock
in a library — stops its counter; the ranks waiting for it in an allreduce keep theirs going. So
the rank whose counter stands still for ``hang_s`` seconds is the one to name, and when every
counter stands still the link to all of them is gone (the ipyparallel controller, usually).
Without this, ipyparallel's own heartbeat declares the engines dead only after ~30-40 s and no
message names the culprit.

Pure bookkeeping on the client's clock (no clocks of other hosts are compared); the process state
of a rank on this host is read with psutil (ipyparallel's own dependency).

The client's own silence is not the ranks': while the client is paused (Ctrl-Z, a cell holding
the GIL, a VM or laptop pause) no heartbeat can reach the watchdog, and when it resumes its
messages are still queued behind ipyparallel's IO thread. So :meth:`Watchdog.tick`, called once
per look, measures the gap since the last look; a gap longer than ``pause_s`` was the client's
pause and is credited to every rank, which are judged only on time the client was there to hear.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

from hpclab.rank.heartbeat import STAGES, WAITING

#: A rank silent this long stopped responding (heartbeats come every second). Shorter than the
#: ten missed controller heartbeats after which ipyparallel declares an engine dead (~10 s with
#: hpclab.cluster.launch.HEARTBEAT_MS), so a hang is named as a hang, not as a death.
HANG_S = 8.0
#: A rank whose stage (hpclab.rank.heartbeat.STAGES) lasts longer than this makes no progress:
#: the default of ``EngineSettings.stall_s``, which also sets Horovod's own stall warning.
STALL_S = 120.0
#: Compiling and generating may last this many times the stall bound before a rank is named:
#: tracing and optimising a big model's first call on a CPU takes minutes (ResNet-50's graph,
#: XLA), and so does generating a large MNIST-1D (~30 s for the workshop's 40,960 samples here).
COMPILE_FACTOR = 5
#: A training call may last this many times the longest this run has made (calls are sized to
#: ~0.15 s, but a straggler, a heavy model or a busy machine makes some far longer).
CALL_FACTOR = 10
#: A gap this long between two looks of the run's monitor (which looks every 0.2 s) means the
#: client itself was paused; the gap is not counted against any rank.
PAUSE_S = 2.0

_STATES = {  # psutil status → what it means for a rank that stopped beating
    "stopped": "its process is stopped (SIGSTOP or SIGTSTP)",
    "tracing-stop": "its process is stopped by a debugger",
    "disk-sleep": "its process waits in uninterruptible I/O (a stuck file system?)",
    "zombie": "its process has exited",
    "dead": "its process has exited",
}


class Watchdog:
    """Per-rank heartbeat counters as the client sees them; :meth:`verdict` names the silent."""

    def __init__(
        self,
        ranks: list[dict],
        hang_s: float = HANG_S,
        clock: Callable[[], float] = time.monotonic,
        pause_s: float = PAUSE_S,
        stall_s: float = STALL_S,
    ):
        self.ranks, self.hang_s, self.clock = ranks, float(hang_s), clock
        self.pause_s, self.stall_s = float(pause_s), float(stall_s)
        self._progress: list[dict] = [{} for _ in ranks]
        now = clock()
        self._value: list[object] = [None] * len(ranks)
        self._changed = [now] * len(ranks)  # the start counts as a sign of life
        self._last_look = now
        self.paused_s = 0.0  # the client's own pauses so far, credited to every rank

    def tick(self) -> float:
        """One look at the ranks begins: a gap since the last look longer than ``pause_s`` was
        the client's own pause, credited to every rank. Returns the gap credited (0 if none)."""
        now = self.clock()
        gap, self._last_look = now - self._last_look, now
        if gap <= self.pause_s:
            return 0.0
        self._changed = [t + gap for t in self._changed]
        self.paused_s += gap
        return gap

    def observe(self, rank: int, value: object) -> None:
        """Rank `rank`'s latest heartbeat (None: none seen yet): a counter, or a dict with the
        counter ``n`` and the rank's progress (hpclab.rank.heartbeat.Progress.report)."""
        if isinstance(value, dict):
            self._progress[rank] = value
            value = value.get("n")
        if value is not None and value != self._value[rank]:
            self._value[rank], self._changed[rank] = value, self.clock()

    def bound_s(self, progress: dict) -> float:
        """How long a rank may stay in its stage before it is named: ``stall_s``; a first
        compile or a data set's generation COMPILE_FACTOR times that; a training call CALL_FACTOR times the longest this
        run has made, if that is more."""
        stage = progress.get("stage")
        if stage in ("compile", "generate"):
            return COMPILE_FACTOR * self.stall_s
        if stage == "training":
            return max(self.stall_s, CALL_FACTOR * float(progress.get("longest_call_s") or 0))
        return self.stall_s

    def stuck(self, among: list[int] | None = None) -> dict[int, dict]:
        """Ranks (of `among`, default all) still beating whose stage has lasted past its bound
        (:meth:`bound_s`) → their progress. Measured on each rank's own clock, so a client's
        pause never counts."""
        ranks = range(len(self.ranks)) if among is None else among
        out = {}
        for r in ranks:
            p = self._progress[r]
            if p.get("stage") and float(p.get("for_s") or 0) > self.bound_s(p):
                out[r] = p
        return out

    def stuck_verdict(self, among: list[int] | None = None) -> str | None:
        """A sentence naming the rank(s) making no progress, or None. A rank stuck in its own
        work (reading data, evaluating, compiling) is named first, and ranks waiting in a
        collective meanwhile are said to wait for it. Ranks that only wait are not named while
        another rank is still in its own work within its bound: they wait for it, it is judged
        on its own bound (which may be longer, as a compile's is), and its report may be up to
        a beat older than theirs. Only when every stuck rank waits in a collective and no rank
        works are they all named (a deadlock, or a rank lost inside one)."""
        stuck = self.stuck(among)
        if not stuck:
            return None
        own = {r: p for r, p in stuck.items() if p["stage"] not in WAITING}
        ranks = range(len(self.ranks)) if among is None else among
        if not own:
            if any(self._progress[r].get("stage") not in (None, *WAITING) for r in ranks):
                return None  # (a rank in its own work is not stuck: `own` would hold it)
        named = own or stuck
        parts = []
        for r, p in sorted(named.items()):
            rank = self.ranks[r]
            at = f" at step {p['step']}" if p.get("step") is not None else ""
            parts.append(
                f"rank {rank.get('rank', r)} (pid {rank.get('pid', '?')} on "
                f"{rank.get('host', '?')}) has been {STAGES.get(p['stage'], p['stage'])}{at} "
                f"for {float(p['for_s']):.0f} s (bound {self.bound_s(p):.0f} s)"
            )
        sentence = "; ".join(parts)
        if own:
            # every rank in a collective waits for it, past its own bound or not yet (its report
            # may be a beat older)
            waiting = sorted(
                r for r in ranks if r not in own and self._progress[r].get("stage") in WAITING
            )
            if waiting:
                sentence += f"; rank(s) {', '.join(map(str, waiting))} wait for it in a collective"
        return sentence

    def silent(self, among: list[int] | None = None, longer_than: float | None = None):
        """Ranks (of `among`, default all) silent longer than `longer_than` (default hang_s)
        → seconds silent."""
        now, limit = self.clock(), self.hang_s if longer_than is None else longer_than
        ranks = range(len(self.ranks)) if among is None else among
        return {r: now - self._changed[r] for r in ranks if now - self._changed[r] > limit}

    def all_silent(self, among: list[int]) -> bool:
        """Every one of several ranks silent together: past the limit, or within half of it (the
        ranks' last beats arrived a second or so apart; the first to cross the limit must not
        be named alone when the path from all of them is what broke)."""
        return len(among) > 1 and len(self.silent(among, self.hang_s / 2)) == len(among)

    def verdict(self, among: list[int] | None = None, link: str = "") -> str | None:
        """A sentence naming the silent rank(s), or None while every rank beats.

        `among`: the ranks still expected to beat (those whose task has not returned). `link`:
        what the caller knows about the path from the ranks to here (e.g. "the ipyparallel
        controller exited"), said when every rank is silent at once."""
        expected = list(range(len(self.ranks))) if among is None else list(among)
        silent = self.silent(expected)
        if not silent:
            return None
        if self.all_silent(expected):
            worst = max(silent.values())
            why = link or "their heartbeats stopped reaching this client"
            return f"no rank sent a heartbeat for {worst:.0f} s: {why}"
        return self.describe(silent)

    def describe(self, silent: dict[int, float]) -> str:
        """'rank N (pid P on H) stopped responding: no heartbeat for S s; <process state>'."""
        parts = []
        for r, seconds in sorted(silent.items()):
            rank = self.ranks[r]
            state = process_state(rank)
            parts.append(
                f"rank {rank.get('rank', r)} (pid {rank.get('pid', '?')} on "
                f"{rank.get('host', '?')}) stopped responding: no heartbeat for {seconds:.0f} s"
                + (f"; {state}" if state else "")
            )
        return "; ".join(parts)


def process_state(rank: dict) -> str:
    """What psutil says of a rank's process on this host ('' elsewhere or when it looks fine)."""
    if rank.get("host") != platform.node() or not rank.get("pid"):
        return ""
    import psutil

    try:
        status = psutil.Process(int(rank["pid"])).status()
    except psutil.NoSuchProcess:
        return "its process has exited"
    except psutil.Error:
        return ""
    return _STATES.get(status, "")


__all__ = ["Watchdog", "HANG_S", "STALL_S", "process_state"]
