"""Live telemetry whose cost stays flat over a long run (issue 31, items 1 and 2), no engines.

A simulated run — rows and epoch rows made by rank 0's real meters (hpclab.rank.meters:
WindowMeter, EpochMeter, Publisher) from generated telemetry, no training — is published the way
ipyparallel's datapub carries it (only the latest message per engine is visible) to a real
client `Run`, whose monitor thread merges the messages into its history, epoch table and run
folder. Checked: a message's pickled size does not grow with the run's length; a client that
falls behind by more than a message reaches back loses nothing by the end (rank 0's result fills
the gaps, rows and epoch rows alike); the CLI progress reads only the newest rows.
"""

import io
import math
import pickle
import threading

import numpy as np
import pytest

import hpclab.cluster.run as run_module
from hpclab.cluster.run import Run
from hpclab.core import pop
from hpclab.core.config import RunConfig
from hpclab.rank.meters import DETAIL, REDUCED, EpochMeter, Publisher, WindowMeter
from hpclab.records.store import RunStore, load_run
from hpclab.tools.cli_progress import Progress

WORLD, BATCH = 2, 64
ROWS_PER_EPOCH = 2  # rows end at publishes and at epoch ends
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

    def __init__(self, send):
        spe = ROWS_PER_EPOCH * STEPS_PER_ROW
        self.window = WindowMeter(BATCH, WORLD, spe)
        self.epochs = EpochMeter(WORLD)
        self.publisher = Publisher(send, every_s=0.5, total_steps=10**9)
        self.publisher.epochs = self.epochs.rows  # (as Trainer._meters shares the list)
        self.step, self.t = 0, 0.0
        self.rng = np.random.default_rng(0)

    def epoch(self) -> None:
        """One epoch: ROWS_PER_EPOCH windows, each ending in a row and a publish; the last also
        ends the epoch (its row closed before the publish, as in the trainer)."""
        for i in range(ROWS_PER_EPOCH):
            k = STEPS_PER_ROW
            reduced = np.zeros(len(REDUCED))
            loss, count = self.rng.uniform(0.5, 2.0), k * BATCH * WORLD
            reduced[[REDUCED.index(n) for n in ("loss_sum", "correct", "count")]] = (
                loss * k * WORLD,
                0.8 * count,
                count,
            )
            self.window.add(reduced, k)
            self.epochs.add(reduced, k, self.t)
            self.step += k
            self.t += 0.5
            detail = np.zeros((WORLD, len(DETAIL)))
            for name, value in (("samples", k * BATCH), ("steps", k), ("call_s", 0.45)):
                detail[:, DETAIL.index(name)] = value
            detail[:, DETAIL.index("host_s")] = self.rng.uniform(0.01, 0.05, WORLD)
            detail[:, DETAIL.index("wall_s")] = 0.5
            for part in pop.STEP_PARTS:
                detail[:, DETAIL.index(f"{part}_s")] = self.rng.uniform(0.01, 0.08, WORLD)
            row = self.window.row(self.step, self.t, 0.1, detail, None)
            row["eval_loss"], row["eval_accuracy"] = (float("nan"),) * 2
            self.publisher.rows.append(row)
            if i == ROWS_PER_EPOCH - 1:
                self.epochs.close(self.step, self.t, self.t, 0.1, (loss, 0.8))
            self.publisher.publish("running", self.step, self.t)

    def result(self, status: str = "finished") -> dict:
        """Rank 0's summary as Trainer._summary returns it (with every row and epoch row)."""
        return {
            "status": status,
            "error": None,
            "rank": 0,
            "world_size": WORLD,
            "steps": self.step,
            "weights_digest": "same",
            "sdc": None,
            "rows": self.publisher.rows,
            "epochs": self.epochs.rows,
        }


def _client(tmp_path, pubs) -> Run:
    store = RunStore(tmp_path, "flat")
    store.create({"config": RunConfig().to_dict(), "workers": WORLD})
    ranks = [{"rank": r, "pid": 0, "host": "sim"} for r in range(WORLD)]
    return Run(
        config=RunConfig(),
        workers=WORLD,
        store=store,
        results=pubs,
        ranks=ranks,
        on_engines_lost=lambda message: None,
        abort=lambda: None,
        launcher_output=lambda: "",
        hang_s=1e9,  # no heartbeats here: the watchdog is not under test
    )


class Seen:
    """The client's newest row step and epoch number after each of its updates (an event)."""

    def __init__(self, run: Run):
        self.cond = threading.Condition()
        run.on_update(self)

    def __call__(self, run: Run) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, run: Run, step: int, epoch: int) -> None:
        def caught_up():
            last = run.last_row
            epochs = run.epoch_rows(after=epoch - 1)
            return (
                last is not None
                and last["step"] == step
                and [e["epoch"] for e in epochs] == [epoch]
            )

        with self.cond:
            assert self.cond.wait_for(caught_up, timeout=30), (run.last_row, step, epoch)


