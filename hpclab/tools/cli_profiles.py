"""``hpclab profiles``: the cluster profiles there are, one in detail, and what to paste elsewhere.

``hpclab profiles`` lists every profile that resolves by name and marks the one a Lab would use
now, and why. ``hpclab profiles NAME [--workers N] [--threads-per-worker T] [--nodes K]`` shows
the resolved profile and its launch plan (an srun profile outside an allocation: as inside one);
``--hub-snippet`` prints a JupyterHub choice (hpclab.tools.hub_snippet) for a job of that
shape, ``--job-script -- run ...`` an ``sbatch`` script running one ``hpclab run``/``sweep``
(clusters.md §1.3). The texts come from pure functions (:func:`listing`, :func:`plan_summary`,
:func:`hub_snippet`, :func:`job_script`); only :func:`run` looks at the host and environment.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from hpclab.cluster import profiles, site_mpi
from hpclab.cluster.lab_args import cpus_for
from hpclab.cluster.launch import LaunchPlan
from hpclab.cluster.profiles import Profile
from hpclab.core.errors import ConfigError
from hpclab.records import paths
from hpclab.tools import job_chain
from hpclab.tools.cli_run import positive_int
from hpclab.tools.hub_snippet import engine_memory, hub_snippet, job_threads

DEFAULT_WORKERS = 2
FAKE_JOB_ID = "JOBID"
#: Commands a batch job may run (they start a Lab and take --workers).
JOB_COMMANDS = ("run", "sweep")


class _Options(argparse.ArgumentParser):
    """Parses the options that follow NAME (argparse hands them over unparsed, see `configure`);
    a mistake is a ConfigError sentence (exit 2 through `cli.main`)."""

    def error(self, message):
        raise ConfigError(f"{message} (see `hpclab profiles --help`).")


_OPTIONS = {  # option -> (metavar: a count; None: a flag, one of the two outputs), help
    "--workers": ("N", f"engines the plan, snippet or job is for (default {DEFAULT_WORKERS})"),
    "--threads-per-worker": (
        "T",
        "threads per engine (default 1, 2 on GPU nodes; node.threads_per_worker wins)",
    ),
    "--nodes": ("K", "spread the engines over K nodes (default: as Slurm places them)"),
    "--engine-mib": ("MIB", "--hub-snippet: MiB per engine at start (default: the newest run's)"),
    "--hub-snippet": (None, "print a JupyterHub (ProfilesSpawner) choice for a job of this shape"),
    "--job-script": (None, "print an sbatch script that runs `hpclab COMMAND ...` given after --"),
}


def _add_options(parser: argparse.ArgumentParser) -> None:
    outputs = parser.add_mutually_exclusive_group()
    for flag, (metavar, text) in _OPTIONS.items():
        if metavar:
            parser.add_argument(flag, type=positive_int, metavar=metavar, help=text)
        else:
            outputs.add_argument(flag, action="store_true", help=text)


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``hpclab profiles``. argparse (3.11) cannot take options after a positional and
    then a `--` tail, so everything after NAME arrives in `rest` and :func:`run` parses it."""
    parser.usage = (
        "hpclab profiles [NAME] [--workers N] [--threads-per-worker T] [--nodes K] "
        "[--hub-snippet [--engine-mib MIB] | --job-script -- COMMAND ...]"
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="a profile name or TOML path")
    _add_options(parser)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def _parse_rest(args: argparse.Namespace) -> list[str]:
    """Merge the options that followed NAME into `args`; return the command after `--`."""
    rest = list(args.rest or [])
    command: list[str] = []
    if "--" in rest:
        cut = rest.index("--")
        rest, command = rest[:cut], rest[cut + 1 :]
    elif rest and not rest[0].startswith("-"):  # argparse drops a `--` right after NAME
        rest, command = [], rest
    inner = _Options(prog="hpclab profiles", add_help=False)
    _add_options(inner)
    given = inner.parse_args(rest)
    for key, value in vars(given).items():
        if value not in (None, False):
            setattr(args, key, value)
    if command and not args.job_script:
        raise ConfigError(
            f"a command after `--` ({shlex.join(command)}) is only used with --job-script."
        )
    return command


