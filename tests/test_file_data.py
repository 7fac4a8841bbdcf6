"""Your own data: a folder of files with a dataset.json (hpclab.core.filedata), resident or
streamed by tf.data on real ranks (hpclab.rank.stream), with the example model of
examples/byo, which lives outside hpclab."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from hpclab.core.config import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.core.filedata import check_files, describe, masked_crc32c, resident

BYO = Path(__file__).resolve().parents[1] / "examples" / "byo"
sys.path.insert(0, str(BYO))
import make_dataset  # noqa: E402  (examples/byo: the generator a researcher runs)


@pytest.fixture(scope="module")
def signals(tmp_path_factory):
    """A small TFRecord dataset: 8 training files of 256 records (64 floats), 2 validation."""
    return make_dataset.make(tmp_path_factory.mktemp("data") / "signals", records=256)


def _edit(folder: Path, **changes) -> Path:
    desc = json.loads((folder / "dataset.json").read_text())
    desc.update(changes)
    (folder / "dataset.json").write_text(json.dumps(desc))
    return folder


def test_crc32c_is_castagnolis():
    # RFC 3720 B.4: CRC-32C of 32 zero bytes is 0x8A9136AA; the mask as record_writer.cc
    from hpclab.core.filedata import crc32c

    assert crc32c(bytes(32)) == 0x8A9136AA
    c = crc32c(b"abc")
    assert masked_crc32c(b"abc") == (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_description_and_files_are_checked_with_one_sentence(signals, tmp_path):
    d = describe(signals)
    assert d["train_records"] == 8 * 256 and d["input_shape"] == (64,)
    check_files(signals)
    cfg = RunConfig(dataset=str(signals), model="cnn1d")
    assert cfg.train_size() == d["train_records"] and cfg.validation_size() == 2 * 256
    assert resident(cfg, 2)  # 1 MB: auto keeps it in memory
    # a description that is wrong names the field, the value and what is allowed
    bad = Path(shutil.copytree(signals, tmp_path / "bad"))
    _edit(bad, format="parquet")
    with pytest.raises(
        ConfigError, match=r"field 'format' must be one of tfrecord, npy, npz, hdf5; it is"
    ):
        RunConfig(dataset=str(bad)).for_workers(2)
    _edit(bad, format="tfrecord", x={"key": "x", "shape": [0], "dtype": "float32"})
    with pytest.raises(ConfigError, match=r"'x.shape' must be a list of 1 to 3 positive"):
        describe(bad)
    with pytest.raises(ConfigError, match="is not a folder"):
        RunConfig(dataset=str(tmp_path / "missing")).train_size()
    # a file that is not what the description says: its framing is checked before any rank
    wrong = Path(shutil.copytree(signals, tmp_path / "wrong"))
    make_dataset.make(tmp_path / "npz", fmt="npz", files=1, records=8)
    shutil.copy(tmp_path / "npz" / "train-00000.npz", wrong / "train-00003.tfrecord")
    with pytest.raises(ConfigError, match=r"train file 'train-00003.tfrecord' is not a tfrecord"):
        check_files(wrong)


@pytest.mark.parametrize("fmt", ["npz", "hdf5"])
def test_npz_and_hdf5_shards_are_checked_and_read_as_written(tmp_path, fmt):
    import numpy as np

    from hpclab.rank import stream

    folder = make_dataset.make(tmp_path / fmt, fmt=fmt, files=2, records=16)
    check_files(folder)
    d = describe(folder)
    x, y = stream.read_arrays(d, "train")
    rng = np.random.default_rng(0)  # make()'s draws, in its order
    assert np.array_equal(x[:16], make_dataset.signals(16, 64, rng)[0]) and y.dtype == np.int32
    _edit(folder, x={"key": "x", "shape": [32], "dtype": "float32"})
    with pytest.raises(ConfigError, match=r"x is \(\(16, 64\), 'float32'\), the description says"):
        check_files(folder)


@pytest.mark.parametrize("shuffle", ["local", "global"])
@pytest.mark.parametrize("world", [2, 3])  # 8 files: by file on 2 ranks, by record on 3
def test_every_rank_reads_its_own_records_and_together_all(signals, shuffle, world):
    from types import SimpleNamespace

    from hpclab.rank import stream

    d = describe(signals)
    cfg = SimpleNamespace(seed=5, shuffle=shuffle, stream_buffer=1)  # (buffer 1: stream order)
    per_rank = d["train_records"] // world
    seen = []
    for rank in range(world):
        batches = stream.pipeline(d, cfg, rank, world, 1).take(per_rank)
        seen.append({x.numpy().tobytes() for x, _ in batches})
    assert stream.by_file(d, world) == (world == 2)
    assert all(len(s) == per_rank for s in seen)  # no record twice within a rank's epoch
    assert len(set().union(*seen)) == per_rank * world  # nor on two ranks: all but the remainder


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.own_lab
def test_a_model_of_your_own_trains_on_streamed_tfrecords_and_failures_are_sentences(
    signals, tmp_path, monkeypatch
):
    from hpclab import Lab

    # the engines inherit the client's environment: the example's folder on PYTHONPATH, and
    # node-local storage for the pack in this test's folder
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BYO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HPCLAB_LOCAL_DIR", str(tmp_path / "node"))
    npy = make_dataset.make(tmp_path / "npy", fmt="npy", records=256)  # as `signals`, in npy
    cfg = RunConfig(
        model="my_model:small_cnn",
        dataset=str(signals),
        input="stream",
        epochs=2,
        batch_per_worker=32,
        warmup_epochs=0,
    )
    # a feature of the wrong size in files whose framing is right: found on the ranks
    short = make_dataset.make(tmp_path / "short", files=2, records=64, length=32)
    _edit(short, x={"key": "x", "shape": [64], "dtype": "float32"})
    with Lab(workers=2, runs_dir=tmp_path / "runs", verbose=False) as lab:
        run = lab.run(cfg)
        summary = run.wait(timeout=300)
        # plain .npy shards, packed once per node and read from the pack (FanStore's idea)
        packed = lab.run(cfg.replace(dataset=str(npy), stage="pack"))
        packed_summary = packed.wait(timeout=300)
        garbled = lab.run(cfg.replace(dataset=str(short)))
        garbled.wait(timeout=300, check=False)  # (every rank fails together: engines live on)
        with pytest.raises(ConfigError, match="module 'no_such_package.models' cannot be"):
            lab.run(cfg.replace(model="no_such_package.models:build"))
        with pytest.raises(ConfigError, match=r"batch_per_worker must be at most 1024 on 2"):
            lab.run(cfg.replace(batch_per_worker=2000))
        # last: one rank's failure aborts the others (the lab restarts engines on its next run)
        broken = lab.run(cfg.replace(model="my_model:broken_on_rank_1"))
        broken.wait(timeout=300, check=False)
    assert run.status == "finished", run.error
    assert len(set(summary["weights_digest"])) == 1
    assert summary["val_accuracy"] > 0.2, summary["val_accuracy"]  # chance is 0.10
    info, split = summary["input_pipeline"], summary["time_split"]
    assert (
        info["mode"] == "stream" and info["sharding"] == "by_file" and info["format"] == "tfrecord"
    )
    # the input part is the wait for the pipeline: non-zero, within a few times the batch time
    # the pipeline takes on its own (prefetch hides part of it behind compute; 2 busy cores
    # stretch both). (Resident vs streamed and staging: notebook 07's claims.)
    assert 0 < split["input_ms"] < 5 * info["probe_s_per_batch"] * 1e3 + 1.0, (split, info)
    assert packed.status == "finished", packed.error
    assert len(set(packed_summary["weights_digest"])) == 1
    info, d = packed_summary["input_pipeline"], describe(npy)
    assert (info["format"], info["mode"], info["sharding"]) == ("npy", "stream", "by_file")
    pairs = len(d["train_files"]) + len(d["validation_files"])
    # rank 0 is its node's writer: it opened every source file once and the pack once, then
    # mapped its own shards' members (its half of the training shards, all of validation)
    mine = len(d["train_files"]) // 2 + len(d["validation_files"])
    assert info["stage"]["files"] == info["stage"]["shared_opens"] == 2 * pairs
    assert info["stage"]["pack_opens"] == 1 + 2 * mine and info["file_opens_per_epoch"] == 0
    assert broken.status == "failed"
    assert "rank 1 raised" in broken.error and "cannot be built on rank 1" in broken.error
    assert garbled.status == "failed"
    assert "file 'train-00000.tfrecord' is not what dataset.json says" in garbled.error


def test_the_panels_dataset_menu_offers_folders_and_takes_a_typed_path(signals, tmp_path):
    from hpclab.views.panel.folders import find
    from hpclab.views.panel.panel import Panel

    root = tmp_path / "data"
    mine = make_dataset.make(root / "lab" / "mine", files=2, records=128)  # two levels down
    (root / ".hidden").mkdir()
    (root / "notes").mkdir()  # a folder without a dataset.json is not offered
    assert find(root) == [mine.resolve()] and find(tmp_path / "absent") == []
    panel = Panel(None, workers=2, data_root=root, dashboard=False)
    w = panel.widgets
    menu = dict(w["dataset"].options)  # label -> value
    assert menu["lab/mine/"] == str(mine.resolve()) and menu["mnist1d"] == "mnist1d"
    assert w["input"].disabled and w["stage"].layout.display == "none"  # a catalogue dataset
    # picking the folder: its models (1-D signals), its knobs, a valid config of it
    w["dataset"].value = str(mine.resolve())
    assert "cnn1d" in w["model"].options and "resnet20" not in w["model"].options
    assert not w["input"].disabled and w["stage"].layout.display is None
    assert w["num_samples"].disabled
    w["input"].value, w["stage"].value = "stream", "pack"
    cfg = panel.config_from_widgets()
    assert (cfg.dataset, cfg.input, cfg.stage) == (str(mine.resolve()), "stream", "pack")
    assert panel.config_error is None
    # a typed path: a folder elsewhere is added and picked; a wrong one is a sentence
    w["dataset_path"].value = str(tmp_path / "nowhere")
    assert "is not a folder" in w["dataset_note"].value
    assert w["dataset"].value == str(mine.resolve())
    w["dataset_path"].value = str(signals)
    assert (
        w["dataset"].value == str(signals) and str(signals) in dict(w["dataset"].options).values()
    )
    assert panel.config_from_widgets().dataset == str(signals) and panel.config_error is None
    # back to the catalogue: the folder's knobs return to theirs, the config stays valid
    w["dataset"].value = "mnist1d"
    assert (w["input"].value, w["stage"].value) == ("auto", "shared") and panel.config_error is None


def test_the_panel_keeps_your_own_model_on_a_folder(signals):
    from hpclab.views.panel.panel import Panel

    base = RunConfig(model="my_model:small_cnn", dataset=str(signals), epochs=1)
    panel = Panel(None, workers=2, base=base, dashboard=False)
    w = panel.widgets
    assert w["dataset"].value == str(signals) and w["model"].value == "my_model:small_cnn"
    assert panel.config_from_widgets() == base
