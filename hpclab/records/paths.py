"""Where hpclab keeps data, run records and engine state, and whether a staged dataset is there.

Each folder comes from the first of (`folder`):

1. `HPCLAB_RUNS` / `HPCLAB_DATA` (the user's own choice);
2. the cluster profile's `paths.runs` / `paths.data` (the centre's choice; `hpclab.cluster.profiles`);
3. the checkout beside the code, `<checkout>/runs` and `<checkout>/data`, when this user can write
   it (the workshop case: whatever folder the notebook runs from);
4. otherwise (a centre-wide, read-only install, or an installed package) a folder of the user's
   own (`user_root`): `$SCRATCH/hpclab`, else `$XDG_DATA_HOME/hpclab`, else
   `~/.local/share/hpclab` (the XDG Base Directory Specification's default).

A staged data folder may be read-only: it is only read (`check_folder`), and a run refuses to
start only when it would have to write there (`check_staged`: an MNIST-1D cache not yet made).
Engine state (`state_root`) is per user, so one user's private state folder never locks out the
next one in a shared runs folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpclab.core.catalog import STAGED_DATASETS
from hpclab.core.errors import ConfigError
from hpclab.core.filedata import check_files, is_file_dataset

if TYPE_CHECKING:
    from hpclab.core.config import RunConfig

_PACKAGE = Path(__file__).resolve().parents[1]  # the `hpclab` package folder
_ENV = {"runs": "HPCLAB_RUNS", "data": "HPCLAB_DATA"}


def project_root() -> Path | None:
    """The checkout hpclab runs from (an editable install or PYTHONPATH), or None."""
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").exists() else None


def user_root(env: dict[str, str] | None = None) -> Path:
    """This user's own hpclab folder: `$SCRATCH/hpclab` (cluster scratch space), else
    `$XDG_DATA_HOME/hpclab`, else `~/.local/share/hpclab` (an XDG_DATA_HOME that is not an
    absolute path is ignored, as the XDG Base Directory Specification says)."""
    env = os.environ if env is None else env
    if env.get("SCRATCH"):
        return Path(env["SCRATCH"]).expanduser() / "hpclab"
    xdg = env.get("XDG_DATA_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "hpclab"


def default_root(env: dict[str, str] | None = None) -> tuple[Path, str]:
    """Where `runs/` and `data/` go when neither the user nor a profile says, and why: the
    checkout when this user can write it, else `user_root`."""
    root = project_root()
    if root is not None and os.access(root, os.W_OK | os.X_OK):
        return root, "the checkout"
    why = "the install is read-only" if root is not None else "hpclab is an installed package"
    return user_root(env), f"{why}, so this user's own folder"


def folder(name: str, profile_value: str = "", env: dict[str, str] | None = None) -> Path:
    """The `runs` or `data` folder: $HPCLAB_RUNS/$HPCLAB_DATA, else the profile's `paths.<name>`
    (`profile_value`), else `default_root()/<name>` (see the module docstring)."""
    env = os.environ if env is None else env
    if env.get(_ENV[name]):
        return Path(env[_ENV[name]]).expanduser().resolve()
    if profile_value:
        return Path(profile_value).expanduser()
    return default_root(env)[0] / name


def data_dir() -> Path:
    """Generated and staged datasets ($HPCLAB_DATA, else <checkout>/data or the user's own)."""
    return folder("data")


def runs_dir() -> Path:
    """Run records ($HPCLAB_RUNS, else <checkout>/runs or the user's own)."""
    return folder("runs")


def where(runs: Path, data: Path, state: Path) -> tuple[str, bool]:
    """(one line saying where a lab keeps its runs, data and engine state, whether a folder is
    the user's own fallback: a line a user should see, since it is not where the docs' workshop
    layout puts it)."""
    root, why = default_root()
    line = f"runs in {runs}, data in {data}, engine state in {state}"
    own = root != project_root() and any(Path(p).is_relative_to(root) for p in (runs, data))
    return (f"{line} ({why})", True) if own else (line, False)


def _can_write(path: Path) -> bool:
    """This user can write `path`, or make it (its nearest existing ancestor is writable)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return os.access(path, os.W_OK | os.X_OK)


def _user() -> str:
    """This process's user name from its uid (not $USER, which `su` and `sudo -E` carry over)."""
    try:
        import pwd  # POSIX only, like the MPI launchers this serves

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):  # a uid without a passwd entry (some containers)
        return str(os.getuid())


