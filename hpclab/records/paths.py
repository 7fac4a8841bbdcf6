"""Where hpclab keeps data and run records, and whether a staged dataset is there.

A checkout (the workshop case) keeps both beside the code: `<checkout>/data` and `<checkout>/runs`,
whatever folder the notebook runs from. `HPCLAB_DATA` / `HPCLAB_RUNS` override them (e.g. a
shared, pre-staged data folder on a cluster, or scratch space for runs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpclab.core.catalog import STAGED_DATASETS
from hpclab.core.errors import ConfigError

if TYPE_CHECKING:
    from hpclab.core.config import RunConfig

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


#: Where each folder a Lab writes can come from, as error messages name it.
FOLDERS = {
    "runs_dir": "Lab.runs_dir (--runs-dir, $HPCLAB_RUNS)",
    "data_dir": "Lab.data_dir (--data-dir, $HPCLAB_DATA)",
}


def check_folder(path: Path | str, which: str) -> Path:
    """`path` as a folder this process can write (made if missing); else a ConfigError naming
    the setting (`which`: a key of FOLDERS), the path and what is wrong with it. Checked before
    any engine starts."""
    path, what = Path(path), FOLDERS[which]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{what} must be a folder; {path} is a file.") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be made: {exc.strerror or exc}.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} is not writable by this user.")
    return path


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
