"""Cluster profiles: a centre describes a partition once, in TOML; a Lab picks it by name.

A profile says *how* engines start on a machine (mpiexec here, `srun` inside a Slurm allocation,
or an `sbatch` job from a login node) and with what shape (threads, GPUs, MPI plugin, paths).
`hpclab.cluster.launch.plan_launch` turns a profile plus the user's numbers into a launch plan; this
module only reads, expands and validates profiles.

Lookup (first hit wins): `Lab(profile=...)` (a name, a path or a `Profile`) → `$HPCLAB_PROFILE`
→ auto-detection (`SLURM_JOB_ID` set → the built-in `slurm-allocation`, else `local`, which
`check_login_node` refuses on a Slurm login node unless someone chose it). Names are
searched as `<name>.toml` in `$HPCLAB_PROFILE_PATH` (colon-separated), `~/.config/hpclab/profiles`,
`<sys.prefix>/etc/hpclab/profiles` and `/etc/hpclab/profiles`. String values expand `${VAR}`
from the environment; an unset variable is an error naming the file and key.

The schema is the `_SECTIONS` table below; `docs/cluster.md` shows a commented example.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from hpclab.core.errors import ConfigError

MODES = ("auto", "mpiexec", "srun", "sbatch")
#: srun --mpi= plugins a profile may name (`srun --mpi=list` on the site shows its own): PMI-2 for
#: MPICH, PMIx (any version) for Open MPI, Cray's for Cray MPICH; "auto" follows the MPI Horovod
#: was built with and the site's MpiDefault (hpclab.cluster.site_mpi). Never "none": it makes N
#: 1-rank worlds (hpclab.cluster.world says so).
SRUN_MPI = ("auto", "pmi2", "pmi2_v2", "pmix", "pmix_v3", "pmix_v4", "pmix_v5", "cray_shasta")
GPU_BINDINGS = ("local_rank", "per_task")


@dataclass(frozen=True)
class Launch:
    mode: str = "auto"  # auto | mpiexec | srun | sbatch
    engine_prefix: tuple[str, ...] = ()  # e.g. ("apptainer", "exec", "/sw/hpclab.sif")
    python: str = ""  # the engines' interpreter if not the kernel's sys.executable
    mpiexec: str = ""  # mode mpiexec: path of mpiexec (default: beside Python, then PATH)
    # mode mpiexec: arguments after `-n N`, e.g. Open MPI's ["--oversubscribe", "--bind-to",
    # "none"] or MPICH Hydra's ["-bind-to", "none"]
    mpiexec_args: tuple[str, ...] = ()
    local_on_login: bool = False  # mode auto may start engines on a Slurm login node


@dataclass(frozen=True)
class Slurm:
    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = ""  # sbatch --time of the engines' job (mode sbatch)
    extra_sbatch: tuple[str, ...] = ()  # more `#SBATCH` options, e.g. ("--constraint=a100",)
    srun_mpi: str = "auto"  # srun --mpi=: auto, or the plugin of the MPI Horovod was built with
    srun_extra: tuple[str, ...] = ()
    overlap_inside_step: bool = True  # add --overlap when the kernel itself runs in a job step
    step_wait_s: int = 60  # srun -I: how long to wait for the step's resources
    queue_timeout_s: int = 1800  # mode sbatch: how long the engines' job may wait in the queue
    registration_timeout_s: int = 300  # after the step/job runs: engines must register in this


@dataclass(frozen=True)
class Node:
    gpus: int = 0  # GPUs per node to request (0: none)
    threads_per_worker: int = 0  # -c and OMP_NUM_THREADS; 0 = the Lab's threads_per_worker
    gpu_binding: str = "local_rank"  # local_rank (--gpus-per-node, pinned in engine) | per_task
    tasks_per_node: int = 0  # default engines per node when Lab(nodes=...) is given


@dataclass(frozen=True)
class Network:
    interface: str = ""  # the controller binds this interface's IPv4 (engines on other nodes)
    controller_ip: str = ""  # explicit bind + advertise address (overrides interface)
    ports: str = ""  # e.g. "50000-50100": a site-opened port range for the controller


@dataclass(frozen=True)
class Paths:
    runs: str = ""  # must be on a file system every node sees
    data: str = ""
    state: str = ""  # ipyparallel state (connection info, logs, batch scripts), mode 0700


@dataclass(frozen=True)
class Environment:
    setup: tuple[str, ...] = ()  # shell lines run before the engines (e.g. "module load ...")
    vars: dict[str, str] = field(default_factory=dict)  # extra engine environment


@dataclass(frozen=True)
class Profile:
    """One cluster partition, as a centre describes it (see the module docstring)."""

    name: str = "local"
    description: str = ""
    source: str = "built-in"  # the file it was read from
    launch: Launch = Launch()
    slurm: Slurm = Slurm()
    node: Node = Node()
    network: Network = Network()
    paths: Paths = Paths()
    environment: Environment = Environment()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {
    "launch": Launch,
    "slurm": Slurm,
    "node": Node,
    "network": Network,
    "paths": Paths,
    "environment": Environment,
}
_CHOICES = {
    ("launch", "mode"): MODES,
    ("slurm", "srun_mpi"): SRUN_MPI,
    ("node", "gpu_binding"): GPU_BINDINGS,
}
_BOUNDS = {  # (section, key) -> (low, high), inclusive
    ("slurm", "step_wait_s"): (1, 86400),
    ("slurm", "queue_timeout_s"): (1, 7 * 86400),
    ("slurm", "registration_timeout_s"): (1, 86400),
    ("node", "gpus"): (0, 64),
    ("node", "threads_per_worker"): (0, 1024),
    ("node", "tasks_per_node"): (0, 1024),
}

BUILTIN = {
    "local": Profile(name="local", description="engines under mpiexec on this machine"),
    "slurm-allocation": Profile(
        name="slurm-allocation",
        description="inside a Slurm allocation (salloc, sbatch, a JupyterHub job): engines by srun",
        launch=Launch(mode="srun"),
    ),
}


def search_path(env: dict[str, str] | None = None) -> list[Path]:
    """Folders searched for `<name>.toml`, first match wins."""
    env = os.environ if env is None else env
    folders = [Path(p) for p in env.get("HPCLAB_PROFILE_PATH", "").split(os.pathsep) if p]
    folders += [
        Path(env.get("HOME", "~")).expanduser() / ".config" / "hpclab" / "profiles",
        Path(sys.prefix) / "etc" / "hpclab" / "profiles",
        Path("/etc/hpclab/profiles"),
    ]
    return folders


def available(env: dict[str, str] | None = None) -> dict[str, str]:
    """Every profile name that resolves -> where it comes from (file path or 'built-in')."""
    found = {name: "built-in" for name in BUILTIN}
    for folder in reversed(search_path(env)):  # earlier folders override later ones
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found[path.stem] = str(path)
    return found


def resolve(choice: str | Path | Profile | None = None, env: dict[str, str] | None = None):
    """The profile a Lab uses: `choice`, else `$HPCLAB_PROFILE`, else auto-detection.

    Returns `(profile, how)` where `how` says why this one ("Lab(profile=...)",
    "HPCLAB_PROFILE", "auto: SLURM_JOB_ID is set", "auto: default")."""
    env = dict(os.environ) if env is None else env
    if isinstance(choice, Profile):
        return choice, "Lab(profile=...)"
    if choice not in (None, ""):
        return load(choice, env), "Lab(profile=...)"
    if env.get("HPCLAB_PROFILE"):
        return load(env["HPCLAB_PROFILE"], env), "HPCLAB_PROFILE"
    if env.get("SLURM_JOB_ID"):  # a site file of the same name wins over the built-in
        return load("slurm-allocation", env), "auto: SLURM_JOB_ID is set"
    return load("local", env), "auto: default"


def check_login_node(
    profile: Profile, how: str, launcher: str | None = None, env: dict[str, str] | None = None
) -> None:
    """Refuse (ConfigError, one sentence) to start engines on a Slurm login node by accident.

    Mode `auto` outside an allocation means `mpiexec` on this host; on a login node
    (`hpclab.cluster.host.slurm_login_node`) that puts TensorFlow engines next to everyone's
    editors. Allowed when someone chose it: the user asked for `local` by name (`profile=`,
    `HPCLAB_PROFILE`) or for `launcher='mpiexec'`, the profile's mode is `mpiexec`, or the
    profile sets `launch.local_on_login = true`."""
    from hpclab.cluster import host

    if profile.launch.mode != "auto" or profile.launch.local_on_login:
        return
    if launcher not in (None, "auto") or (profile.name == "local" and not how.startswith("auto")):
        return
    found = host.slurm_login_node(env)
    if found:
        raise ConfigError(
            f"this looks like a Slurm login node ({found}) with no allocation (SLURM_JOB_ID is "
            f"unset), so profile {profile.name!r} ({how}) would start the engines here; choose "
            'where they run with profile= or HPCLAB_PROFILE: a profile with launch.mode = "sbatch" '
            'submits them as a job, profile="local" runs them on this node anyway (a centre '
            "allows that with launch.local_on_login = true), or start inside an allocation (salloc)."
        )


def load(name_or_path: str | Path, env: dict[str, str] | None = None) -> Profile:
    """A profile by name (search path, then built-ins) or by path to a TOML file."""
    env = dict(os.environ) if env is None else env
    text = str(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(f"profile file {path} does not exist.")
        return parse(path.read_text(), source=str(path), env=env)
    for folder in search_path(env):
        path = folder / f"{text}.toml"
        if path.is_file():
            return parse(path.read_text(), source=str(path), env=env)
    if text in BUILTIN:
        return BUILTIN[text]
    known = ", ".join(sorted(available(env)))
    raise ConfigError(
        f"profile {text!r} was not found; known profiles: {known} "
        f"(searched {', '.join(str(p) for p in search_path(env))})."
    )


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: str, env: dict[str, str], where: str) -> str:
    def sub(match):
        if match.group(1) not in env:
            raise ConfigError(f"{where} uses ${{{match.group(1)}}}, which is not set.")
        return env[match.group(1)]

    return _VAR.sub(sub, value)


def parse(text: str, *, source: str = "<string>", env: dict[str, str] | None = None) -> Profile:
    """Parse and validate a profile's TOML text; every error names `source`, the key and the rule."""
    env = dict(os.environ) if env is None else env
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"profile {source} is not valid TOML: {exc}.") from None
    cluster = data.pop("cluster", {})
    if not isinstance(cluster, dict):
        raise ConfigError(f"profile {source}: [cluster] must be a table.")
    unknown = set(cluster) - {"name", "description"}
    unknown_sections = set(data) - set(_SECTIONS)
    if unknown or unknown_sections:
        bad = sorted(unknown_sections) + [f"cluster.{k}" for k in sorted(unknown)]
        raise ConfigError(
            f"profile {source}: unknown key(s) {', '.join(bad)}; sections allowed: cluster, "
            f"{', '.join(_SECTIONS)}."
        )
    sections = {}
    for section, cls in _SECTIONS.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"profile {source}: [{section}] must be a table.")
        sections[section] = cls(**_section(table, section, cls, source, env))
    if sections["network"].ports:  # "LOW-HIGH", checked now rather than at the lab's start
        from hpclab.cluster.ports import parse as port_range

        port_range(sections["network"].ports, f"profile {source}: network.ports")
    name = cluster.get("name") or Path(source).stem
    if not isinstance(name, str):
        raise ConfigError(f"profile {source}: cluster.name must be a string.")
    return Profile(
        name=name,
        description=str(cluster.get("description", "")),
        source=source,
        **sections,
    )