def state_root(runs: Path | str, explicit: str = "") -> Path:
    """The folder under which a lab makes its private state folder (ipyparallel connection
    files, logs, batch scripts; mode 0700): the profile's `paths.state` (`explicit`), else
    `<runs>/.state`. Per user: when that folder exists and belongs to another user (a runs or
    state folder several users share), this user's is `<runs>/.state-<user>` (or
    `<paths.state>/<user>`), so nobody is locked out by another's private folder."""
    base = Path(explicit).expanduser() if explicit else Path(runs) / ".state"
    try:
        theirs = base.stat().st_uid != os.getuid()
    except OSError:  # not made yet: this user makes it
        theirs = False
    if not theirs:
        return base
    return base / _user() if explicit else base.with_name(f".state-{_user()}")


#: Where each folder a Lab writes can come from, as error messages name it.
FOLDERS = {
    "runs_dir": "Lab.runs_dir (--runs-dir, $HPCLAB_RUNS)",
    "data_dir": "Lab.data_dir (--data-dir, $HPCLAB_DATA)",
}


def check_folder(path: Path | str, which: str) -> Path:
    """`path` as a folder this process can use; else a ConfigError naming the setting (`which`:
    a key of FOLDERS), the path and what is wrong with it. Checked before any engine starts.

    The runs folder must be writable (made if missing). The data folder need only be readable
    when it exists (a centre's staged datasets are often read-only); `check_staged` refuses a
    run that would have to write there."""
    path, what = Path(path), FOLDERS[which]
    reading = which == "data_dir" and path.is_dir()
    if reading:
        if not os.access(path, os.R_OK | os.X_OK):
            raise ConfigError(f"{what} {path} is not readable by this user.")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{what} must be a folder; {path} is a file.") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be made: {exc.strerror or exc}.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} is not writable by this user.")
    return path


def mnist1d_cache(num_samples: int, seed: int, data_dir: Path | str) -> Path:
    """The MNIST-1D cache file a run reads or makes (the name hpclab.rank.data gives it)."""
    return Path(data_dir) / f"mnist1d-n{int(num_samples)}-s{int(seed)}.npz"


def check_staged(cfg: RunConfig, data_dir: Path | str) -> None:
    """Refuse, before any rank starts, a run whose data cannot be had: a staged dataset that is
    missing or unreadable (FileNotFoundError, one sentence), or an MNIST-1D cache not yet made
    in a data folder this user cannot write (ConfigError). A rank that cannot get its data
    would leave its peers waiting."""
    if is_file_dataset(cfg.dataset):  # your own files: description and framing, before ranks
        check_files(cfg.dataset)
    if cfg.dataset in STAGED_DATASETS:
        path = Path(data_dir) / f"{cfg.dataset}.npz"
        if not path.exists():
            raise FileNotFoundError(
                f"dataset {cfg.dataset!r} is read from {path}, which does not exist; nothing is "
                f"downloaded at run time, so stage {cfg.dataset}.npz there first (keys x_train, "
                f"y_train, x_test, y_test; see data/README.md) or choose dataset 'mnist1d'."
            )
        if not os.access(path, os.R_OK):
            raise FileNotFoundError(
                f"dataset {cfg.dataset!r} at {path} is not readable by this user."
            )
    if cfg.dataset == "mnist1d":
        path = mnist1d_cache(cfg.num_samples, cfg.seed, data_dir)
        if not path.exists() and not _can_write(Path(data_dir)):
            raise ConfigError(
                f"dataset 'mnist1d' with num_samples={cfg.num_samples}, seed={cfg.seed} would be "
                f"generated and cached as {path}, but {FOLDERS['data_dir']} {data_dir} is not "
                "writable by this user; set HPCLAB_DATA to a folder you can write, or ask for the "
                "cache to be staged there."
            )
