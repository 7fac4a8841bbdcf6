"""hpclab.records.store and hpclab.records.jsonio: the run store on disk (fast: no TF, no MPI, no engines).

Run records are private by default (files 0600 in 0700 folders, whatever the umask), group-
readable with HPCLAB_SHARE_RUNS=group; a half-written or foreign file is skipped by listings
with one warning and named by a RecordError when read directly.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat

import numpy as np
import pandas as pd
import pytest

from hpclab.core.config import RunConfig
from hpclab.records import jsonio
from hpclab.records.index import find_finished, list_runs
from hpclab.records.store import (
    STOP_FILE,
    RunRecord,
    RunStore,
    load_run,
    new_run_id,
)

CFG = RunConfig(num_samples=4000, epochs=1)


def _store(root, run_id=None, cfg=CFG, workers=2, **meta):
    store = RunStore(root, run_id=run_id)
    store.create({"config": cfg.to_dict(), "workers": workers, **meta})
    return store


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


# -- one run's folder ----------------------------------------------------------------------------


def test_run_ids_are_timestamped_and_distinct():
    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", i) for i in ids)


def test_create_write_and_load_round_trip(tmp_path):
    store = _store(tmp_path, derived={"global_batch": 128})
    assert store.path == tmp_path / store.run_id
    rec = load_run(store.path)
    assert isinstance(rec, RunRecord)
    assert rec.run_id == store.run_id and rec.meta["run_id"] == store.run_id
    assert rec.config == CFG.to_dict() and rec.workers == 2
    assert rec.meta["derived"] == {"global_batch": 128} and "created" in rec.meta
    assert rec.summary == {} and rec.status == "running"
    assert rec.history.empty and rec.epochs.empty
    assert rec.label == CFG.label(2)

    store.append_history([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}])
    store.append_history([{"step": 3, "loss": float("nan")}])  # NaN is not JSON: stored as null
    store.append_epochs([{"epoch": 1, "val_accuracy": 0.5}])
    store.write_summary({"status": "finished", "val_accuracy": 0.5, "noise_scale": math.nan})
    rec = load_run(store.path)
    assert rec.status == "finished" and rec.summary["noise_scale"] is None
    assert rec.history["step"].tolist() == [1, 2, 3]
    assert rec.history["loss"].iloc[:2].tolist() == [2.0, 1.5]
    assert pd.isna(rec.history["loss"].iloc[2])
    assert rec.epochs.to_dict("records") == [{"epoch": 1, "val_accuracy": 0.5}]
    assert _files(store.path) == ["config.json", "epochs.jsonl", "metrics.jsonl", "summary.json"]


def test_a_run_folder_is_never_reused(tmp_path):
    store = _store(tmp_path, run_id="same")
    with pytest.raises(FileExistsError):
        _store(tmp_path, run_id="same")
    assert load_run(store.path).run_id == "same"


def test_load_run_names_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path))):
        load_run(tmp_path)


def test_stop_request_is_a_file(tmp_path):
    store = _store(tmp_path)
    assert store.stop_file == store.path / STOP_FILE and not store.stop_file.exists()
    store.request_stop()
    assert store.stop_file.exists()


def test_label_falls_back_when_the_config_is_not_valid(tmp_path):
    store = _store(tmp_path, run_id="odd")
    rec = load_run(store.path)
    rec.meta["config"] = {"batch_per_worker": -1}
    assert rec.label == "odd ×2"


def test_default_root_is_hpclab_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCLAB_RUNS", str(tmp_path / "elsewhere"))
    assert RunStore().root == (tmp_path / "elsewhere").resolve()


# -- atomic writes -------------------------------------------------------------------------------


class _DiskFullHalfway:
    """Wraps the temp file: writes the first half of the text, then fails like a full disk."""

    def __init__(self, f):
        self._f = f

    def write(self, text):
        self._f.write(text[: len(text) // 2])
        self._f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def test_writer_failing_midway_leaves_the_previous_summary_and_no_partial_file(
    tmp_path, monkeypatch
):
    store = _store(tmp_path)
    store.write_summary({"status": "running", "steps": 10})
    before = (store.path / "summary.json").read_bytes()
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: _DiskFullHalfway(real_fdopen(*a, **k)))
    with pytest.raises(OSError, match="No space left"):
        store.write_summary({"status": "finished", "steps": 20, "pad": "x" * 1000})
    monkeypatch.undo()
    assert (store.path / "summary.json").read_bytes() == before
    assert _files(store.path) == ["config.json", "summary.json"]  # no temp file left behind
    assert load_run(store.path).summary == {"status": "running", "steps": 10}


def test_first_write_failing_midway_leaves_no_file_at_all(tmp_path, monkeypatch):
    store = _store(tmp_path)
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: _DiskFullHalfway(real_fdopen(*a, **k)))
    with pytest.raises(OSError):
        store.write_summary({"status": "finished"})
    monkeypatch.undo()
    assert _files(store.path) == ["config.json"]
    assert load_run(store.path).status == "running"


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_failure_at_fsync_or_rename_cleans_up_the_temp_file(tmp_path, monkeypatch, failing):
    target = tmp_path / "doc.json"
    jsonio.write_json_atomic(target, {"v": 1})

    def boom(*args, **kwargs):
        raise OSError(errno.EIO, f"{failing} failed")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match=f"{failing} failed"):
        jsonio.write_json_atomic(target, {"v": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"v": 1}
    assert _files(tmp_path) == ["doc.json"]


def test_unserialisable_data_fails_before_touching_the_file(tmp_path):
    target = tmp_path / "doc.json"
    jsonio.write_json_atomic(target, {"v": 1})
    with pytest.raises(TypeError):
        jsonio.write_json_atomic(target, {"v": object()})
    assert json.loads(target.read_text()) == {"v": 1} and _files(tmp_path) == ["doc.json"]


def test_strict_json_cleaning():
    value = {1: np.float32(0.5), "a": np.arange(3), "n": [math.inf, -math.inf, math.nan], "t": (1,)}
    assert jsonio.clean(value) == {"1": 0.5, "a": [0, 1, 2], "n": [None, None, None], "t": [1]}
    text = jsonio.dumps({"b": math.nan, "a": 1}, sort_keys=True)
    assert text == '{"a": 1, "b": null}'


def test_reading_missing_files_gives_empty_values(tmp_path):
    assert jsonio.read_json(tmp_path / "none.json") == {}
    assert jsonio.read_jsonl(tmp_path / "none.jsonl") == []
    jsonio.append_jsonl(tmp_path / "empty.jsonl", [])
    assert not (tmp_path / "empty.jsonl").exists()  # nothing to append, no file made


# -- file modes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("share, files, folder", [(None, 0o600, 0o700), ("group", 0o640, 0o750)])
def test_run_files_are_private_unless_shared_with_the_group(
    tmp_path, umask022, monkeypatch, share, files, folder
):
    if share:
        monkeypatch.setenv("HPCLAB_SHARE_RUNS", share)
    else:
        monkeypatch.delenv("HPCLAB_SHARE_RUNS", raising=False)
    store = _store(tmp_path)
    store.append_history([{"step": 1}])
    store.append_epochs([{"epoch": 1}])
    store.write_summary({"status": "finished"})
    store.request_stop()

    def mode(name):
        return stat.S_IMODE((store.path / name).stat().st_mode)

    assert stat.S_IMODE(store.path.stat().st_mode) == folder  # umask 022 would give 0755
    for name in ("config.json", "summary.json", "metrics.jsonl", "epochs.jsonl", STOP_FILE):
        assert mode(name) == files, name
    jsonio.write_json_atomic(tmp_path / "shared.json", {}, mode=0o644)  # an explicit mode wins
    assert stat.S_IMODE((tmp_path / "shared.json").stat().st_mode) == 0o644


# -- torn and half-written files -------------------------------------------------------------------


def test_a_torn_last_history_line_is_skipped(tmp_path):
    store = _store(tmp_path)
    store.append_history([{"step": 1}, {"step": 2}])
    with open(store.path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 3, "lo')  # the client died mid-append
    assert load_run(store.path).history["step"].tolist() == [1, 2]


def test_a_half_written_summary_is_skipped_with_a_warning_and_named_when_read(tmp_path, caplog):
    """One corrupt summary.json no longer stops list_runs or find_finished (`hpclab runs`,
    `report`, sweep resume): that run is skipped with one warning naming the file."""
    from hpclab.core.errors import RecordError

    bad = _store(tmp_path, run_id="a-bad")
    (bad.path / "summary.json").write_text('{"status": "fini', encoding="utf-8")
    good = _store(tmp_path, run_id="b-good")
    good.write_summary({"status": "finished"})
    with pytest.raises(RecordError, match=re.escape(str(bad.path / "summary.json"))):
        load_run(bad.path)
    assert list_runs(tmp_path)["run_id"].tolist() == ["b-good"]
    # the corrupt folder comes first in name order and matches: it is read past, not a result
    assert find_finished(tmp_path, CFG.to_dict(), 2) == good.path
    assert find_finished(tmp_path, CFG.to_dict(), 4) is None
    warned = [r.getMessage() for r in caplog.records if r.name == "hpclab.records.store"]
    assert len(warned) == 3 and all(str(bad.path / "summary.json") in w for w in warned)  # per call
    assert load_run(good.path).status == "finished"


# -- many runs -----------------------------------------------------------------------------------


def _set_created(store, created):
    meta = jsonio.read_json(store.path / "config.json")
    jsonio.write_json_atomic(store.path / "config.json", {**meta, "created": created})


def test_list_runs_newest_first_with_status(tmp_path):
    assert list_runs(tmp_path).empty
    old = _store(tmp_path, run_id="r1", derived={"global_batch": 128})
    new = _store(tmp_path, run_id="r2", cfg=CFG.replace(lr_scaling="sqrt"), workers=1)
    _set_created(old, "2024-01-01T10:00:00")
    _set_created(new, "2024-01-02T10:00:00")
    old.write_summary({"status": "finished", "val_accuracy": 0.9, "samples_per_sec": 1000.0})
    (tmp_path / "not-a-run").mkdir()  # folders without config.json are ignored
    df = list_runs(tmp_path)
    assert df["run_id"].tolist() == ["r2", "r1"]
    assert df["status"].tolist() == ["running?", "finished"]
    assert df["lr_scaling"].tolist() == ["sqrt", "linear"]
    assert df["workers"].tolist() == [1, 2]
    row = df.iloc[1]
    assert row["global_batch"] == 128 and row["val_accuracy"] == 0.9
    assert row["samples_per_sec"] == 1000.0 and row["path"] == str(old.path)


def test_find_finished_needs_same_config_same_workers_and_finished(tmp_path):
    cfg = CFG.to_dict()
    assert find_finished(tmp_path, cfg, 2) is None
    running = _store(tmp_path, run_id="1-running")
    stopped = _store(tmp_path, run_id="2-stopped")
    stopped.write_summary({"status": "stopped"})
    failed = _store(tmp_path, run_id="2-failed")
    failed.write_summary({"status": "failed"})
    other_workers = _store(tmp_path, run_id="3-workers", workers=4)
    other_workers.write_summary({"status": "finished"})
    other_cfg = _store(tmp_path, run_id="4-config", cfg=CFG.replace(seed=1))
    other_cfg.write_summary({"status": "finished"})
    assert find_finished(tmp_path, cfg, 2) is None
    assert running.path.exists()
    done = _store(tmp_path, run_id="5-done")
    done.write_summary({"status": "finished"})
    assert find_finished(tmp_path, cfg, 2) == done.path
    assert find_finished(tmp_path, cfg, 4) == other_workers.path
    # diverged and collapsed are results of the (seeded) config, reused like finished ones
    for status in ("diverged", "collapsed"):
        other_workers.write_summary({"status": status})
        assert find_finished(tmp_path, cfg, 4) == other_workers.path


def test_a_run_whose_client_is_gone_reads_abandoned(tmp_path):
    import platform
    import subprocess
    import sys

    from hpclab.records.index import list_runs
    from hpclab.records.store import unfinished_status

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process of this host that has exited (its pid is free)
    me = {"pid": os.getpid(), "host": platform.node()}
    store = RunStore(tmp_path)
    store.create({"config": CFG.to_dict(), "workers": 2, "client": dict(me, pid=gone.pid)})
    assert list_runs(tmp_path)["status"].tolist() == ["abandoned"]
    assert load_run(store.path).status == "abandoned"
    created = load_run(store.path).meta["created"]
    assert unfinished_status({"client": me, "created": created}) == "running?"  # alive
    assert unfinished_status({"client": me, "created": created}, alive="running") == "running"
    elsewhere = {"client": dict(me, pid=gone.pid, host="another-node"), "created": created}
    assert unfinished_status(elsewhere) == "running?"  # not ours to judge
    assert unfinished_status({"created": created}) == "running?"  # older records: no client
    # a pid reused by a process that started after the run was created is not its client
    assert unfinished_status({"client": me, "created": "2000-01-01T00:00:00"}) == "abandoned"


# -- records of the wrong shape --------------------------------------------------------------------


def _bad_records(root):
    """A folder of runs as a shared runs folder may hold them: one good, one whose history has a
    line of bytes that are not UTF-8, one whose files are JSON of the wrong types, one whose
    summary is a list."""
    good = _store(root, run_id="a-good")
    good.append_history([{"step": 1, "loss": 2.0}])
    good.write_summary({"status": "finished", "val_accuracy": 0.9})
    bytes_ = _store(root, run_id="b-bytes")
    bytes_.append_history([{"step": 1}])
    with open(bytes_.path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 2, "note": "\xff\xfe"}\n')
    bytes_.append_history([{"step": 3}])
    bytes_.write_summary({"status": "finished"})
    types = root / "c-types"
    types.mkdir()
    jsonio.write_json_atomic(
        types / "config.json",
        {"config": "oops", "workers": "two", "derived": [1, 2], "created": 5, "client": 3},
    )
    jsonio.write_json_atomic(types / "summary.json", {"status": 7, "val_accuracy": "high"})
    listed = _store(root, run_id="d-list")
    (listed.path / "summary.json").write_text("[1, 2]", encoding="utf-8")
    return good, bytes_


def test_bad_bytes_in_a_history_line_skip_that_line_only(tmp_path, caplog):
    _, bytes_ = _bad_records(tmp_path)
    assert load_run(bytes_.path).history["step"].tolist() == [1, 3]
    assert any("metrics.jsonl" in r.getMessage() for r in caplog.records)


def test_records_of_the_wrong_shape_never_crash_a_listing(tmp_path, caplog):
    """`hpclab runs`, `report` and sweep resume read past them with one line naming the file."""
    good, _ = _bad_records(tmp_path)
    table = list_runs(tmp_path)
    assert table["run_id"].tolist()[-1] == "a-good" and "c-types" not in table["run_id"].tolist()
    assert "d-list" not in table["run_id"].tolist()
    assert find_finished(tmp_path, CFG.to_dict(), 2) == good.path
    named = " ".join(r.getMessage() for r in caplog.records)
    assert str(tmp_path / "c-types" / "config.json") in named
    assert str(tmp_path / "d-list" / "summary.json") in named


def test_the_cli_lists_and_reports_a_folder_of_bad_records(tmp_path, capsys):
    from hpclab.tools import cli

    _bad_records(tmp_path)
    assert cli.main(["runs", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "a-good" in out.out and "Traceback" not in out.err
    report = tmp_path / "report.html"
    assert cli.main(["report", str(tmp_path), "-o", str(report)]) == 0
    assert report.is_file() and "Traceback" not in capsys.readouterr().err
