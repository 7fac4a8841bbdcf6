"""`Run`: the client-side handle of one training run.

A background thread polls each rank's ipyparallel AsyncResult: rank 0's published telemetry
(datapub keeps only the latest value, so rank 0 publishes what is new with a bounded resend,
and the client takes rows in order, from rank 0's log in the run folder where it fell behind:
`hpclab.cluster.intake`), and every rank's completion or death. Rows go to the run folder as they
arrive (`hpclab.records.store.RunStore`), then to any `on_update` callbacks (the dashboard). In
memory the handle keeps the newest rows exactly and older ones thinned
(`hpclab.core.thinning.Thinned`), so its memory stays flat over a long run; `history` reads the
full record from the run folder once rows were thinned. The handle never blocks the notebook: `lab.run()` returns at once and
`wait()` is opt-in.

The monitor thread never prints (that would land in whatever notebook cell happens to run): what
it has to say goes to the ``hpclab.cluster.run`` logger, and the handle carries the state (`status`,
`error`, `summary`, `callback_errors`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

import pandas as pd

from hpclab.cluster.intake import Intake
from hpclab.cluster.watchdog import HANG_S, STALL_S, Watchdog
from hpclab.core.catalog import TELEMETRY_FILES
from hpclab.core.config import RunConfig
from hpclab.core.errors import RunFailed
from hpclab.core.thinning import Thinned
from hpclab.rank.heartbeat import KEY as HEARTBEAT
from hpclab.records.jsonio import read_jsonl
from hpclab.records.store import RunRecord, RunStore

POLL_S = 0.2
STOP_GRACE_S = 10.0  # after a STOP request to a training run, how long before the last-resort
# abort, on top of two of its longest calls (stop_grace_s)
SETUP_GRACE_S = 180.0  # the same while ranks still set up (data generation, first trace), or
# after rank 0 said the ranks left the loop (they are only finishing up)
PEER_GRACE_S = 5.0  # a rank raised while others still run: they are blocked in an allreduce
#: Rows (and epoch rows) the handle keeps in memory: the newest KEEP_RECENT exactly, older ones
#: thinned to at most KEEP_OLDER (the dashboard draws ≤ ~2,000 points a trace; the CLI and the
#: stop grace read only the newest). ~3 KB a row: ≤ ~25 MB however long the run.
KEEP_RECENT, KEEP_OLDER = 4000, 4000

log = logging.getLogger(__name__)


class Run:
    def __init__(
        self,
        *,
        config: RunConfig,
        workers: int,
        store: RunStore,
        results: list,
        ranks: list[dict],
        on_engines_lost: Callable[[str], None],
        abort: Callable[[], None],
        launcher_output: Callable[[], str],
        link_state: Callable[[], str] = lambda: "",
        hang_s: float = HANG_S,
        stall_s: float = STALL_S,
        resumed: list[dict] | None = None,
    ):
        self.config, self.workers, self._store = config, workers, store
        self.resumed = resumed  # a resumed run's resumes so far (hpclab.cluster.resume)
        self.run_id, self.path = store.run_id, store.path
        self._results = results  # one AsyncResult per rank, rank order
        self._ranks = ranks  # init_worker identities, rank order
        self._on_engines_lost, self._abort = on_engines_lost, abort
        self._launcher_output = launcher_output
        self._link_state = link_state  # why no rank can reach us ('' when the controller runs)
        self._watchdog = Watchdog(ranks, hang_s, stall_s=stall_s)
        self._rows = Thinned(KEEP_RECENT, KEEP_OLDER)
        self._epochs = Thinned(KEEP_RECENT, KEEP_OLDER)
        self._row_in = Intake(self.path / TELEMETRY_FILES["rows"], "step")
        self._epoch_in = Intake(self.path / TELEMETRY_FILES["epochs"], "epoch")
        self._callbacks: list[Callable] = []
        self.callback_errors = 0  # times an on_update callback raised (each one is logged)
        self.disk_error: str | None = None  # why the run folder stopped taking rows, if it did
        self._failed_callbacks: set[int] = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.summary: dict = {}
        self.status = "running"
        self.error: str | None = None
        self.started = time.time()
        self._stop_requested_at: float | None = None
        self._stop_reason: tuple[str, str] | None = None
        self._unstoppable: str | None = None  # why a stop request could not reach the ranks
        self._training_seen = False  # rank 0 has published from inside the training loop
        self._loop_left = False  # rank 0 published a final state: every rank left it
        self._first_window_s = 0.0  # rank 0's seconds to its first history row (stop grace)
        self._longest_gap_s = 0.0  # the longest stretch between two history rows (stop grace)
        self._completing = False  # one outcome only: the monitor's or the lab's (end_with_lab)
        self._thread = threading.Thread(
            target=self._monitor, name=f"hpclab-run-{self.run_id}", daemon=True
        )
        self._thread.start()

    # -- public ---------------------------------------------------------------------------
    @property
    def history(self) -> pd.DataFrame:
        """Every history row: from memory while nothing was thinned, else from the run folder."""
        return pd.DataFrame(self._table(self._rows, "metrics.jsonl"))

    @property
    def epochs(self) -> pd.DataFrame:
        return pd.DataFrame(self._table(self._epochs, "epochs.jsonl"))

    def _table(self, held: Thinned, name: str) -> list[dict]:
        with self._lock:
            if held.complete or self.disk_error is not None:  # (then memory is all there is)
                return held.items()
        return read_jsonl(self.path / name)

    @property
    def last_row(self) -> dict | None:
        """The newest history row (a copy), or None before the first; O(1) however long the
        run, unlike ``history`` (a DataFrame of every row), for progress bars."""
        with self._lock:
            last = self._rows.last()
            return dict(last) if last is not None else None

    def rows_since(self, n: int) -> tuple[list[dict], int]:
        """The history rows that arrived as number ``n`` or later (held exactly: the newest
        KEEP_RECENT), and the number to ask from next time: O(new) for a live chart."""
        with self._lock:
            return [dict(r) for r in self._rows.since(n)], self._rows.count

    def epoch_rows(self, after: int = 0) -> list[dict]:
        """The epoch rows numbered above ``after`` (their ``epoch``), as dicts: a caller that
        has shown epochs up to ``after`` reads only the new ones (O(new), not O(epochs))."""
        with self._lock:
            return [dict(r) for r in self._epochs.newest(lambda r: r["epoch"] > after)]

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def to_csv(self, path=None, table: str = "history"):
        """The run's `history` (default) or `epochs` as CSV text, or written to `path`
        (:func:`hpclab.records.export.run_csv`; one column per rank for per-rank lists)."""
        from hpclab.records.export import run_csv

        return run_csv(self, table, path)

    def wait(self, timeout: float | None = None, *, check: bool = True) -> dict:
        """Block until the run ends; return the summary. Raises RunFailed if it failed/diverged
        (with ``check=False`` it returns what there is: the status says what happened),
        TimeoutError if it is still running after `timeout` seconds (the run goes on)."""
        if not self._done.wait(timeout):
            raise TimeoutError(
                f"run {self.run_id} is still running after {timeout} s "
                "(it goes on; call run.stop() to end it)."
            )
        if check and self.status in ("failed", "diverged"):
            raise RunFailed(f"run {self.run_id} {self.status}: {self.error}")
        return self.summary or {}

    def stop(self, timeout: float = 5.0, reason: tuple[str, str] | None = None) -> None:
        """Ask every rank to stop after the same step; wait up to `timeout` s for them.
        ``reason``: (word, sentence) for the record of a stopped run — e.g. ("walltime", "SIGUSR1:
        ...") from :func:`hpclab.tools.stop_signals.last_reason`; default ("requested", ...)."""
        if self.done:
            return
        self._stop_reason = reason or ("requested", "stopped on request (run.stop())")
        self._stop_requested_at = time.time()
        try:
            self._store.request_stop()
        except OSError as exc:  # the monitor ends the ranks the last-resort way
            self._unstoppable = f"the stop request could not be written ({exc})"
        self._done.wait(timeout)

    def end_with_lab(self) -> None:
        """The lab stops its engines under this run, which has not ended (its ranks still set
        up, or did not stop within Lab.stop's wait): record it as 'stopped', saying so."""
        if self.done:
            return
        doing = "training" if self._training_seen else "setting up"
        message = f"the lab was stopped while the ranks were {doing}; they ended with the engines"
        self._complete("stopped", message, {"status": "stopped", "world_size": self.workers})

    def on_update(self, callback: Callable[[Run], None]) -> None:
        """Call `callback(run)` from the monitor thread after new rows and once at the end."""
        self._callbacks.append(callback)
        if self.done:
            callback(self)

    def record(self) -> RunRecord:
        return RunRecord(
            path=self.path,
            meta={"config": self.config.to_dict(), "workers": self.workers, "run_id": self.run_id},
            summary=dict(self.summary),
            history=self.history,
            epochs=self.epochs,
        )

    @property
    def label(self) -> str:
        return self.config.label(self.workers)

    def __repr__(self) -> str:
        return f"<Run {self.run_id} {self.label!r} {self.status}>"

    # -- monitor thread ---------------------------------------------------------------------
    def _monitor(self) -> None:
        try:
            while not self.done:  # (end_with_lab ends the run from the lab's thread)
                self._take_telemetry()
                finished = [r.ready() for r in self._results]
                if all(finished):
                    self._finish()
                    return
                if any(finished) and self._peer_failed():
                    return
                if self._hung([i for i, done in enumerate(finished) if not done]):
                    return
                if self._unstoppable is not None:
                    self._fail(f"{self._unstoppable}; every rank was ended", engines_lost=True)
                    return
                in_loop = self._training_seen and not self._loop_left
                grace = self.stop_grace_s if in_loop else SETUP_GRACE_S
                if (
                    self._stop_requested_at is not None
                    and time.time() - self._stop_requested_at > grace
                ):
                    self._fail(
                        "the ranks did not stop within "
                        f"{grace:.0f} s of the stop request and were aborted; "
                        "call lab.restart() for fresh engines",
                        engines_lost=True,
                    )
                    return
                time.sleep(POLL_S)
        except Exception as exc:  # noqa: BLE001 — the monitor must never die silently: record why
            log.exception("run %s: the run monitor failed", self.run_id)
            # nobody would watch the ranks any more: end them rather than let them train on
            self._fail(f"the run monitor failed: {exc!r}", engines_lost=True)

    @property
    def stop_grace_s(self) -> float:
        """How long the ranks of a training run get to stop before the last-resort abort.

        Rank 0 reads a stop request before a compiled call and the call's closing allreduce
        tells every rank, so the ranks leave the loop after at most the rest of the running
        call and one more: two calls. History rows end only between calls, so the longest
        stretch between two rows bounds a call from above (the first row, which also holds the
        graph's optimisation, only while it is the only one). Hence STOP_GRACE_S plus two of
        those: a run whose calls take 8 s keeps its engines on a stop."""
        return STOP_GRACE_S + 2.0 * (self._longest_gap_s or self._first_window_s)

    def _take_telemetry(self) -> None:
        data = self._results[0].data or {}
        payload = data.get("hpclab")
        if not payload:
            return
        self._training_seen = True
        self._loop_left = payload.get("state", "running") != "running"
        self._merge(
            self._row_in.take(payload.get("rows_at"), payload.get("rows", [])),
            self._epoch_in.take(payload.get("epochs_at"), payload.get("epochs", [])),
        )

    def _merge(self, new_rows: list[dict], new_epochs: list[dict]) -> None:
        """Rows new and in order (:class:`hpclab.cluster.intake.Intake`): kept, written, told."""
        with self._lock:
            self._measure_windows(new_rows)
            self._rows.extend(new_rows)
            self._epochs.extend(new_epochs)
        if new_rows:
            self._write("rows", lambda: self._store.append_history(new_rows))
        if new_epochs:
            self._write("epoch rows", lambda: self._store.append_epochs(new_epochs))
        if new_rows or new_epochs:
            self._notify()

    def _measure_windows(self, new_rows: list[dict]) -> None:
        """The first row's stretch (since the loop began) and the longest between two rows, on
        rank 0's clock (`time_s`); called before `new_rows` join the history."""
        last = self._rows.last()
        times = [r.get("time_s") for r in ([last] if last is not None else []) + new_rows]
        if not times or None in times:
            return
        if last is None:
            self._first_window_s = float(times[0])
        for earlier, later in zip(times, times[1:]):
            self._longest_gap_s = max(self._longest_gap_s, float(later - earlier))

    def _say_taken(self, rows_total: int | None, epochs_total: int | None) -> None:
        """Log how many rows came from rank 0's log (the client was behind) and any missing."""
        for what, intake, total in (
            ("rows", self._row_in, rows_total),
            ("epoch rows", self._epoch_in, epochs_total),
        ):
            if intake.from_log:
                log.info(
                    "run %s: %d %s the live messages missed were read from rank 0's log",
                    self.run_id,
                    intake.from_log,
                    what,
                )
            if total is not None and intake.count < total:
                log.warning(
                    "run %s: %d of rank 0's %d %s never reached the client (its log in %s "
                    "was not readable)",
                    self.run_id,
                    total - intake.count,
                    total,
                    what,
                    self.path,
                )

    def _write(self, what: str, write: Callable[[], None]) -> None:
        """Write to the run folder, until a write fails (a full disk, a deleted folder): then
        say so once and keep the rows in memory only (run.history, run.to_csv()), so the record
        on disk stays a gap-free prefix. The ranks train on; stop() still reaches them."""
        if self.disk_error is not None:
            return
        try:
            write()
        except OSError as exc:
            self.disk_error = f"{exc.strerror or exc}: {exc.filename or self.path}"
            log.warning(
                "run %s: writing its %s failed (%s); the run goes on and keeps its rows in "
                "memory (run.history, run.to_csv())",
                self.run_id,
                what,
                self.disk_error,
            )

    def _notify(self) -> None:
        for cb in list(self._callbacks):
            try:
                cb(self)
            except Exception:  # noqa: BLE001 — a broken chart must not stop the run's bookkeeping
                self.callback_errors += 1
                # each callback's first failure as an error; the same bug repeats at every poll
                level = logging.DEBUG if id(cb) in self._failed_callbacks else logging.ERROR
                self._failed_callbacks.add(id(cb))
                log.log(
                    level,
                    "run %s: an on_update callback (%s) failed; the run goes on",
                    self.run_id,
                    getattr(cb, "__qualname__", repr(cb)),
                    exc_info=True,
                )

    def _finish(self) -> None:
        outcomes = [r.get(return_exceptions=True) for r in self._results]
        errors = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
        if errors:
            self._fail(
                self._describe_errors(errors),
                engines_lost=any(_is_engine_death(o) for _, o in errors),
            )
            return
        rank0 = outcomes[0]
        self._take_telemetry()  # rank 0's last message, then the rest of its log
        rows = self._row_in.finish() + self._row_in.take(None, rank0.pop("rows", []))
        epochs = self._epoch_in.finish() + self._epoch_in.take(None, rank0.pop("epochs", []))
        self._merge(rows, epochs)
        self._say_taken(rank0.pop("rows_total", None), rank0.pop("epochs_total", None))
        summary = {k: v for k, v in rank0.items() if k != "rank"}
        summary["weights_digest"] = [o["weights_digest"] for o in outcomes]
        if summary.get("sdc"):  # every rank's weight digest right after the flip, its values
            ranks = [o["sdc"] or {} for o in outcomes]
            summary["sdc"]["digest_after"] = [r.get("digest_after") for r in ranks]
            summary["sdc"].update({k: r[k] for r in ranks for k in ("before", "after") if k in r})
        self._complete(summary["status"], summary.get("error"), summary)

    def _peer_failed(self) -> bool:
        """A rank ended with an error while others run: they wait in an allreduce forever."""
        failed = []
        for i, r in enumerate(self._results):
            if r.ready():
                outcome = r.get(return_exceptions=True)
                if isinstance(outcome, BaseException):
                    failed.append((i, outcome))
        if not failed:
            return False
        if any(_is_engine_death(o) for _, o in failed):
            deadline = time.time() + 2.0  # MPICH ends the whole job; let the others report
            while time.time() < deadline and not all(r.ready() for r in self._results):
                time.sleep(POLL_S)
            if all(r.ready() for r in self._results):
                self._finish()
                return True
        time.sleep(PEER_GRACE_S)
        if all(r.ready() for r in self._results):
            self._finish()
            return True
        self._fail(
            self._describe_errors(failed) + "; the other ranks were aborted", engines_lost=True
        )
        return True

    def _hung(self, pending: list[int]) -> bool:
        """A rank stopped beating (hpclab.cluster.watchdog): name it, end the run, stop every rank."""
        paused = self._watchdog.tick()
        if paused:
            log.warning(
                "run %s: this client was paused for %.0f s (the ranks trained on); their "
                "silence meanwhile is not held against them",
                self.run_id,
                paused,
            )
        for i, result in enumerate(self._results):
            self._watchdog.observe(i, (result.data or {}).get(HEARTBEAT))
        silent = self._watchdog.silent(pending)
        if not silent:
            stuck = self._watchdog.stuck_verdict(pending)
            if stuck is None:
                return False
            self._fail(
                f"no progress: {stuck} (bounds from EngineSettings.stall_s); every rank was "
                "stopped and the engines are gone — call lab.restart() for a fresh set (the "
                "next lab.run() does it)",
                engines_lost=True,
            )
            return True
        link = self._link_state() if self._watchdog.all_silent(pending) else ""
        verdict = self._watchdog.verdict(pending, link)
        self._fail(
            f"{verdict}; every rank was stopped and the engines are gone — call "
            "lab.restart() for a fresh set (the next lab.run() does it)",
            engines_lost=True,
        )
        return True

    def _describe_errors(self, errors: list) -> str:
        deaths = [(i, o) for i, o in errors if _is_engine_death(o)]
        if deaths:
            deadline = time.time() + 3.0  # mpiexec reports the bad termination a moment later
            first = self._first_dead_rank()
            while first is None and time.time() < deadline:
                time.sleep(POLL_S)
                first = self._first_dead_rank()
            # ipyparallel declares a hung engine dead too: a rank silent while others beat hung
            hung = self._watchdog.silent(longer_than=3.0) if first is None else {}
            who = (
                f"rank {first['rank']} (pid {first['pid']} on {first['host']}) died first"
                if first
                else self._watchdog.describe(hung)
                if hung and len(hung) < self.workers
                else self._link_state() or "a rank died (mpiexec did not say which)"
            )
            return (
                f"{who} and MPI ended every rank; the engines are gone — "
                "call lab.restart() for a fresh set"
            )
        i, exc = errors[0]
        name = getattr(exc, "ename", type(exc).__name__)
        value = getattr(exc, "evalue", str(exc))
        return f"rank {i} raised {name}: {value}"

    def _first_dead_rank(self) -> dict | None:
        """Which rank died first, from the engines' own log (the launcher's output file).

        Each ipyparallel engine has a nanny process that logs "Pipe closed, parent <pid> ..."
        the moment its engine dies; the killed rank's nanny logs first (~0.1 s before MPI's
        clean-up kills the rest). MPICH's own "BAD TERMINATION ... PID" line is not used: it
        names whichever process it reaped first, measured here to be the wrong rank."""
        text = self._launcher_output()
        by_pid = {r["pid"]: r for r in self._ranks}
        for match in re.finditer(r"\[KernelNanny\.\d+\] Pipe closed, parent (\d+)", text):
            if int(match.group(1)) in by_pid:
                return by_pid[int(match.group(1))]
        return None

    def _fail(self, message: str, *, engines_lost: bool) -> None:
        if engines_lost:
            self._abort()
            self._on_engines_lost(message)
        self._complete(
            "failed", message, {"status": "failed", "error": message, "world_size": self.workers}
        )

    def _complete(self, status: str, error: str | None, summary: dict) -> None:
        with self._lock:  # one outcome: the monitor's, or the lab's (end_with_lab), not both
            if self._completing:
                return
            self._completing = True
        summary = {
            **summary,
            "run_id": self.run_id,
            "status": status,
            "error": error,
            "config": self.config.to_dict(),
            "wall_time_s": summary.get("wall_time_s", time.time() - self.started),
        }
        if status == "stopped" and self._stop_reason is not None:
            summary["stop_reason"], summary["stop_detail"] = self._stop_reason
        if self.resumed:
            summary["resumed"] = self.resumed
        notes = [summary["error"]] if summary["error"] else []
        if self.disk_error is not None:
            notes.append(f"(the run folder stopped taking rows: {self.disk_error})")
            summary["error"] = " ".join(notes)
        try:
            self._store.write_summary(summary)
        except OSError as exc:  # e.g. a full disk: keep the result in memory, say so
            summary["error"] = " ".join([*notes, f"(summary not written to disk: {exc})"])
        with self._lock:
            self.summary, self.status, self.error = summary, status, summary["error"]
        try:
            self._store.stop_file.unlink(missing_ok=True)
        except OSError:
            pass
        self._done.set()
        log.info("run %s %s%s", self.run_id, status, f": {self.error}" if self.error else "")
        self._notify()


def _is_engine_death(exc: BaseException) -> bool:
    return type(exc).__name__ == "EngineError" or getattr(exc, "ename", "") == "EngineError"
