"""A simulated long run through the real telemetry code: are its costs flat in the run's length?

No training and no engines: rank 0's real meters (hpclab.rank.meters: WindowMeter, EpochMeter)
make history and epoch rows from generated telemetry (a ``[world, DETAIL]`` matrix per row, as
the allgather on a publish call returns it), rank 0's real publisher
(hpclab.rank.publisher.Publisher) sends them the way ipyparallel's datapub carries them (only the
latest message per engine is visible) and writes its log to the run folder, a real client
``Run`` (hpclab.cluster.run) takes them on its monitor thread into its history and run folder,
and a real live ``Dashboard`` (hpclab.views.panel.live) follows the run. Rows come at the real
ratio (one per publish, an epoch every ``rows_per_epoch`` rows) but as fast as the code allows.

At checkpoints over the run it measures the three costs that must stay flat (issue 31):
the latest message's pickled size, the client's memory for the run (the rows the ``Run`` and
the dashboard hold, pickled; and the process's RSS), and a dashboard redraw's time (the fastest
of three). ::

    .venv/bin/python benchmarks/long_run.py                      # 200,000 rows at 2 ranks, 10,000 at 1,024
    .venv/bin/python benchmarks/long_run.py --rows 20000 --world 2

tests/test_telemetry_flat.py runs the same simulation, shorter.
"""

from __future__ import annotations

import argparse
import os
import pickle
import threading
import time
from pathlib import Path

import numpy as np

import hpclab.cluster.run as run_module
from hpclab.cluster.run import Run
from hpclab.core import pop
from hpclab.core.config import RunConfig
from hpclab.rank.meters import DETAIL, REDUCED, EpochMeter, WindowMeter
from hpclab.rank.publisher import Publisher
from hpclab.records.store import RunStore

BATCH = 64
STEPS_PER_ROW = 8


class Datapub:
    """One rank's AsyncResult as `Run` reads it: ``data`` holds the latest message only (as
    ipyparallel's datapub does); ``ready``/``get`` give the rank's result once it is set."""

    def __init__(self):
        self.latest: dict = {}
        self.result = None
        self.away: dict | None = None  # what the client saw last before it went away

    def send(self, message: dict) -> None:
        self.latest = {**self.latest, **message}

    @property
    def data(self) -> dict:
        return self.latest if self.away is None else self.away

    def client_away(self, away: bool) -> None:
        """While away the client sees nothing new (a paused notebook); then only the latest."""
        self.away = dict(self.latest) if away else None

    def ready(self) -> bool:
        return self.result is not None

    def get(self, return_exceptions: bool = False):
        return dict(self.result)


class Rank0:
    """Rank 0's bookkeeping driven as hpclab.rank.trainer drives it, from generated numbers."""

    def __init__(self, send, folder: Path, world: int, rows_per_epoch: int = 2):
        self.world, self.rows_per_epoch = world, rows_per_epoch
        self.window = WindowMeter(BATCH, world, rows_per_epoch * STEPS_PER_ROW)
        self.epochs = EpochMeter(world)
        self.publisher = Publisher(send, 0.5, 10**9, folder=folder, world=world)
        self.step, self.t, self.rows = 0, 0.0, 0
        self.rng = np.random.default_rng(0)
        self._parts = [DETAIL.index(f"{part}_s") for part in pop.STEP_PARTS]

    def row(self) -> None:
        """One telemetry window: its row, the epoch's row if it ends one, then a publish."""
        k, world = STEPS_PER_ROW, self.world
        reduced = np.zeros(len(REDUCED))
        loss, count = self.rng.uniform(0.5, 2.0), k * BATCH * world
        reduced[[REDUCED.index(n) for n in ("loss_sum", "correct", "count")]] = (
            loss * k * world,
            0.8 * count,
            count,
        )
        self.window.add(reduced, k)
        self.epochs.add(reduced, k, self.t)
        self.step += k
        self.t += 0.5
        detail = np.zeros((world, len(DETAIL)))
        for name, value in (("samples", k * BATCH), ("steps", k), ("call_s", 0.45)):
            detail[:, DETAIL.index(name)] = value
        detail[:, DETAIL.index("host_s")] = self.rng.uniform(0.01, 0.05, world)
        detail[:, DETAIL.index("wall_s")] = 0.5
        detail[:, self._parts] = self.rng.uniform(0.01, 0.08, (world, len(self._parts)))
        row = self.window.row(self.step, self.t, 0.1, detail, None)
        row["eval_loss"], row["eval_accuracy"] = (float("nan"),) * 2
        self.publisher.add_row(row)
        self.rows += 1
        if self.rows % self.rows_per_epoch == 0:
            epoch = self.epochs.close(self.step, self.t, self.t, 0.1, (loss, 0.8))
            self.publisher.add_epoch(epoch)
        self.publisher.publish("running", self.step, self.t)

    def result(self, status: str = "finished") -> dict:
        """Rank 0's summary as Trainer._summary returns it."""
        self.publisher.publish(status, self.step, self.t)
        self.publisher.close()
        return {
            "status": status,
            "error": None,
            "rank": 0,
            "world_size": self.world,
            "steps": self.step,
            "weights_digest": "same",
            "sdc": None,
            "rows_total": self.publisher.row_count,
            "epochs_total": self.publisher.epoch_count,
        }


