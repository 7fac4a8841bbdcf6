"""Live telemetry and views whose cost stays flat over a long run (issue 31, items 1 and 2).

The parts in milliseconds (fast tier): the bounded history (hpclab.core.thinning), the client's
in-order intake with its reads of rank 0's log (hpclab.cluster.intake), rank 0's publisher
(hpclab.rank.publisher). Then the acceptance simulation (benchmarks/long_run.py, shorter, `slow`):
rows made by rank 0's real meters, published by the real publisher the way datapub carries
them, taken by a real client `Run` on its monitor thread and drawn by a real live `Dashboard`,
at 2 and at 1,024 ranks. The memory bounds are scaled down here (the same code; the benchmark
runs the real bounds) so a few thousand rows go well past them.
"""

import io
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

import hpclab.cluster.run as run_module
from hpclab.cluster.intake import Intake
from hpclab.core.catalog import RANK_LISTS_MAX, TELEMETRY_FILES
from hpclab.core.thinning import Thinned
from hpclab.rank.publisher import Publisher
from hpclab.records import rank_lists
from hpclab.records.store import load_run
from hpclab.tools.cli_progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import long_run as sim  # noqa: E402


# -- the parts ----------------------------------------------------------------------------------
def test_thinned_keeps_the_newest_exact_and_older_ones_evenly_within_its_bound():
    held = Thinned(recent=10, older=8)
    for i in range(10_000):
        held.append(i)
        assert len(held) <= 18
    items = held.items()
    assert items[-10:] == list(range(9_990, 10_000)) and held.count == 10_000
    older = items[:-10]
    assert older == sorted(older) and older[0] == 0  # the start of the run is kept
    gaps = {b - a for a, b in zip(older, older[1:])}
    assert gaps == {held.stride}  # evenly spread
    assert held.since(9_995) == list(range(9_995, 10_000)) and not held.complete
    assert held.newest(lambda x: x > 9_997) == [9_998, 9_999]


