"""Dataset layouts and what an epoch of one rank costs (hpclab/rank/probes/stores.py): the counts of
the I/O lesson, pinned (issue 14: a small-files store opens one file per sample of a rank and
epoch, a packed store a constant), and checked against the kernel's own read counter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpclab.rank.probes import stores


def dataset(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 40)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def epoch(folder, layout, n, rank, world, e=0, shuffle="local", **kw):
    idx, shard = stores.epoch_indices(n, rank, world, e, shuffle)
    return idx, stores.read_epoch(
        folder, layout, idx, rank=rank, epoch=e, shuffle=shuffle, shard=shard, **kw
    )


@pytest.mark.parametrize("n", [600, 2400])
def test_small_files_open_one_file_per_sample_of_the_rank_packed_a_constant(tmp_path, n):
    x, y = dataset(n)
    files = stores.write("files", x, y, tmp_path)
    packed = stores.write("packed", x, y, tmp_path)
    for rank in (0, 1):
        for e in (0, 1):
            idx, (xs, ys, io) = epoch(files, "files", n, rank, 2, e)
            assert (io.open, io.stat, io.read) == (n // 2, n // 2, n // 2)
            np.testing.assert_array_equal(xs, x[idx])
            np.testing.assert_array_equal(ys, y[idx])
            idx, (xp, yp, iop) = epoch(packed, "packed", n, rank, 2, e)
            assert (iop.open, iop.stat) == (1, 1)  # the same for 600 and 2400 samples
            np.testing.assert_array_equal(xp, x[idx])
            np.testing.assert_array_equal(yp, y[idx])
            shard_bytes = (n // 2) * (40 * 4 + 4)
            assert iop.read <= shard_bytes // stores.CHUNK_BYTES + 2  # whole chunks, in order


def test_the_kernel_counts_at_least_the_reads_we_count(tmp_path):
    io_file = "/proc/self/io"
    try:
        open(io_file).close()
    except OSError:
        pytest.skip("no /proc/self/io on this kernel")

    def syscr() -> int:
        with open(io_file) as f:
            return int(next(line for line in f if line.startswith("syscr:")).split()[1])

    x, y = dataset(800)
    folder = stores.write("files", x, y, tmp_path)
    before = syscr()
    _, (_, _, io) = epoch(folder, "files", 800, 0, 1)
    assert syscr() - before >= io.read == 800


def test_a_global_shuffle_reaches_outside_the_shard_and_reads_more_of_a_packed_file(tmp_path):
    n = 20_000  # 3.3 MB: 13 chunks of 256 KiB
    x, y = dataset(n)
    packed = stores.write("packed", x, y, tmp_path)
    _, (_, _, local) = epoch(packed, "packed", n, 1, 2, shuffle="local")
    idx, (xg, _, global_) = epoch(packed, "packed", n, 1, 2, shuffle="global")
    np.testing.assert_array_equal(xg, x[idx])
    assert local.remote == 0 and 0.45 < global_.remote / (n // 2) < 0.55
    assert global_.read > 1.7 * local.read and global_.bytes > 1.7 * local.bytes
    # every rank gets a disjoint part of the same permutation, so an epoch still sees each once
    parts = [stores.epoch_indices(n, r, 2, 3, "global")[0] for r in (0, 1)]
    assert len(np.unique(np.concatenate(parts))) == n


def test_memory_costs_nothing_and_latency_is_simulated_from_the_counts(tmp_path):
    x, y = dataset(300)
    _, (xm, _, io) = epoch(None, "memory", 300, 0, 1, arrays=(x, y), latency_ms=5.0)
    assert (io.open, io.stat, io.read, io.simulated_s) == (0, 0, 0, 0.0) and len(xm) == 300
    folder = stores.write("files", x, y, tmp_path)
    _, (_, _, io) = epoch(folder, "files", 300, 0, 1, latency_ms=2.0)
    assert io.simulated_s == pytest.approx((300 + 300) * 0.002)
    assert io.real_s < io.simulated_s + 60  # measured, never slept
    assert set(io.row()) >= {"rank", "epoch", "open", "stat", "read", "real_s", "simulated_s"}


def test_a_store_is_written_once_and_staging_copies_it_with_its_cost_counted(tmp_path):
    x, y = dataset(1500)
    folder = stores.write("files", x, y, tmp_path / "shared")
    meta = folder / "meta.json"
    stamp = meta.stat().st_mtime_ns
    assert stores.write("files", x, y, tmp_path / "shared") == folder
    assert meta.stat().st_mtime_ns == stamp  # reused, not rewritten
    assert len(list(folder.rglob("*.bin"))) == 1500 and len(list(folder.iterdir())) == 3
    local, cost = stores.stage(folder, "files", tmp_path / "node-local", latency_ms=1.0)
    assert (local / "meta.json").exists() and cost.open == 1501  # every file once, meta too
    _, (xs, _, io) = epoch(local, "files", 1500, 0, 1)
    assert io.open == 1500 and len(xs) == 1500


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: stores.write("tfrecords", *dataset(10), "/tmp"), "layout"),
        (lambda: stores.epoch_indices(10, 0, 1, 0, "perfect"), "shuffle"),
    ],
)
def test_an_unknown_layout_or_shuffle_is_named(call, field):
    with pytest.raises(ValueError, match=f"{field} must be one of .*; you passed"):
        call()


@pytest.mark.mpi
def test_on_real_ranks_files_open_one_per_sample_packed_once_staging_leaves_nothing(lab):
    from hpclab.core.catalog import GENERATED_VALIDATION_FRACTION
    from hpclab.studies import io_probe

    n = 2000
    per_rank = (n - round(n * GENERATED_VALIDATION_FRACTION)) // 2
    files = io_probe.probe(lab, "files", epochs=2, num_samples=n)
    assert list(files["rank"]) == [0, 1, 0, 1] and list(files["epoch"]) == [0, 0, 1, 1]
    assert list(files["open"]) == [per_rank] * 4 and list(files["remote"]) == [0] * 4
    packed = io_probe.probe(lab, "packed", epochs=2, num_samples=n, shuffle="global")
    assert list(packed["open"]) == [1] * 4
    assert all(0.4 * per_rank < r < 0.6 * per_rank for r in packed["remote"])
    before = set(Path("/dev/shm").glob("hpclab-*"))
    staged = io_probe.probe(lab, "files", epochs=1, num_samples=n, stage=True, latency_ms=1.0)
    copy, first = staged[staged.epoch == -1], staged[staged.epoch == 0]
    assert list(copy["open"]) == [2 * per_rank + 1] * 2  # every file of the store, once a rank
    assert list(copy["simulated_s"]) == pytest.approx([2 * (2 * per_rank + 1) * 0.001] * 2)
    assert list(first["open"]) == [per_rank] * 2 and list(first["simulated_s"]) == [0.0, 0.0]
    assert set(Path("/dev/shm").glob("hpclab-*")) <= before  # node-local copies removed


def test_probe_arguments_are_checked_before_any_rank_reads():
    from hpclab.core.errors import ConfigError
    from hpclab.studies import io_probe

    for kwargs, field in [
        ({"layout": "hdf5"}, "layout"),
        ({"shuffle": "none"}, "shuffle"),
        ({"epochs": 0}, "epochs"),
        ({"num_samples": 10**7}, "num_samples"),
        ({"latency_ms": -1}, "latency_ms"),
    ]:
        with pytest.raises(ConfigError, match=f"{field} must be"):
            io_probe.probe(None, **kwargs)