def client(root: Path, pubs: list, world: int, name: str = "sim") -> Run:
    store = RunStore(root, name)
    store.create({"config": RunConfig().to_dict(), "workers": world})
    ranks = [{"rank": r, "pid": 0, "host": "sim"} for r in range(len(pubs))]
    return Run(
        config=RunConfig(),
        workers=world,
        store=store,
        results=pubs,
        ranks=ranks,
        on_engines_lost=lambda message: None,
        abort=lambda: None,
        launcher_output=lambda: "",
        hang_s=1e9,  # no heartbeats here: the watchdog is not under test
    )


class Seen:
    """Wakes a waiter after each of the client's updates (an event, not a sleep)."""

    def __init__(self, run: Run):
        self.cond = threading.Condition()
        run.on_update(self)

    def __call__(self, run: Run) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, run: Run, step: int, timeout: float = 60) -> None:
        def caught_up():
            last = run.last_row
            return last is not None and last["step"] == step

        with self.cond:
            assert self.cond.wait_for(caught_up, timeout=timeout), (run.last_row, step)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def simulate(
    root: Path,
    *,
    world: int,
    rows: int,
    checkpoints: int = 6,
    burst: int = 8,
    stall_at: float | None = None,
    dashboard: bool = True,
    name: str = "sim",
) -> dict:
    """Feed ``rows`` rows at ``world`` ranks through publisher, client and dashboard; the
    measurements at ``checkpoints`` points spread geometrically over the run, and the run.

    The client catches up after every ``burst`` rows (within what a message reaches back);
    at ``stall_at`` (a fraction of the run) it stalls for 8 × RESEND messages instead."""
    pubs = [Datapub(), Datapub()]
    run = client(root, pubs, world, name)
    rank0 = Rank0(pubs[0].send, run.path, world)
    seen = Seen(run)
    dash = None
    if dashboard:
        from hpclab.views.panel.live import Dashboard

        dash = Dashboard(min_interval_s=0.5, max_wait_s=0.5)
        dash.attach(run)
    marks = sorted({int(rows * f) for f in np.geomspace(0.01, 1.0, checkpoints)} | {rows})
    points, stalled = [], None
    while rank0.rows < rows:
        stall = stall_at is not None and stalled is None and rank0.rows >= stall_at * rows
        n = 8 * Publisher.RESEND if stall else min(burst, rows - rank0.rows)
        pubs[0].client_away(stall)
        for _ in range(n):
            rank0.row()
        pubs[0].client_away(False)
        seen.wait_for(run, rank0.step)
        if stall:
            stalled = rank0.rows
        if marks and rank0.rows >= marks[0]:
            marks.pop(0)
            points.append(measure(rank0, pubs[0], run, dash))
    pubs[1].result = {"weights_digest": "same", "sdc": None}
    pubs[0].result = rank0.result()
    run.wait(timeout=120)
    if dash is not None:
        dash.wait_idle(30)
        dash.detach()
    return {"points": points, "run": run, "rank0": rank0, "stalled_at": stalled}


def measure(rank0: Rank0, pub: Datapub, run: Run, dash) -> dict:
    """The three costs now: message bytes, client bytes held (and RSS), one redraw's time."""
    held = len(pickle.dumps(run._rows.items())) + len(pickle.dumps(run._epochs.items()))
    point = {
        "rows": rank0.rows,
        "message_bytes": len(pickle.dumps(pub.latest)),
        "run_held_rows": len(run._rows),
        "client_bytes": held,
        "rss_mib": rss_mib(),
    }
    if dash is not None:
        dash.wait_idle(30)
        follow = dash._follow
        point["dash_points"] = len(follow.rows)
        point["client_bytes"] += len(pickle.dumps(follow.rows.items()))
        times = []
        for _ in range(3):  # the fastest of three: the machine's noise only ever adds time
            t0 = time.perf_counter()
            dash.update(run)  # what the dashboard's drawing thread runs for each redraw
            times.append(time.perf_counter() - t0)
        point["redraw_s"] = min(times)
        point["trace_points"] = len(dash.trace("thr/global").x)  # what the browser gets
    return point


def show(world: int, result: dict) -> None:
    print(
        f"\n{world} ranks: {result['rank0'].rows:,} rows, {result['rank0'].publisher.epoch_count:,} epochs"
    )
    cols = [
        "rows",
        "message_bytes",
        "client_bytes",
        "run_held_rows",
        "dash_points",
        "redraw_s",
        "rss_mib",
    ]
    print("  ".join(f"{c:>13}" for c in cols))
    for p in result["points"]:
        print(
            "  ".join(
                f"{p.get(c, float('nan')):>13,.3f}"
                if isinstance(p.get(c), float)
                else f"{p.get(c, '-'):>13,}"
                for c in cols
            )
        )


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="rows at --world (default: both runs)")
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    run_module.POLL_S = 0.001  # the monitor looks every millisecond: same work per look
    runs = [(args.world, args.rows)] if args.rows else [(2, 200_000), (1024, 10_000)]
    with tempfile.TemporaryDirectory() as tmp:
        for world, rows in runs:
            t0 = time.perf_counter()
            result = simulate(Path(tmp), world=world, rows=rows, checkpoints=8, name=f"w{world}")
            show(world, result)
            print(f"  ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