def _section(table: dict, section: str, cls, source: str, env: dict[str, str]) -> dict:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in table.items():
        where = f"profile {source}: {section}.{key}"
        if key not in fields:
            raise ConfigError(f"{where} is not a known key; allowed: {', '.join(fields)}.")
        default = (
            fields[key].default
            if fields[key].default is not dataclasses.MISSING
            else fields[key].default_factory()
        )
        values[key] = _value(value, default, where, env)
        allowed = _CHOICES.get((section, key))
        if allowed and values[key] not in allowed:
            raise ConfigError(f"{where} = {value!r} is not allowed; use one of {allowed}.")
        low_high = _BOUNDS.get((section, key))
        if low_high and not low_high[0] <= values[key] <= low_high[1]:
            raise ConfigError(f"{where} = {value!r} must be from {low_high[0]} to {low_high[1]}.")
    return values


def _value(value, default, where: str, env: dict[str, str]):
    """`value` checked against the type of the field's default, with `${VAR}` expanded."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} = {value!r} must be true or false.")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} = {value!r} must be an integer.")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where} = {value!r} must be a string.")
        return _expand(value, env, where)
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} = {value!r} must be a list of strings.")
        return tuple(_expand(v, env, where) for v in value)
    if isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f'{where} must be a table of strings (KEY = "value").')
        return {k: _expand(v, env, where) for k, v in value.items()}
    raise AssertionError(f"no rule for {where}")  # pragma: no cover — schema bug


def folders(profile: Profile) -> tuple[Path, Path]:
    """(runs, data) folders under `profile`: `HPCLAB_RUNS`/`HPCLAB_DATA`, else its `paths`, else
    the checkout's or the user's own (hpclab.records.paths.folder)."""
    from hpclab.records import paths

    return paths.folder("runs", profile.paths.runs), paths.folder("data", profile.paths.data)


def describe(profile: Profile) -> str:
    """A readable TOML-like rendering of a resolved profile (for `hpclab profiles NAME`)."""
    lines = [f"# {profile.name}: {profile.description}".rstrip(": "), f"# from {profile.source}"]
    for section in _SECTIONS:
        lines.append(f"[{section}]")
        for key, value in dataclasses.asdict(getattr(profile, section)).items():
            shown = list(value) if isinstance(value, tuple) else value
            lines.append(f"{key} = {shown!r}")
    return "\n".join(lines)


__all__ = [
    "Profile",
    "BUILTIN",
    "resolve",
    "load",
    "parse",
    "available",
    "describe",
    "folders",
    "check_login_node",
]