@pytest.fixture
def fast_monitor(monkeypatch):
    """The monitor looks every millisecond instead of every 0.2 s, so a long simulated run
    fits in a test; what it does on each look is unchanged."""
    monkeypatch.setattr(run_module, "POLL_S", 0.001)


def test_a_long_runs_messages_stay_flat_and_a_slow_client_loses_nothing(tmp_path, fast_monitor):
    epochs, stall_at, stall = 10_000, 5_000, 3 * Publisher.EPOCHS_PER_MESSAGE
    keep_up = Publisher.ROWS_PER_MESSAGE // ROWS_PER_EPOCH  # epochs a message still reaches back
    pubs = [Datapub() for _ in range(WORLD)]
    rank0 = Rank0(pubs[0].send)
    run = _client(tmp_path, pubs)
    seen = Seen(run)
    sizes, live_missed = {}, None
    while len(rank0.epochs.rows) < epochs:
        done = len(rank0.epochs.rows)
        # the client keeps up (a burst within what a message reaches back), except once: it
        # stalls for `stall` epochs, more than a message reaches back, rows and epochs alike
        stalls = done >= stall_at and live_missed is None
        burst = stall if stalls else min(keep_up, epochs - done)
        pubs[0].client_away(stalls)
        for _ in range(burst):
            rank0.epoch()
            n = len(rank0.epochs.rows)
            if n in (10, 100, 1_000, 10_000):
                sizes[n] = len(pickle.dumps(pubs[0].latest))
        pubs[0].client_away(False)  # back: it sees the latest message only
        seen.wait_for(run, rank0.step, len(rank0.epochs.rows))
        if stalls:
            live_missed = (
                len(rank0.publisher.rows) - len(run.history),
                len(rank0.epochs.rows) - len(run.epochs),
            )
    pubs[1].result = {"weights_digest": "same", "sdc": None}
    pubs[0].result = rank0.result()
    run.wait(timeout=60)

    print(f"\n[telemetry] pickled message bytes after N epochs: {sizes}; live gap {live_missed}")
    # flat: 100x the run (once both windows are full) adds only the wider integers of steps
    assert sizes[10_000] <= 1.01 * sizes[100], sizes
    assert sizes[10] <= sizes[100]  # (the windows were not full yet)
    rows_missed, epochs_missed = live_missed
    assert rows_missed > 0 and epochs_missed > 0  # the stall did lose messages live...
    want_steps = [r["step"] for r in rank0.publisher.rows]
    want_epochs = list(range(1, epochs + 1))
    assert run.history["step"].tolist() == want_steps  # ...and the end filled every gap
    assert run.epochs["epoch"].tolist() == want_epochs
    record = load_run(run.path)
    assert record.history["step"].tolist() == want_steps
    assert record.epochs["epoch"].tolist() == want_epochs
    assert record.epochs["loss"].tolist() == pytest.approx([e["loss"] for e in rank0.epochs.rows])


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_the_cli_progress_shows_the_newest_row_and_each_epoch_once(
    tmp_path, fast_monitor, monkeypatch, capsys, tty
):
    """It reads run.last_row / run.epoch_rows (the newest only), never the whole history."""
    pytest.importorskip("tqdm")
    err = Tty() if tty else None
    if err is not None:
        monkeypatch.setattr("sys.stderr", err)
    pubs = [Datapub() for _ in range(WORLD)]
    rank0 = Rank0(pubs[0].send)
    run = _client(tmp_path, pubs)
    seen = Seen(run)
    progress = Progress(total_steps=10**6, enabled=True)
    progress.start()
    monkeypatch.setattr(Run, "history", property(lambda r: pytest.fail("history was built")))
    run.on_update(progress)
    for _ in range(3):
        for _ in range(4):
            rank0.epoch()
        seen.wait_for(run, rank0.step, len(rank0.epochs.rows))
        progress(run)  # (and once more after the monitor's own call: nothing twice)
        if tty:
            assert progress.bar.n == rank0.step
    pubs[1].result = {"weights_digest": "same", "sdc": None}
    pubs[0].result = rank0.result()
    run.wait(timeout=60)
    progress.close(run)
    assert run.callback_errors == 0  # (the monitor's calls of it did not build the history)
    if not tty:
        lines = [line for line in capsys.readouterr().err.splitlines() if "epoch" in line]
        assert [int(line.split()[1].rstrip(":")) for line in lines] == list(range(1, 13))
        last = rank0.epochs.rows[-1]
        assert f"step {last['step']}" in lines[-1] and not math.isnan(last["loss"])
