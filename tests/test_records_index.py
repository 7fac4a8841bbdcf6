"""A runs root's cached listing (hpclab/records/index.py): listings and a sweep's planning parse
only the run folders that changed, and a broken or unwritable index changes nothing but speed.

Parses are counted at the one function that reads a run folder's files (index._read); the
10,000-record case prints its times (benchmarks/README.md keeps the measured figures)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from fakes import write_run

from hpclab.core.config import RunConfig
from hpclab.records import index, sweep
from hpclab.records.index import list_runs


@pytest.fixture
def parses(monkeypatch):
    """How many run folders index._read parsed (a counter around the real function)."""
    count = {"n": 0}
    real = index._read

    def counting(folder, stamp):
        count["n"] += 1
        return real(folder, stamp)

    monkeypatch.setattr(index, "_read", counting)
    return count


def _copies(root, template, n: int, start: int = 0) -> None:
    """`n` run folders like `template` (config.json and summary.json), each its own seed."""
    meta = json.loads((template / "config.json").read_text())
    summary = (template / "summary.json").read_text()
    for i in range(start, start + n):
        folder = root / f"20260101-{i:06d}-copy"
        folder.mkdir()
        meta["config"]["seed"], meta["run_id"] = i, folder.name
        (folder / "config.json").write_text(json.dumps(meta))
        (folder / "summary.json").write_text(summary)


def test_a_listing_parses_only_the_run_folders_that_changed(tmp_path, parses):
    template = write_run(tmp_path / "t", RunConfig(num_samples=4000))
    root = tmp_path / "runs"
    root.mkdir()
    _copies(root, template, 300)
    first = list_runs(root)
    assert len(first) == 300 and parses["n"] == 300
    parses["n"] = 0
    again = list_runs(root)
    assert parses["n"] == 0 and again.equals(first)  # nothing changed: nothing parsed
    ended = root / "20260101-000007-copy" / "summary.json"
    ended.write_text(json.dumps({**json.loads(ended.read_text()), "status": "stopped"}))
    _copies(root, template, 1, start=300)
    shutil.rmtree(root / "20260101-000003-copy")
    listed = list_runs(root)
    assert parses["n"] == 2 and len(listed) == 300  # the rewritten one and the new one
    assert listed.set_index("run_id").loc["20260101-000007-copy", "status"] == "stopped"
    assert "20260101-000003-copy" not in set(listed["run_id"])


def test_a_broken_index_or_one_that_cannot_be_written_lists_the_same(tmp_path, parses):
    template = write_run(tmp_path / "t", RunConfig(num_samples=4000))
    root = tmp_path / "runs"
    root.mkdir()
    _copies(root, template, 20)
    (root / index.INDEX).write_text('{"version": 1, "entries": {"20260101-000001-copy": [1')
    broken = list_runs(root)
    assert len(broken) == 20 and parses["n"] == 20
    assert json.loads((root / index.INDEX).read_text())["version"] == index.VERSION  # rebuilt
    (root / index.INDEX).unlink()
    (root / index.INDEX).mkdir()  # cannot be read nor written (as on a read-only root)
    parses["n"] = 0
    assert list_runs(root).equals(broken) and parses["n"] == 20


def test_a_sweep_plans_every_point_from_one_look_at_the_records(tmp_path, parses):
    root = tmp_path / "runs"
    base = RunConfig(num_samples=4000, epochs=1)
    done = [write_run(root, base, batch_per_worker=b) for b in (16, 32)]
    grid = {"batch_per_worker": [16, 32, 64], "seed": list(range(17))}  # 51 points
    points = sweep.plan(base, root, current_workers=2, **grid)
    assert len(points) == 51 and parses["n"] == 2  # each record parsed once, not once a point
    reused = [p.finished for p in points if p.finished is not None]
    assert sorted(reused) == sorted(done)


@pytest.mark.slow
def test_ten_thousand_records_list_and_plan_a_sweep_from_the_index(tmp_path, parses):
    template = write_run(tmp_path / "t", RunConfig(num_samples=4000, epochs=1))
    root = tmp_path / "runs"
    root.mkdir()
    _copies(root, template, 10_000)
    t0 = time.perf_counter()
    list_runs(root)
    cold = time.perf_counter() - t0
    parses["n"] = 0
    t0 = time.perf_counter()
    listed = list_runs(root)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    base = RunConfig(num_samples=4000, epochs=1)
    points = sweep.plan(base, root, current_workers=2, seed=list(range(50)))
    planning = time.perf_counter() - t0
    print(
        f"\n[records] 10,000 records: list_runs {cold:.2f} s cold, {warm:.2f} s warm; a 50-point "
        f"sweep planned in {planning:.2f} s"
    )
    assert len(listed) == 10_000 and parses["n"] == 0  # warm: no run folder parsed
    assert sum(p.finished is not None for p in points) == 50  # seeds 0..49 are recorded
