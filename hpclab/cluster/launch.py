"""How engines are launched: one pure function decides, `hpclab.cluster.engines` executes.

`plan_launch(profile, workers, threads, nodes, env, ...)` returns a :class:`LaunchPlan`: the mode,
the ipyparallel settings, the engines' environment, the `srun` arguments or the `sbatch` script,
the controller's address, the state folder and the timeouts. It does no I/O (the caller passes in
what it looked up: `mpiexec`'s path, interface addresses, the host name), so every mode is
unit-tested without Slurm. Three modes:

- ``mpiexec``: engines under the `mpiexec` Horovod was built against, on this machine.
- ``srun`` (inside an allocation: salloc, sbatch, a JupyterHub job): ipyparallel's MPI launcher
  with ``srun --mpi=<plugin> -c T --cpu-bind=cores --kill-on-bad-exit=1 -I<s>`` as its command.
  The plugin is always explicit: Slurm's default ``MpiDefault=none`` would make every engine a
  1-rank MPI world (slurm.conf(5), MpiDefault); the profile names it, or under ``auto`` it
  follows the MPI Horovod was built with and the site's MpiDefault (hpclab.cluster.site_mpi).
  ``-c`` is explicit because srun no longer
  inherits ``--cpus-per-task`` from the allocation (Slurm 22.05, srun(1)); ``--overlap`` is added
  when the kernel itself runs in a job step (batchspawner starts JupyterLab with ``srun``, and that
  step holds the allocation's CPUs, srun(1) ``--overlap``).
- ``sbatch`` (from a login node): engines as a batch job through ipyparallel's
  `SlurmEngineSetLauncher` with hpclab's own script; the controller stays beside the client and
  binds an address compute nodes reach; the queue wait is its own phase with its own timeout.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hpclab.cluster.gpu_env import dropped_note, inherited_gpu_vars, unset_prefix
from hpclab.cluster.profiles import Profile
from hpclab.cluster.site_mpi import default_srun_mpi
from hpclab.core.errors import ConfigError, LabError

# The controller's heartbeat (ipyparallel's HeartMonitor.period, 3000 ms by default): a new engine
# is ready at the first beat after it registers, and one that misses 10 beats is declared dead.
HEARTBEAT_MS = 1000
LOCAL_REGISTRATION_S = 90  # mode mpiexec: engines on this machine register within this
LOOPBACK = "lo" if sys.platform.startswith("linux") else ""  # the loopback interface's name
#: A local lab's MPI layer listens on loopback only (else on the host's external address, open
#: to every host that reaches it): MPICH's ch4 netmods are UCX (UCX_NET_DEVICES, UCX's
#: configuration) and libfabric (FI_TCP_IFACE and FI_SOCKETS_IFACE, fi_tcp(7), fi_sockets(7));
#: ranks on one host talk through shared memory either way. Hydra's own control port cannot
#: follow: it binds every interface whatever the options (`-iface` and `-localhost` only change
#: the address it advertises; HYDU_sock_listen in MPICH's src/pm/hydra/lib/utils/sock.c).
LOCAL_NETWORK = ("UCX_NET_DEVICES", "FI_TCP_IFACE", "FI_SOCKETS_IFACE")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `hpclab.cluster.engines.EngineSet` needs to start, watch and stop one engine set."""

    mode: str  # mpiexec | srun | sbatch
    profile: str
    workers: int
    threads: int
    nodes: int  # 0: wherever the launcher puts them
    cluster_id: str
    state_dir: str  # private ipyparallel profile folder (0700): logs, batch script
    engine_env: dict[str, str]
    launch_cmd: tuple[str, ...] = ()  # mpiexec / srun (modes mpiexec, srun)
    launch_args: tuple[str, ...] = ()  # what follows `-n N`
    engine_cmd: tuple[str, ...] = ()  # empty: ipyparallel's default (this Python)
    batch_script: str = ""  # mode sbatch: ipyparallel template ({program_and_args} left in)
    submit_command: tuple[str, ...] = ()
    ports: str = ""  # profile network.ports: engine ports come from this range (cluster/ports.py)
    controller_ip: str = ""  # empty: ipyparallel's default (127.0.0.1)
    controller_location: str = ""
    controller_args: tuple[str, ...] = ()
    job_name: str = ""  # Slurm step/job name, used to find and cancel it
    srun_mpi: str = ""  # modes srun, sbatch: the srun --mpi= plugin
    env_unset: tuple[str, ...] = ()  # inherited variables the launch command starts without
    registration_timeout_s: float = LOCAL_REGISTRATION_S
    queue_timeout_s: float = 0.0  # mode sbatch only
    notes: tuple[str, ...] = field(default=())  # why the plan looks like this, one line each

    @property
    def output_file(self) -> str:
        """The engines' job log (mode sbatch; under mpiexec/srun ipyparallel names the file in
        state_dir/log itself)."""
        return str(Path(self.state_dir) / "engines.log")

    @property
    def batch_file(self) -> str:
        return str(Path(self.state_dir) / "engines.sbatch")

    def record(self) -> dict:
        """What a run's config.json keeps about how its engines were launched."""
        out = {
            "mode": self.mode,
            "profile": self.profile,
            "nodes": self.nodes,
            "job_name": self.job_name,
        }
        if self.mode == "srun":
            out["srun"] = shlex.join([*self.launch_cmd, "-n", str(self.workers), *self.launch_args])
        if self.mode == "sbatch":
            out["batch_file"] = self.batch_file
        if self.controller_ip:
            out["controller_ip"] = self.controller_ip
        if self.ports:
            out["ports"] = self.ports
        if self.env_unset:
            out["env_unset"] = list(self.env_unset)
        return out

    def ipp_config(self):
        """The traitlets Config for `ipyparallel.Cluster` (imported here: ipyparallel is heavy)."""
        from traitlets.config import Config

        c = Config()
        c.EngineLauncher.environment = dict(self.engine_env)
        c.EngineLauncher.engine_args = ["--timeout=30"]  # ipyparallel's 5 s is short on busy nodes
        if self.engine_cmd:
            c.EngineLauncher.engine_cmd = list(self.engine_cmd)
        unset = unset_prefix(self.env_unset)  # hpclab.cluster.gpu_env
        if self.mode in ("mpiexec", "srun"):
            c.MPILauncher.mpi_cmd = [*unset, *self.launch_cmd]
            c.MPILauncher.mpi_args = list(self.launch_args)
        else:
            c.SlurmEngineSetLauncher.batch_template = self.batch_script
            c.SlurmEngineSetLauncher.batch_file_name = self.batch_file  # absolute: joins to itself
            c.SlurmEngineSetLauncher.output_file = self.output_file
            c.SlurmEngineSetLauncher.submit_command = [*unset, *self.submit_command]
            # --parsable prints "jobid[;cluster]"; anchor so a warning's number is never taken
            c.SlurmEngineSetLauncher.job_id_regexp = r"^(\d+)"
            c.SlurmEngineSetLauncher.job_id_regexp_group = 1
            c.EngineLauncher.engine_args = ["--mpi", "--timeout=30"]  # batch sets add no --mpi
        return c

    def cluster_kwargs(self, engine_ports: list[int] = ()) -> dict:
        """Keyword arguments for `ipyparallel.Cluster` besides `config`; `engine_ports`: the
        ports reserved in `self.ports` for this controller (`hpclab.cluster.ports.reserved`)."""
        from hpclab.cluster.ports import controller_arg

        kwargs = {
            "engines": "mpi" if self.mode in ("mpiexec", "srun") else "slurm",
            "n": self.workers,
            "cluster_id": self.cluster_id,
            "profile_dir": self.state_dir,
            "load_profile": False,  # never the user's ~/.ipython ipcluster_config.py
            "engine_timeout": int(self.registration_timeout_s),
            "delay": 0,  # engines get the connection info from the controller, no wait needed
            "controller_args": [
                f"--ping={HEARTBEAT_MS}",
                *self.controller_args,
                *controller_arg(list(engine_ports)),
            ],
        }
        if self.controller_ip:
            kwargs["controller_ip"] = self.controller_ip
        if self.controller_location:
            kwargs["controller_location"] = self.controller_location
        return kwargs