def listing(found: dict[str, str], current: Profile | None, how: str, descriptions: dict) -> str:
    """The table of `hpclab profiles`: name, where from, description; `*` marks `current`."""
    rows = dict(found)
    mark = _row_of(current, found) if current is not None else None
    if current is not None and mark is None:  # e.g. HPCLAB_PROFILE=/a/file.toml
        mark = current.name if current.name not in rows else f"{current.name}({current.source})"
        rows[mark], descriptions = current.source, {**descriptions, mark: current.description}
    width = max(len(n) for n in rows)
    wsrc = max(len(s) for s in rows.values())
    lines = []
    for name, source in rows.items():
        star = "*" if name == mark else " "
        lines.append(f"{star} {name:<{width}}  {source:<{wsrc}}  {descriptions.get(name, '')}")
    if current is not None:
        lines.append(f"\n* used now: {current.name} ({how})")
    return "\n".join(line.rstrip() for line in lines)


def _row_of(profile: Profile, found: dict[str, str]) -> str | None:
    for name, source in found.items():
        if source == profile.source and (source != "built-in" or name == profile.name):
            return name
    return None


def _controller(plan: LaunchPlan) -> str:
    if not plan.controller_ip:
        return "127.0.0.1 (engines on this node only)"
    if plan.controller_ip == "*":
        return "every interface, advertised as this host's name"
    return plan.controller_ip


def plan_summary(plan: LaunchPlan, engine_cmd: str, extra_notes: tuple[str, ...] = ()) -> str:
    """What `hpclab profiles NAME` shows of a launch plan; `engine_cmd` stands for the engines'
    program (ipyparallel adds its arguments)."""
    shape = f"{plan.workers} worker(s) x {plan.threads} thread(s)"
    shape += f" on {plan.nodes} node(s)" if plan.nodes else ""
    lines = [f"launch plan for {shape}:", f"  {'mode':<14}{plan.mode}"]
    if plan.mode in ("mpiexec", "srun"):
        launch = shlex.join([*plan.launch_cmd, "-n", str(plan.workers), *plan.launch_args])
        lines.append(f"  {plan.mode:<14}{launch} {engine_cmd}")
    lines.append(f"  {'controller':<14}{_controller(plan)}")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.engine_env.items())
    lines.append(f"  {'engine env':<14}{env}")
    lines.append(f"  {'state':<14}{plan.state_dir}")
    timeouts = f"registration {plan.registration_timeout_s:g} s"
    timeouts += f", queue {plan.queue_timeout_s:g} s" if plan.mode == "sbatch" else ""
    lines.append(f"  {'timeouts':<14}{timeouts}")
    lines += [f"  {'note':<14}{note}" for note in (*plan.notes, *extra_notes)]
    if plan.mode == "sbatch":
        submit = shlex.join([*plan.submit_command, plan.batch_file])
        lines.append(f"  {'submit':<14}{submit}, this script:")
        script = plan.batch_script.format(program_and_args=engine_cmd, output_file=plan.output_file)
        lines += ["    " + line for line in script.splitlines()]
    return "\n".join(lines)


def _option(argv: list[str], name: str) -> str | None:
    """The value of `--name V` / `--name=V` in `argv` (the last one, as argparse takes it)."""
    value = None
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def _sized(argv: list[str], option: str, given: int | None, default: int) -> tuple[int, bool]:
    """(the job's value of `option`, whether the command lacks it): the command's own value
    (largest of a comma list: a sweep's job is sized for its biggest point), else `given`."""
    text = _option(argv, option)
    if text is None:
        return (given if given is not None else default), True
    try:
        value = max(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"the command's {option} {text!r} is not a list of integers.") from None
    if given is not None and given != value:
        raise ConfigError(
            f"{option} is {given} for the job but {text} for the command; give it once."
        )
    return value, False


