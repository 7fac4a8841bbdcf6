"""`probe(lab, layout, ...)`: every real rank reads a dataset store for a few epochs; what each
rank's epoch cost, as a table — the measurement behind the I/O lesson (notebook 07).

The store (`hpclab.rank.probes.stores`) is written once under ``<runs_dir>/.stores`` from the run's own
MNIST-1D training split, then each engine reads its part epoch by epoch and counts ``stat``,
``open`` and read requests. ``real_s`` is measured here (the page cache serves it);
``simulated_s`` is a slow shared path's latency times the metadata operations, labelled as
simulated. With `stage`, each rank first copies the store to node-local storage (``/dev/shm``
here) and then reads it at no simulated latency: the copy's cost is the row of epoch -1.

Each probe is recorded as a CSV under ``<runs_dir>/.io/`` (run listings look only at folders
with a ``config.json``); `table(frames)` puts probes side by side, one row each.
"""

from __future__ import annotations

import getpass
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from hpclab.core.errors import ConfigError

TIMEOUT_S = 300.0


def probe(
    lab,
    layout: str = "files",
    *,
    shuffle: str = "local",
    epochs: int = 2,
    num_samples: int = 8000,
    seed: int = 0,
    latency_ms: float = 0.0,
    stage: bool = False,
) -> pd.DataFrame:
    """One row per rank and epoch: rank, epoch, layout, shuffle, samples, stat, open, read,
    bytes, remote, real_s, simulated_s (see `hpclab.rank.probes.stores.EpochIO`)."""
    from hpclab.rank import data
    from hpclab.rank.probes import stores

    _check_args(layout, shuffle, epochs, num_samples, latency_ms, stores)
    root = Path(lab.runs_dir) / ".stores" / f"mnist1d-n{num_samples}-s{seed}"
    arrays = data.load_arrays(
        {"dataset": "mnist1d", "num_samples": num_samples, "seed": seed}, lab.data_dir
    )
    # the one store this probe reads (layout memory loads the packed file once)
    stores.write("packed" if layout == "memory" else layout, arrays.x_train, arrays.y_train, root)
    stage_to = ""
    if stage:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        stage_to = str(Path(shm) / f"hpclab-{getpass.getuser()}-{os.getpid()}")
    per_rank = lab.apply(
        stores.rank_epochs,
        str(root),
        layout,
        shuffle,
        epochs,
        seed=seed,
        latency_ms=latency_ms,
        stage_to=stage_to,
        timeout=TIMEOUT_S,
    )
    rows = [row for rank_rows in per_rank for row in rank_rows]
    frame = pd.DataFrame(rows).sort_values(["epoch", "rank"], ignore_index=True)
    frame["latency_ms"], frame["staged"] = float(latency_ms), bool(stage)
    record = Path(lab.runs_dir) / ".io"
    record.mkdir(mode=0o700, exist_ok=True)
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{len(list(record.iterdir()))}"
    frame.to_csv(record / f"{name}-{layout}-{shuffle}.csv", index=False)
    return frame


def table(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per probe: per rank and epoch on average, operations, MB, the share of samples
    read from outside the rank's shard, real and simulated seconds; staging's one-off cost."""
    out = []
    for frame in frames:
        epochs, copy = frame[frame.epoch >= 0], frame[frame.epoch < 0]
        out.append(
            {
                "layout": epochs.layout.iloc[0],
                "shuffle": epochs.shuffle.iloc[0],
                "staged": bool(frame.staged.iloc[0]),
                "latency_ms (simulated)": frame.latency_ms.iloc[0],
                "samples": int(epochs.samples.mean()),
                "open": epochs.open.mean(),
                "read": epochs.read.mean(),
                "MB": epochs.bytes.mean() / 1e6,
                "remote share": epochs.remote.mean() / epochs.samples.mean(),
                "real ms": 1000 * epochs.real_s.mean(),
                "simulated s": epochs.simulated_s.mean(),
                "staging simulated s": copy.simulated_s.mean() if len(copy) else 0.0,
            }
        )
    return pd.DataFrame(out)


def _check_args(layout, shuffle, epochs, num_samples, latency_ms, stores) -> None:
    if layout not in stores.LAYOUTS:
        raise ConfigError(
            f"layout must be one of {', '.join(stores.LAYOUTS)}; you passed {layout!r}."
        )
    if shuffle not in stores.SHUFFLES:
        raise ConfigError(
            f"shuffle must be one of {', '.join(stores.SHUFFLES)}; you passed {shuffle!r}."
        )
    if not (isinstance(epochs, int) and 1 <= epochs <= 100):
        raise ConfigError(f"epochs must be an integer from 1 to 100; you passed {epochs!r}.")
    if not (isinstance(num_samples, int) and 100 <= num_samples <= 200_000):
        raise ConfigError(
            f"num_samples must be an integer from 100 to 200000 (a files store writes one file "
            f"per sample); you passed {num_samples!r}."
        )
    if not (isinstance(latency_ms, (int, float)) and 0 <= latency_ms <= 1000):
        raise ConfigError(f"latency_ms must be from 0 to 1000; you passed {latency_ms!r}.")
