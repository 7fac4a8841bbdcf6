"""Datasets, sharding and tf.data pipelines (real TF and real mnist1d generation, no MPI)."""

import os
import threading

import numpy as np
import pytest

from hpclab.core.config import RunConfig
from hpclab.rank import data


def _cfg(**kw):
    return RunConfig(**kw).to_dict()


@pytest.fixture(scope="module")
def mnist1d_dir(tmp_path_factory):
    """A data dir holding one generated MNIST-1D cache (1000 samples: about a second)."""
    d = tmp_path_factory.mktemp("data")
    data.load_arrays(_cfg(num_samples=1000, seed=5), d)
    return d


def test_mnist1d_shapes_and_split(mnist1d_dir):
    cfg = RunConfig(num_samples=1000, seed=5)
    a = data.load_arrays(cfg.to_dict(), mnist1d_dir)
    assert a.x_train.shape == (cfg.train_size(), 40) == (800, 40)
    assert a.x_val.shape == (cfg.validation_size(), 40) == (200, 40)
    assert a.y_train.shape == (800,) and a.y_val.shape == (200,)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int32
    assert a.num_classes == 10 and a.input_shape == (40,)
    assert set(np.unique(a.y_train)) == set(range(10))
    assert abs(float(np.concatenate([a.x_train, a.x_val]).mean())) < 1e-3  # mnist1d centres it


def test_mnist1d_odd_sample_count_matches_run_config(tmp_path):
    """make_dataset makes num_samples // 10 per class; we still return exactly num_samples."""
    cfg = RunConfig(num_samples=203, seed=1)
    a = data.load_arrays(cfg.to_dict(), tmp_path)
    assert len(a.x_train) == cfg.train_size() and len(a.x_val) == cfg.validation_size()


def test_mnist1d_cache_is_reused_and_named(mnist1d_dir):
    path = mnist1d_dir / "mnist1d-n1000-s5.npz"
    assert path.exists()
    first = data.load_arrays(_cfg(num_samples=1000, seed=5), mnist1d_dir)
    stamp = path.stat().st_mtime_ns
    os.utime(path, ns=(stamp - 10**9, stamp - 10**9))  # make any rewrite visible
    stamp = path.stat().st_mtime_ns
    second = data.load_arrays(_cfg(num_samples=1000, seed=5), mnist1d_dir)
    assert path.stat().st_mtime_ns == stamp  # not regenerated
    np.testing.assert_array_equal(first.x_train, second.x_train)
    assert not [p for p in os.listdir(mnist1d_dir) if p.endswith(".tmp")]


def test_mnist1d_generation_is_deterministic_and_leaves_global_rng_alone(tmp_path):
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    a = data.load_arrays(_cfg(num_samples=300, seed=7), tmp_path / "a")
    assert np.random.rand() == expected  # mnist1d's set_seed did not leak into the caller
    b = data.load_arrays(_cfg(num_samples=300, seed=7), tmp_path / "b")
    c = data.load_arrays(_cfg(num_samples=300, seed=8), tmp_path / "b")
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)


def test_concurrent_loaders_share_one_cache(tmp_path):
    """Two 'ranks' at once: the flock makes one generate; both get identical arrays."""
    results = [None, None]

    def load(i):
        results[i] = data.load_arrays(_cfg(num_samples=400, seed=2), tmp_path)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # mnist1d generation uses NumPy's *global* RNG: two concurrent generations corrupt each
    # other, so equality with a lone generation shows only one thread generated.
    alone = data.load_arrays(_cfg(num_samples=400, seed=2), tmp_path / "alone")
    for r in results:
        np.testing.assert_array_equal(r.x_train, alone.x_train)
        np.testing.assert_array_equal(r.y_val, alone.y_val)
    assert sorted(p for p in os.listdir(tmp_path) if not p.endswith(".lock")) == [
        "alone",
        "mnist1d-n400-s2.npz",
    ]


def test_staged_file_absent_names_path_and_how_to_stage(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        data.load_arrays(_cfg(dataset="cifar10", model="resnet20"), tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "cifar10.npz") in msg
    assert "tf.keras.datasets.cifar10.load_data()" in msg and "Nothing is downloaded" in msg


def test_staged_mnist_like_file_loads(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "fashion_mnist.npz",
        x_train=rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 10, 12, dtype=np.uint8),
        x_test=rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 10, 5, dtype=np.uint8),
    )
    a = data.load_arrays(_cfg(dataset="fashion_mnist", model="mlp"), tmp_path)
    assert a.x_train.shape == (12, 28, 28, 1) and a.x_val.shape == (5, 28, 28, 1)
    assert a.x_train.dtype == np.float32 and 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
    assert a.x_train.max() > 0.9  # scaled by 255, not left at 0..255 or crushed
    assert a.y_train.dtype == np.int32 and a.input_shape == (28, 28, 1) and a.num_classes == 10