def job_script(
    profile: Profile,
    workers: int | None,
    threads: int | None,
    argv: list[str],
    *,
    nodes: int | None = None,
    selector: str = "",
    python: str = sys.executable,
) -> str:
    """The sbatch script of mode (c): `hpclab <argv>` once, in the batch step, under `exec` so
    Slurm's signals reach Python (USR1 120 s before the time limit stops the run and keeps its
    record); engines start inside the job by srun. Never `srun hpclab`: that starts N clients.
    A command that checkpoints runs in the background instead, and a stop at the time-limit
    warning submits the follow-up job that resumes it (:mod:`hpclab.tools.job_chain`)."""
    argv = list(argv)
    if not argv or argv[0] not in JOB_COMMANDS:
        raise ConfigError(
            "--job-script needs the hpclab command after `--`, one of "
            f"{', '.join(JOB_COMMANDS)} (e.g. `-- run --epochs 5`); you gave {shlex.join(argv) or 'none'}."
        )
    if profile.launch.mode == "sbatch":
        raise ConfigError(
            f"profile {profile.name!r} submits its engines with sbatch, which inside a batch job "
            "would queue a second job; use a profile with launch.mode = 'auto' or 'srun' for jobs."
        )
    n, add_n = _sized(argv, "--workers", workers, DEFAULT_WORKERS)
    t, add_t = _sized(argv, "--threads-per-worker", threads, 0)
    k, add_k = _sized(argv, "--nodes", nodes, 0)
    t = job_threads(profile, n, t or None)
    added = (["--workers", str(n)] if add_n else []) + (["--nodes", str(k)] if add_k and k else [])
    added += ["--threads-per-worker", str(t)] if add_t else []
    s = profile.slurm
    directives = [f"--job-name=hpclab-{argv[0]}", f"--ntasks={n}", f"--cpus-per-task={t}"]
    directives += [f"--nodes={k}"] if k else []
    for key in ("partition", "account", "qos", "time"):
        if getattr(s, key):
            directives.append(f"--{key}={getattr(s, key)}")
    if profile.node.gpus:
        per_task = profile.node.gpu_binding == "per_task"
        directives.append(
            "--gpus-per-task=1" if per_task else f"--gpus-per-node={profile.node.gpus}"
        )
    directives += [*s.extra_sbatch, "--signal=B:USR1@120", "--output=hpclab-%j.out"]
    cut = argv.index("--") if "--" in argv else len(argv)  # options go before a `--` in it
    command = [python, "-m", "hpclab.tools.cli", *argv[:cut], *added, *argv[cut:]]
    lines = [
        "#!/bin/bash",
        f"# `hpclab {argv[0]}` as a batch job (profile {profile.name}); submit with: sbatch FILE",
        *(f"#SBATCH {d}" for d in directives),
        "set -eo pipefail",
        *profile.environment.setup,
        f"export HPCLAB_PROFILE={shlex.quote(selector or profile.name)}",
    ]
    if job_chain.checkpoints_on(argv):  # a follow-up job resumes it after the time limit
        return "\n".join([*lines, *job_chain.resumable_lines(command, python)])
    lines += [
        "# exec: SIGUSR1 (the time-limit warning) and scancel's SIGTERM reach hpclab, which stops",
        "# the run as for Ctrl-C and keeps its record; hpclab starts its engines with srun.",
        "# With --checkpoint-every or --checkpoint-minutes the script resumes itself instead.",
        f"exec {shlex.join(command)}",
    ]
    return "\n".join(lines)


