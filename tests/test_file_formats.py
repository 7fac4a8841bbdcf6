"""Plain .npy shards (a NAME.x.npy / NAME.y.npy pair per shard, read through memory maps) and
packing a dataset's shards into one file on node-local storage: hpclab.core.filedata's checks
and hpclab.rank.stream's readers, without MPI."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hpclab.core.errors import ConfigError
from hpclab.core.filedata import check_files, describe

BYO = Path(__file__).resolve().parents[1] / "examples" / "byo"
sys.path.insert(0, str(BYO))
import make_dataset  # noqa: E402  (examples/byo: the generator a researcher runs)


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    """6 training shards of 40 records (64 floats): by file on 2 and 3 ranks, by record on 4."""
    return make_dataset.make(tmp_path_factory.mktemp("npy") / "sig", fmt="npy", files=6, records=40)


def _edit(folder: Path, **changes) -> None:
    desc = json.loads((folder / "dataset.json").read_text())
    desc.update(changes)
    (folder / "dataset.json").write_text(json.dumps(desc))


def test_npy_pairs_are_checked_naming_the_file_and_what_was_expected(tmp_path):
    folder = make_dataset.make(tmp_path / "sig", fmt="npy", files=2, records=8)
    # a label file missing: the description names the pair it expected
    (folder / "train-00001.y.npy").rename(tmp_path / "aside.npy")
    with pytest.raises(
        ConfigError,
        match=r"field 'train.file' must be a shard name NAME with NAME.x.npy and NAME.y.npy",
    ):
        describe(folder)
    (tmp_path / "aside.npy").rename(folder / "train-00001.y.npy")
    check_files(folder)
    assert describe(folder)["train_records"] == 16
    # inputs of another shape, dtype or count: the file, what it holds, what was expected
    np.save(folder / "train-00001.x.npy", np.zeros((8, 32), np.float32))
    with pytest.raises(
        ConfigError,
        match=r"train file 'train-00001' is not a npy file as dataset.json says: x is "
        r"\(\(8, 32\), 'float32'\), the description says \(\(8, 64\), 'float32'\)",
    ):
        check_files(folder)
    np.save(folder / "train-00001.x.npy", np.zeros((8, 64), np.float32))
    np.save(folder / "train-00001.y.npy", np.zeros(8, np.float32))
    with pytest.raises(ConfigError, match=r"y is \(\(8,\), 'float32'\), the description says"):
        check_files(folder)
    # not a .npy at all, or in Fortran order (a record must be one run of bytes)
    (folder / "train-00001.y.npy").write_bytes(b"PK\x03\x04 not numpy")
    with pytest.raises(ConfigError, match=r"train-00001.y.npy is not a .npy file"):
        check_files(folder)
    np.save(folder / "train-00001.y.npy", np.zeros(8, np.int64))
    np.save(folder / "train-00001.x.npy", np.asfortranarray(np.zeros((8, 64), np.float32)))
    with pytest.raises(ConfigError, match=r"train-00001.x.npy is stored in Fortran order"):
        check_files(folder)


def test_npy_shards_are_read_as_written_through_memory_maps(npy):
    from hpclab.rank import stream

    d = describe(npy)
    x, y = stream.read_arrays(d, "train")
    rng = np.random.default_rng(0)  # make()'s draws, in its order
    want = [make_dataset.signals(40, 64, rng) for _ in range(6)]
    assert np.array_equal(x, np.concatenate([w[0] for w in want]))
    assert np.array_equal(y, np.concatenate([w[1] for w in want])) and y.dtype == np.int32
    # the reader maps the files and copies out only the rows asked for
    rows = stream._NpyRows(d)
    shard = d["train_files"][2].encode()
    xs, ys = rows(np.array([shard, shard], dtype=object), np.array([7, 3]))
    assert np.array_equal(xs, want[2][0][[7, 3]]) and np.array_equal(ys, want[2][1][[7, 3]])
    assert all(isinstance(m, np.memmap) for m in rows.maps.values()) and len(rows.maps) == 2


@pytest.mark.parametrize("shuffle", ["local", "global"])
@pytest.mark.parametrize("world", [3, 4])  # 6 shards: by file on 3 ranks, by record on 4
def test_npy_every_rank_reads_its_own_records_and_together_all(npy, shuffle, world):
    from hpclab.rank import stream

    d = describe(npy)
    cfg = SimpleNamespace(seed=5, shuffle=shuffle, stream_buffer=1)
    per_rank = d["train_records"] // world
    seen = []
    for rank in range(world):
        batches = stream.pipeline(d, cfg, rank, world, 1).take(per_rank)
        seen.append({x.numpy().tobytes() for x, _ in batches})
    assert stream.by_file(d, world) == (world == 3)
    assert all(len(s) == per_rank for s in seen)
    assert len(set().union(*seen)) == per_rank * world


@pytest.mark.parametrize("fmt", ["tfrecord", "npy", "npz", "hdf5"])
def test_a_pack_holds_every_file_once_and_reads_back_what_they_hold(tmp_path, monkeypatch, fmt):
    from hpclab.rank import stream

    monkeypatch.setenv("HPCLAB_LOCAL_DIR", str(tmp_path / "node"))
    folder = make_dataset.make(tmp_path / fmt, fmt=fmt, files=4, records=24)
    d = describe(folder)
    files = sum(len(stream.shard_files(d, s)) for s in d["train_files"] + d["validation_files"])
    packed, info = stream.stage(d, str(folder), copier=True, how="pack")
    assert info["files"] == info["shared_opens"] == files and info["packed_mb"] > 0
    assert (tmp_path / "node").rglob("pack.bin") and Path(info["to"]).is_file()
    for split in ("train", "validation"):
        want, got = stream.read_arrays(d, split), stream.read_arrays(packed, split)
        assert all(np.array_equal(w, g) for w, g in zip(want, got))
    # the pipeline over the pack: by file on 2 ranks, every record once
    cfg = SimpleNamespace(seed=3, shuffle="global", stream_buffer=1)
    seen = [
        {x.numpy().tobytes() for x, _ in stream.pipeline(packed, cfg, r, 2, 1).take(48)}
        for r in (0, 1)
    ]
    assert len(seen[0] | seen[1]) == 96 and not seen[0] & seen[1]
    # every read went through one open of the pack (plus one map per npy file touched)
    assert packed["pack"].opens == (1 + files if fmt == "npy" else 1)
    # unchanged sources: the pack is kept; a source changed: packed anew
    again, info = stream.stage(d, str(folder), copier=True, how="pack")
    assert info["kept_mb"] > 0 and info["packed_mb"] == info["shared_opens"] == 0
    src = Path(stream.shard_files(d, d["train_files"][0])[0])
    src.touch()
    _, info = stream.stage(d, str(folder), copier=True, how="pack")
    assert info["packed_mb"] > 0
    Path(info["to"]).write_bytes(b"")  # a pack that is not whole is packed anew too
    _, info = stream.stage(d, str(folder), copier=True, how="pack")
    assert info["packed_mb"] > 0 and Path(info["to"]).stat().st_size > 0
    # a rank that is not its node's writer reads the pack the writer made
    other, info = stream.stage(d, str(folder), copier=False, how="pack")
    assert info["shared_opens"] == 0 and np.array_equal(
        stream.read_arrays(other, "validation")[1], stream.read_arrays(d, "validation")[1]
    )


def test_npy_shards_are_staged_locally_as_pairs(tmp_path, monkeypatch):
    from hpclab.rank import stream

    monkeypatch.setenv("HPCLAB_LOCAL_DIR", str(tmp_path / "node"))
    folder = make_dataset.make(tmp_path / "sig", fmt="npy", files=2, records=8)
    d = describe(folder)
    local, info = stream.stage(d, str(folder), copier=True)
    assert all(Path(f).is_file() for s in local["train_files"] for f in stream.shard_files(d, s))
    assert info["copied_mb"] > 0
    assert np.array_equal(stream.read_arrays(local, "train")[0], stream.read_arrays(d, "train")[0])


def test_a_ranks_set_up_records_what_packing_did(tmp_path, monkeypatch):
    """rank.stream.for_rank on one process (the barrier a stand-in: MPI runs are in
    tests/test_file_data.py): what summary["input_pipeline"] will hold for a packed npy set."""
    from hpclab.core.config import RunConfig
    from hpclab.rank import stream

    monkeypatch.setenv("HPCLAB_LOCAL_DIR", str(tmp_path / "node"))
    folder = make_dataset.make(tmp_path / "sig", fmt="npy", files=4, records=32)
    d = describe(folder)
    cfg = RunConfig(dataset=str(folder), input="stream", stage="pack", batch_per_worker=16)
    stream.stage(d, str(folder), copier=True, how="pack")  # its node's local rank 0, before
    src, (vx, _), classes, shape, info = stream.for_rank(
        cfg, cfg.for_workers(2), 1, 2, 1, lambda failed: failed
    )
    assert (classes, shape, len(vx)) == (d["classes"], d["input_shape"], d["validation_records"])
    assert src.iterator.get_next()[0].shape == (16, *shape)
    pairs = len(d["train_files"]) + len(d["validation_files"])
    stage = info["stage"]
    # local rank 1 is not its node's writer: it opened no source file; local rank 0 packed
    assert stage["files"] == 2 * pairs and stage["shared_opens"] == 0
    mine = len(d["train_files"]) // 2 + len(d["validation_files"])  # shards it mapped
    assert stage["pack_opens"] == 1 + 2 * mine and info["file_opens_per_epoch"] == 0