def _log(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_intake_takes_rows_in_order_from_messages_and_from_the_log_where_they_do_not_reach(
    tmp_path,
):
    rows = [{"step": i} for i in range(1, 31)]
    log = tmp_path / "rows.jsonl"
    intake = Intake(log, "step")
    assert intake.take(0, rows[:3]) == rows[:3]
    assert intake.take(1, rows[1:5]) == rows[3:5]  # the resend is not taken twice
    # a gap (positions 5..19 missed) before the log shows them: nothing out of order
    assert intake.take(20, rows[20:22]) == [] and intake.count == 5
    _log(log, rows[:25])
    assert intake.take(20, rows[20:22]) == rows[5:25]  # (the log reached past the message)
    assert intake.from_log == 20
    _log(log, rows[25:28])
    log.open("a").write('{"step": 2')  # a torn last line: read whole, next time
    assert intake.take(28, rows[28:30]) == rows[25:30]
    assert intake.finish() == [] and intake.count == 30


def test_publisher_sends_only_what_is_new_with_a_bounded_resend_and_logs_every_row(tmp_path):
    sent = []
    pub = Publisher(sent.append, every_s=0.5, total_steps=100, folder=tmp_path)
    pub.publish("running", 0)  # a start message leaves the cadence alone
    assert pub.due(0.0)
    for i in range(1, 101):
        pub.add_row({"step": i})
        if i % 10 == 0:
            pub.add_epoch({"epoch": i // 10, "step": i})
        pub.publish("running", i, now=float(i))
    assert not pub.due(100.4) and pub.due(100.5)
    last = sent[-1]["hpclab"]
    assert last["seq"] == 101 and (last["rows_total"], last["epochs_total"]) == (100, 10)
    # the rows of the last RESEND messages, no more: a message's size does not grow
    assert [r["step"] for r in last["rows"]] == list(range(101 - Publisher.RESEND, 101))
    assert last["rows_at"] == 100 - Publisher.RESEND
    assert len(pub.rows) == Publisher.ROWS_PER_MESSAGE  # rank 0's memory: a ring
    pub.close()
    logged = [json.loads(line) for line in (tmp_path / TELEMETRY_FILES["rows"]).open()]
    assert [r["step"] for r in logged] == list(range(1, 101))
    epochs = (tmp_path / TELEMETRY_FILES["epochs"]).read_text().splitlines()
    assert [json.loads(e)["epoch"] for e in epochs] == list(range(1, 11))


@pytest.mark.parametrize("send,every", [(None, 0.5), (print, 0.0)])
def test_publisher_off_sends_nothing_and_is_never_due(send, every):
    publisher = Publisher(send, every_s=every, total_steps=10)
    publisher.publish("running", 1, now=1.0)
    assert not publisher.enabled and not publisher.due(1e9) and publisher.seq == 0


def test_above_rank_lists_max_a_row_carries_stats_and_the_lists_go_to_the_run_folder(tmp_path):
    world = RANK_LISTS_MAX + 1
    pub = Publisher(None, 0.5, 10, folder=tmp_path, world=world)
    rates = [100.0 + r for r in range(world)]
    rates[5] = 3.0
    row = pub.add_row({"step": 7, "rank_samples_per_sec": rates, "rank_compute_ms": rates})
    pub.close()
    assert "rank_samples_per_sec" not in row and row["slowest_rank"] == 5
    assert (row["rank_compute_ms_min"], row["rank_compute_ms_max"]) == (3.0, 100.0 + world - 1)
    assert row["rank_samples_per_sec_median"] == statistics.median(rates)
    lists = rank_lists.read(tmp_path)
    assert lists.steps.tolist() == [7.0]
    assert lists.column("rank_samples_per_sec")[0].tolist() == rates


# -- the acceptance simulation ------------------------------------------------------------------
@pytest.fixture
def small_bounds(monkeypatch):
    """The client's and the dashboard's bounds, scaled down (the same code)."""
    import hpclab.views.panel.live as live

    monkeypatch.setattr(run_module, "KEEP_RECENT", 100)
    monkeypatch.setattr(run_module, "KEEP_OLDER", 100)
    monkeypatch.setattr(live, "LIVE_RECENT", 50)
    monkeypatch.setattr(live, "LIVE_OLDER", 50)
    monkeypatch.setattr(run_module, "POLL_S", 0.001)  # the monitor's look, every millisecond


def _flat(points: list[dict]) -> None:
    """Message size, client memory and redraw time once the bounds are full vs at the end."""
    full = next(p for p in points if p["run_held_rows"] >= 150 and p["dash_points"] >= 75)
    end = points[-1]
    assert end["rows"] >= 5 * full["rows"], (full["rows"], end["rows"])
    assert end["message_bytes"] <= 1.01 * full["message_bytes"], points
    assert end["run_held_rows"] <= 200 and end["dash_points"] <= 100
    # (the thinned part of a bounded history holds from half its bound to all of it)
    assert end["client_bytes"] <= 1.4 * full["client_bytes"], points
    assert max(p["trace_points"] for p in points) <= 100  # what makes a redraw's cost flat
    # (timed: the fastest of three; loose, as other processes share the machine)
    assert end["redraw_s"] <= 3.0 * full["redraw_s"] + 0.03, points


def _simulate(tmp_path, world: int, rows: int, stall_at: float | None = None) -> dict:
    return sim.simulate(tmp_path, world=world, rows=rows, checkpoints=6, stall_at=stall_at)


@pytest.mark.slow
def test_a_long_run_at_2_ranks_stays_flat_and_a_stalled_client_loses_nothing(
    tmp_path, small_bounds
):
    result = _simulate(tmp_path, world=2, rows=1500, stall_at=0.5)
    run, rank0, measured = result["run"], result["rank0"], result["points"]
    print(f"\n[telemetry] 2 ranks: {measured}")
    _flat(measured)
    # the stall lost messages live; the rows came from rank 0's log, in order, all of them
    assert run._row_in.from_log > 0 and run._epoch_in.from_log > 0
    want_steps = [sim.STEPS_PER_ROW * (i + 1) for i in range(rank0.rows)]
    assert run.history["step"].tolist() == want_steps  # (from the run folder: rows thinned)
    assert run.epochs["epoch"].tolist() == list(range(1, rank0.publisher.epoch_count + 1))
    record = load_run(run.path)
    assert record.history["step"].tolist() == want_steps


@pytest.mark.slow
def test_a_long_run_at_1024_ranks_stays_flat_with_per_rank_stats(tmp_path, small_bounds):
    result = _simulate(tmp_path, world=1024, rows=1000)
    run, measured = result["run"], result["points"]
    print(f"\n[telemetry] 1024 ranks: {measured}")
    _flat(measured)
    last = run.last_row
    assert not any(isinstance(v, list) for v in last.values())  # no O(world) in a message
    assert last["slowest_rank"] in range(1024)
    lists = rank_lists.read(run.path)
    assert lists.values.shape[0] == result["rank0"].rows and lists.values.shape[2] == 1024
    assert lists.column("rank_samples_per_sec")[-1].min() == last["rank_samples_per_sec_min"]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_the_cli_progress_shows_the_newest_row_and_each_epoch_once(
    tmp_path, monkeypatch, capsys, tty
):
    """It reads run.last_row / run.epoch_rows (the newest only), never the whole history."""
    pytest.importorskip("tqdm")
    monkeypatch.setattr(run_module, "POLL_S", 0.001)
    err = Tty() if tty else None
    if err is not None:
        monkeypatch.setattr("sys.stderr", err)
    pubs = [sim.Datapub(), sim.Datapub()]
    run = sim.client(tmp_path, pubs, 2)
    rank0 = sim.Rank0(pubs[0].send, run.path, 2)
    seen = sim.Seen(run)
    progress = Progress(total_steps=10**6, enabled=True)
    progress.start()
    monkeypatch.setattr(run_module.Run, "history", property(lambda r: pytest.fail("history")))
    run.on_update(progress)
    for _ in range(3):
        for _ in range(8):
            rank0.row()
        seen.wait_for(run, rank0.step)
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


def test_an_epoch_without_a_full_validation_says_so_instead_of_printing_nan(capsys):
    """Above 16 ranks short epochs skip the full validation (RunPlan.full_eval_due): their rows
    carry NaN, and the CLI's epoch line says the epoch was not evaluated."""

    class Rows:  # the one method of hpclab.cluster.run.Run the line printer reads
        def epoch_rows(self, after):
            rows = [
                {
                    "epoch": 1,
                    "step": 8,
                    "loss": 2.1,
                    "val_accuracy": float("nan"),
                    "samples_per_sec": 9e4,
                },
                {
                    "epoch": 2,
                    "step": 16,
                    "loss": 1.9,
                    "val_accuracy": 0.4125,
                    "samples_per_sec": 9e4,
                },
            ]
            return [r for r in rows if r["epoch"] > after]

    Progress(total_steps=16, enabled=True)(Rows())
    lines = capsys.readouterr().err.splitlines()
    assert "val_acc not evaluated this epoch" in lines[0] and "nan" not in lines[0]
    assert "val_acc 0.412" in lines[1]