def cpus_in_allocation(env: dict[str, str]) -> int | None:
    """Total CPUs of the allocation from SLURM_JOB_CPUS_PER_NODE ("4(x2),2" -> 10), or None."""
    spec = env.get("SLURM_JOB_CPUS_PER_NODE", "")
    if not spec:
        return None
    total = 0
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return None
        total += int(match.group(1)) * int(match.group(2) or 1)
    return total


def _mode(profile: Profile, env: dict[str, str]) -> str:
    mode = profile.launch.mode
    if mode != "auto":
        return mode
    return "srun" if env.get("SLURM_JOB_ID") else "mpiexec"


def _controller(profile, mode, nodes, env, interfaces, notes) -> tuple[str, str]:
    """(bind ip, advertised location). Loopback unless engines may run on another node."""
    net = profile.network
    if net.controller_ip:
        return net.controller_ip, net.controller_ip
    multi = mode == "sbatch" or nodes > 1 or int(env.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1
    if not multi:
        return "", ""
    if net.interface:
        ip = interfaces.get(net.interface)
        if not ip:
            raise ConfigError(
                f"profile {profile.source}: network.interface = {net.interface!r} has no IPv4 "
                f"address on this host; interfaces with one: {', '.join(sorted(interfaces)) or 'none'}."
            )
        notes.append(f"controller binds {net.interface} ({ip}): engines may run on other nodes")
        return ip, ip
    notes.append(
        "controller binds every interface and advertises this host's name (set "
        "network.interface in the profile to choose the network compute nodes use)"
    )
    return "*", ""


def _slurm_shape(profile: Profile, workers: int, threads: int, nodes: int) -> list[str]:
    """srun/sbatch options for the task shape: nodes, tasks per node, GPUs."""
    args = []
    if nodes:
        args += [f"--nodes={nodes}", f"--ntasks-per-node={workers // nodes}"]
    if profile.node.gpus:
        if profile.node.gpu_binding == "per_task":
            args.append("--gpus-per-task=1")
        else:  # each rank sees the node's GPUs and pins gpus[local_rank] (rank/engine.py)
            args += [f"--gpus-per-node={profile.node.gpus}", "--gpu-bind=none"]
    return args


def plan_launch(
    profile: Profile,
    workers: int,
    threads: int,
    nodes: int,
    env: dict[str, str],
    *,
    cluster_id: str,
    state_root: str,
    mpiexec: str = "",
    interfaces: dict[str, str] | None = None,
    registration_timeout_s: float | None = None,
    horovod: dict[str, str] | None = None,
    mpi_flavour: str = "",
    site_mpi_default: str = "",
) -> LaunchPlan:
    """Decide how `workers` engines with `threads` threads each start under `profile`.

    `env` is the client's environment (Slurm's variables decide the mode under `auto`);
    `mpiexec` the resolved launcher for mode mpiexec; `interfaces` maps interface name -> IPv4;
    `state_root` the folder under which this lab's private state folder is planned;
    `mpi_flavour` (the MPI Horovod was built with) and `site_mpi_default` (the site's
    MpiDefault) choose the srun plugin when the profile says ``srun_mpi = "auto"``."""
    interfaces = interfaces or {}
    threads = profile.node.threads_per_worker or threads
    mode = _mode(profile, env)
    notes: list[str] = []
    if nodes and workers % nodes:
        raise ConfigError(
            f"Lab.nodes={nodes} does not divide workers={workers}; use a number of workers "
            f"that is a multiple of the nodes (one engine count per node)."
        )
    if mode == "srun" and not env.get("SLURM_JOB_ID"):
        raise ConfigError(
            f"profile {profile.name!r} launches engines with srun, which needs a Slurm "
            "allocation (SLURM_JOB_ID is not set); start the kernel inside one (salloc, sbatch, "
            "a JupyterHub job) or use a profile with launch.mode = 'sbatch'."
        )
    local_only = mode == "mpiexec" and nodes <= 1 and not profile.network.interface
    engine_env = {
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        **(dict.fromkeys(LOCAL_NETWORK, LOOPBACK) if local_only and LOOPBACK else {}),
        **(horovod or {}),
        **profile.environment.vars,  # a profile's own network settings win
    }
    if profile.node.gpus and profile.node.gpu_binding == "per_task" and mode != "mpiexec":
        # the value of the engines' own --gpus-per-task=1, for srun (which reads it as that
        # option) and for the ranks (hpclab.core.devices.pick_gpu reads it as the binding)
        engine_env.setdefault("SLURM_GPUS_PER_TASK", "1")
    env_unset = inherited_gpu_vars(env, mode, keep=engine_env)
    if env_unset:
        notes.append(dropped_note(env, env_unset))
    job_name = f"hpclab-{cluster_id}"
    engine_cmd = ()
    if profile.launch.engine_prefix or profile.launch.python:
        python = profile.launch.python or sys.executable
        engine_cmd = (*profile.launch.engine_prefix, python, "-m", "ipyparallel.engine")
    ip, location = _controller(profile, mode, nodes, env, interfaces, notes)
    common = dict(
        profile=profile.name,
        workers=workers,
        threads=threads,
        nodes=nodes,
        cluster_id=cluster_id,
        state_dir=str(Path(state_root) / f"ipp-{cluster_id}"),
        engine_env=engine_env,
        engine_cmd=engine_cmd,
        controller_ip=ip,
        controller_location=location,
        ports=profile.network.ports,
        job_name=job_name,
        env_unset=env_unset,
    )
    slurm = profile.slurm
    if mode == "mpiexec":
        if not mpiexec:
            raise LabError("plan_launch needs the resolved mpiexec for mode 'mpiexec'.")
        return LaunchPlan(
            mode=mode,
            launch_cmd=(mpiexec,),
            launch_args=tuple(profile.launch.mpiexec_args),
            registration_timeout_s=registration_timeout_s or LOCAL_REGISTRATION_S,
            notes=tuple(notes),
            **common,
        )
    plugin = slurm.srun_mpi
    if plugin == "auto":
        plugin, why = default_srun_mpi(mpi_flavour, site_mpi_default)
        notes.append(f"srun --mpi={plugin}: {why}")
    common["srun_mpi"] = plugin
    srun = [
        f"--mpi={plugin}",
        f"--cpus-per-task={threads}",
        "--cpu-bind=cores",
        "--kill-on-bad-exit=1",
        # srun inherits SLURM_EXPORT_ENV from `sbatch --export=...` (batchspawner's job exports a
        # list of variables): then the engines would never see IPP_CONNECTION_INFO
        "--export=ALL",
    ]
    if mode == "srun":
        total = cpus_in_allocation(env)
        if total is not None and workers * threads > total:
            raise ConfigError(
                f"{workers} workers x {threads} threads need {workers * threads} CPUs, but this "
                f"allocation has {total} (SLURM_JOB_CPUS_PER_NODE={env['SLURM_JOB_CPUS_PER_NODE']}); "
                f"use at most {max(1, total // threads)} workers or fewer threads per worker."
            )
        srun += [f"--immediate={slurm.step_wait_s}", f"--job-name={job_name}"]
        if env.get("SLURM_STEP_ID") is not None and slurm.overlap_inside_step:
            srun.append("--overlap")
            notes.append(
                f"--overlap: this kernel runs in job step {env.get('SLURM_JOB_ID')}."
                f"{env['SLURM_STEP_ID']}, which holds the allocation's CPUs"
            )
        srun += _slurm_shape(profile, workers, threads, nodes) + list(slurm.srun_extra)
        return LaunchPlan(
            mode=mode,
            launch_cmd=("srun",),
            launch_args=tuple(srun),
            registration_timeout_s=registration_timeout_s or slurm.registration_timeout_s,
            notes=tuple(notes),
            **common,
        )
    if mode == "sbatch":
        return LaunchPlan(
            mode=mode,
            batch_script=batch_script(profile, workers, threads, nodes, job_name, srun),
            submit_command=("sbatch", "--parsable", "--export=ALL"),
            registration_timeout_s=registration_timeout_s or slurm.registration_timeout_s,
            queue_timeout_s=slurm.queue_timeout_s,
            notes=tuple(notes),
            **common,
        )
    raise ConfigError(f"launch.mode {mode!r} is not one of mpiexec, srun, sbatch.")


def _braces(text: str) -> str:
    """Escape text for ipyparallel's EvalFormatter (literal `{` and `}` are doubled)."""
    return text.replace("{", "{{").replace("}", "}}")


def batch_script(profile, workers, threads, nodes, job_name, srun) -> str:
    """The engines' job script (mode sbatch). Profile values are rendered here and empty options
    left out (an empty `--account=` makes sbatch fail); only `{program_and_args}` and
    `{output_file}` are left for ipyparallel to fill."""
    s = profile.slurm
    directives = [
        f"--job-name={job_name}",
        f"--ntasks={workers}",
        f"--cpus-per-task={threads}",
        "--output={output_file}",
        *(
            f"--{key}={value}"
            for key, value in (
                ("partition", s.partition),
                ("account", s.account),
                ("qos", s.qos),
                ("time", s.time),
            )
            if value
        ),
        *_slurm_shape(profile, workers, threads, nodes),
        *s.extra_sbatch,
    ]
    lines = ["#!/bin/bash"]
    lines += ["#SBATCH " + (d if d == "--output={output_file}" else _braces(d)) for d in directives]
    lines += ["set -eo pipefail"]
    lines += [_braces(line) for line in profile.environment.setup]
    lines += [f"export OMP_NUM_THREADS={threads}"]
    lines += [
        "exec srun " + _braces(shlex.join([*srun, *s.srun_extra])) + " {program_and_args}",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["LaunchPlan", "plan_launch", "HEARTBEAT_MS"]