def _descriptions(found: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    out = {}
    for name in found:
        try:
            out[name] = profiles.load(name, env).description
        except ConfigError as exc:
            out[name] = f"(does not load: {exc})"
    return out


def _show_list() -> int:
    env = dict(os.environ)
    found = profiles.available(env)
    try:
        current, how = profiles.resolve(None, env)
    except ConfigError as exc:
        print(listing(found, None, "", _descriptions(found, env)))
        raise ConfigError(
            f"HPCLAB_PROFILE={env.get('HPCLAB_PROFILE')!r} does not resolve: {exc}"
        ) from None
    print(listing(found, current, how, _descriptions(found, env)))
    folders = ", ".join(str(p) for p in profiles.search_path(env))
    print(f"  searched, first match wins: {folders}")
    return 0


def _selector(name: str, profile: Profile) -> str:
    """What HPCLAB_PROFILE should say in a job: the name, or the file's absolute path."""
    if name.endswith(".toml") or os.sep in name:
        return os.path.abspath(profile.source)
    return name


def _plan(profile: Profile, workers: int, threads: int, nodes: int) -> tuple[LaunchPlan, list]:
    """The plan a Lab would make here (an srun plan outside an allocation: as if inside one)."""
    from hpclab.cluster import host
    from hpclab.cluster.launch import plan_launch
    from hpclab.core.engine_settings import EngineSettings
    from hpclab.core.errors import LabError

    env, notes = dict(os.environ), []
    mode = profile.launch.mode
    if mode == "srun" and not env.get("SLURM_JOB_ID"):
        env["SLURM_JOB_ID"] = FAKE_JOB_ID
        notes.append(
            f"shown as inside an allocation (SLURM_JOB_ID={FAKE_JOB_ID}): srun needs one, so "
            "start the kernel in salloc, sbatch or a JupyterHub job"
        )
    elif mode == "auto" and not env.get("SLURM_JOB_ID"):
        notes.append("inside a Slurm allocation this profile starts the engines with srun")
    mpiexec = ""
    local = mode == "mpiexec" or (mode == "auto" and not env.get("SLURM_JOB_ID"))
    if local:
        try:
            mpiexec = host.find_mpiexec(profile.launch.mpiexec or None)
        except LabError as exc:
            mpiexec = "mpiexec"
            notes.append(str(exc))
    addresses = {}
    if profile.network.interface:
        addresses = host.interfaces()
        if profile.network.interface not in addresses:
            addresses[profile.network.interface] = f"<{profile.network.interface} address>"
            notes.append(f"{profile.network.interface} has no IPv4 address on this host")
    runs, _ = profiles.folders(profile)
    plan = plan_launch(
        profile,
        workers,
        threads,
        nodes,
        env,
        cluster_id="ID",
        state_root=str(paths.state_root(runs, profile.paths.state)),
        mpiexec=mpiexec,
        interfaces=addresses,
        horovod=EngineSettings().env(),  # a Lab's defaults
        **site_mpi.plan_facts(profile.slurm.srun_mpi, local, profile.launch.python),
    )
    return plan, notes


def run(args: argparse.Namespace) -> int:
    """``hpclab profiles``: list, show one (with its plan), or print a hub snippet / job script."""
    command = _parse_rest(args)
    if args.name is None:
        if args.hub_snippet or args.job_script:
            raise ConfigError("--hub-snippet and --job-script need a profile NAME.")
        return _show_list()
    profile = profiles.load(args.name)
    selector = _selector(args.name, profile)
    workers, threads = args.workers, args.threads_per_worker
    if args.hub_snippet:
        if args.engine_mib:
            mib, source = args.engine_mib, "--engine-mib"
        else:
            mib, source = engine_memory(profiles.folders(profile)[0], gpu=profile.node.gpus > 0)
        print(hub_snippet(profile, workers or DEFAULT_WORKERS, threads, selector, mib, source))
    elif args.job_script:
        print(job_script(profile, workers, threads, command, nodes=args.nodes, selector=selector))
    else:
        n = workers or DEFAULT_WORKERS
        mode = profile.launch.mode
        if mode == "auto":
            mode = "srun" if os.environ.get("SLURM_JOB_ID") else "mpiexec"
        cpus = cpus_for(mode, dict(os.environ), os.cpu_count())
        _show_one(profile, n, job_threads(profile, n, threads, cpus), args.nodes or 0)
    return 0


def _show_one(profile: Profile, workers: int, threads: int, nodes: int) -> None:
    print(profiles.describe(profile) + "\n")
    plan, notes = _plan(profile, workers, threads, nodes)
    engine = shlex.join(plan.engine_cmd or (sys.executable, "-m", "ipyparallel.engine"))
    print(plan_summary(plan, engine, tuple(notes)))


__all__ = ["configure", "run", "listing", "plan_summary", "hub_snippet", "job_script"]