def test_staged_cifar_labels_are_flattened(tmp_path):
    np.savez(
        tmp_path / "cifar10.npz",
        x_train=np.zeros((4, 32, 32, 3), np.uint8),
        y_train=np.arange(4, dtype=np.uint8).reshape(4, 1),
        x_test=np.zeros((2, 32, 32, 3), np.uint8),
        y_test=np.zeros((2, 1), np.uint8),
    )
    a = data.load_arrays(_cfg(dataset="cifar10", model="resnet20"), tmp_path)
    assert a.x_train.shape == (4, 32, 32, 3) and a.y_train.tolist() == [0, 1, 2, 3]


def test_synthetic_has_no_arrays_only_shape():
    a = data.load_arrays(
        _cfg(dataset="synthetic", model="resnet20", image_shape=(16, 16, 3)), "/nonexistent"
    )
    assert a.x_train is None and a.x_val is None
    assert a.input_shape == (16, 16, 3) and a.num_classes == 10


def test_shards_are_disjoint_equal_and_drop_the_remainder():
    x = np.arange(103)
    y = np.arange(103) * 10
    parts = [data.shard(x, y, r, 4) for r in range(4)]
    assert {len(px) for px, _ in parts} == {25}
    seen = np.concatenate([px for px, _ in parts])
    assert len(set(seen.tolist())) == 100  # disjoint, 3 dropped
    for px, py in parts:
        np.testing.assert_array_equal(py, px * 10)  # pairs stay aligned
    with pytest.raises(ValueError, match="rank=4"):
        data.shard(x, y, 4, 4)


def test_uneven_shards_hold_the_same_number_of_steps_of_each_ranks_batch():
    """batch_skew: rank 0's batch of 96 and rank 1's of 32 get shards of 96 and 32 samples a
    step for the same whole number of steps, disjoint and side by side."""
    x = np.arange(1000)
    y = x * 10
    parts = [data.shard(x, y, r, 2, [96, 32]) for r in range(2)]
    steps = 1000 // 128
    assert [len(px) for px, _ in parts] == [96 * steps, 32 * steps]
    assert parts[0][0][-1] + 1 == parts[1][0][0] and not set(parts[0][0]) & set(parts[1][0])
    for px, py in parts:
        np.testing.assert_array_equal(py, px * 10)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other_size"])
def test_a_corrupt_dataset_cache_is_generated_again(mnist1d_dir, tmp_path, caplog, damage):
    good = mnist1d_dir / "mnist1d-n1000-s5.npz"
    path = tmp_path / good.name
    if damage == "garbage":
        path.write_bytes(b"not an npz at all")
    elif damage == "truncated":  # a copy torn by a full disk
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    else:  # a whole npz under this name, but of another size
        np.savez(path, x=np.zeros((10, 40), np.float32), y=np.zeros(10, np.int32))
    with caplog.at_level("WARNING", logger="hpclab.rank.data"):
        a = data.load_arrays(_cfg(num_samples=1000, seed=5), tmp_path)
    expected = data.load_arrays(_cfg(num_samples=1000, seed=5), mnist1d_dir)
    np.testing.assert_array_equal(a.x_train, expected.x_train)
    assert path.read_bytes() == good.read_bytes()  # the cache itself is whole again
    assert [r.getMessage() for r in caplog.records] == [
        f"the dataset cache {path} is unreadable; generating it again"
    ]


def test_a_lock_file_of_another_user_is_locked_read_only_not_skipped(tmp_path, monkeypatch):
    import fcntl

    lock = tmp_path / "x.lock"
    lock.write_text("")
    real_open, taken = os.open, []

    def open_as_another_user(path, flags, *args):  # the file is not ours to write
        if flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    real_flock = fcntl.flock
    monkeypatch.setattr(os, "open", open_as_another_user)
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: (taken.append(op), real_flock(fd, op)))
    with data._exclusive_lock(lock) as held:
        assert held.fd is not None and taken == [fcntl.LOCK_EX]
