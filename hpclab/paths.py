"""Where hpclab keeps data and run records, and whether a staged dataset is there.

A checkout (the workshop case) keeps both beside the code: `<checkout>/data` and `<checkout>/runs`,
whatever folder the notebook runs from. `HPCLAB_DATA` / `HPCLAB_RUNS` override them (e.g. a
shared, pre-staged data folder on a cluster, or scratch space for runs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpclab.catalog import STAGED_DATASETS

if TYPE_CHECKING:
    from hpclab.config import RunConfig

_PACKAGE = Path(__file__).resolve().parent


def project_root() -> Path | None:
    """The checkout hpclab was installed from (editable install), or None."""
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").exists() else None


def _default(env: str, name: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env]).expanduser().resolve()
    root = project_root()
    if root is not None:
        return root / name
    return Path.home() / ".cache" / "hpclab" / name


def data_dir() -> Path:
    """Generated and staged datasets ($HPCLAB_DATA, else <checkout>/data)."""
    return _default("HPCLAB_DATA", "data")


def runs_dir() -> Path:
    """Run records ($HPCLAB_RUNS, else <checkout>/runs)."""
    return _default("HPCLAB_RUNS", "runs")


def check_staged(cfg: RunConfig, data_dir: Path | str) -> None:
    """Raise FileNotFoundError (one sentence) if `cfg` reads a staged dataset that is missing.

    Checked on the client before any rank starts: a rank that cannot find its data would leave
    its peers waiting."""
    if cfg.dataset in STAGED_DATASETS:
        path = Path(data_dir) / f"{cfg.dataset}.npz"
        if not path.exists():
            raise FileNotFoundError(
                f"dataset {cfg.dataset!r} is read from {path}, which does not exist; nothing is "
                f"downloaded at run time, so stage {cfg.dataset}.npz there first (keys x_train, "
                f"y_train, x_test, y_test; see data/README.md) or choose dataset 'mnist1d'."
            )
