"""`hpclab doctor --profile X`: does a cluster profile work on this cluster?

One line per check, each `ok`, `FAILED` (with one sentence naming the fix) or `skipped`:

* the launcher the profile's mode needs: `mpiexec`, or `srun` (and `sbatch` for mode sbatch);
* `srun --mpi=list` offers `slurm.srun_mpi` (without the right plugin N engines would form N
  1-rank worlds);
* mode sbatch: `sbatch --test-only` accepts the profile's partition, account, qos and time;
* `network.interface` has an IPv4 address here (`network.controller_ip` is one of this host's);
* the runs and state folders exist, or can be created, and are writable;
* unless ``--quick``: a real 2-rank Horovod allreduce through the profile's launch plan
  (`Lab(workers=2, profile=X)`), expecting 1 + 2 = 3 on every rank: `check_allreduce`, the
  same check plain `hpclab doctor` runs. An srun profile outside an
  allocation skips it and says how to run it inside one (`salloc -n2 ...`).

Any failure: exit 1, the sentences repeated on stderr. Imports no TensorFlow on this side.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpclab.cluster import host, profiles
from hpclab.cluster.profiles import Profile
from hpclab.core.errors import ConfigError, LabError
from hpclab.records import paths

WORKERS = 2
COMMAND_TIMEOUT_S = 30


@dataclass(frozen=True)
class Check:
    """One line of the report; `ok` is True (passed), False (failed) or None (skipped)."""

    label: str
    ok: bool | None
    text: str  # what was found; for a failure, one sentence that names the fix
    details: tuple[tuple[str, str], ...] = ()  # (label, text) rows, e.g. one per rank

    def line(self) -> str:
        status = {True: "ok", False: "FAILED", None: "skipped"}[self.ok]
        return f"  {self.label:<14}{status:<9}{self.text}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--profile`` of ``hpclab doctor`` (``--quick`` and ``--timeout`` are shared)."""
    parser.add_argument(
        "--profile",
        default=None,
        metavar="NAME|FILE",
        help="check a cluster profile against this cluster (launchers, MPI plugin, sbatch "
        "settings, interface, folders) and run the 2-rank allreduce through it",
    )


def mode_of(profile: Profile, env: dict[str, str]) -> str:
    """The launch mode a Lab would use here (`auto`: srun inside an allocation, else mpiexec)."""
    if profile.launch.mode != "auto":
        return profile.launch.mode
    return "srun" if env.get("SLURM_JOB_ID") else "mpiexec"


def _command(args: list[str]) -> tuple[int, str]:
    """(exit status, stdout + stderr) of a bounded command; 127 when it is not on PATH."""
    if shutil.which(args[0]) is None:
        return 127, f"{args[0]} is not on PATH"
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return 124, f"no answer within {COMMAND_TIMEOUT_S} s"
    except OSError as exc:
        return 126, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def mpi_plugins(output: str) -> set[str]:
    """Plugin names in `srun --mpi=list` output: "MPI plugin types are..." then one name per
    (tab-indented) line, and "specific pmix plugin versions available: pmix_v4,pmix_v5"
    (Slurm 22.05+); older versions print "srun: MPI types are..." and "srun: pmi2"."""
    names = set()
    for line in output.splitlines():
        line = line.strip().removeprefix("srun:").strip()
        if "types are" in line or "error" in line.lower():
            continue
        if line.startswith("specific") and ":" in line:
            names.update(v.strip() for v in line.split(":", 1)[1].split(",") if v.strip())
        elif re.fullmatch(r"[\w.-]+", line):
            names.add(line)
    return names


def check_launcher(profile: Profile, mode: str) -> list[Check]:
    """The programs the mode starts engines with are here."""
    if mode == "mpiexec":
        try:
            return [Check("mpiexec", True, host.find_mpiexec(profile.launch.mpiexec or None))]
        except LabError as exc:
            return [Check("mpiexec", False, str(exc))]
    found = []
    for program in ("srun", "sbatch") if mode == "sbatch" else ("srun",):
        path = shutil.which(program)
        found.append(
            Check(program, True, path)
            if path
            else Check(
                program,
                False,
                f"{program} is not on PATH; load the site's Slurm module or run on a node with "
                f"the Slurm client (profile {profile.name!r} starts engines with {mode}).",
            )
        )
    return found


def check_srun_mpi(profile: Profile) -> Check:
    """`srun --mpi=list` offers the profile's `slurm.srun_mpi` (under "auto", the plugin a lab
    would choose: hpclab.cluster.site_mpi)."""
    from hpclab.cluster import site_mpi

    wanted, source = profile.slurm.srun_mpi, f"slurm.srun_mpi in {profile.source}"
    if wanted == "auto":
        facts = site_mpi.plan_facts("auto", False, profile.launch.python)
        wanted, source = site_mpi.default_srun_mpi(**facts)
    status, output = _command(["srun", "--mpi=list"])
    if status != 0:
        last = output.splitlines()[-1] if output else "no output"
        return Check(
            "MPI plugin",
            False,
            f"`srun --mpi=list` failed (exit {status}: {last}); check that the Slurm client "
            "works here (`sinfo`), then run the doctor again.",
        )
    offered = mpi_plugins(output)
    if wanted not in offered:
        usable = ", ".join(sorted(offered - {"none"})) or "none"
        return Check(
            "MPI plugin",
            False,
            f"srun has no MPI plugin {wanted!r} ({source}); it offers "
            f"{usable}: set slurm.srun_mpi to the one your MPI uses (MPICH: pmi2, Open MPI: pmix).",
        )
    return Check("MPI plugin", True, f"{wanted} (srun offers {', '.join(sorted(offered))})")


def sbatch_test_args(profile: Profile) -> list[str]:
    """`sbatch --test-only` with the engines' job shape for 2 ranks and the profile's settings."""
    s, threads = profile.slurm, profile.node.threads_per_worker or 1
    args = ["sbatch", "--test-only", f"--ntasks={WORKERS}", f"--cpus-per-task={threads}"]
    for key in ("partition", "account", "qos", "time"):
        args += [f"--{key}={getattr(s, key)}"] if getattr(s, key) else []
    if profile.node.gpus:
        per_task = profile.node.gpu_binding == "per_task"
        args.append("--gpus-per-task=1" if per_task else f"--gpus-per-node={profile.node.gpus}")
    return [*args, *s.extra_sbatch, "--wrap=true"]


def check_sbatch(profile: Profile) -> Check:
    """Slurm would accept the engines' job (nothing is submitted)."""
    status, output = _command(sbatch_test_args(profile))
    said = " ".join(line.removeprefix("sbatch: ").strip() for line in output.splitlines())
    if status != 0:
        return Check(
            "sbatch test",
            False,
            f"`sbatch --test-only` refused the profile's job ({said or f'exit {status}'}); fix "
            f"slurm.partition, account, qos, time, extra_sbatch or node.gpus in {profile.source}.",
        )
    return Check("sbatch test", True, f"--test-only: {said}")


def check_network(profile: Profile, mode: str, env: dict, addresses: dict[str, str]) -> Check:
    """The controller's address (network.interface / controller_ip) exists on this host."""
    net = profile.network
    elsewhere = mode == "srun" and not env.get("SLURM_JOB_ID")  # the kernel runs in the job
    if net.controller_ip:
        if net.controller_ip in (*addresses.values(), "*", "0.0.0.0"):
            return Check("controller", True, f"network.controller_ip {net.controller_ip}")
        text = (
            f"network.controller_ip = {net.controller_ip!r} is not an address of this host "
            f"({', '.join(sorted(addresses.values())) or 'none'}); fix it in {profile.source}."
        )
        return Check("controller", None if elsewhere else False, text)
    if not net.interface:
        return Check("interface", True, "not set: loopback, or every interface when multi-node")
    if net.interface in addresses:
        return Check("interface", True, f"{net.interface} {addresses[net.interface]}")
    text = (
        f"network.interface = {net.interface!r} has no IPv4 address on this host (interfaces "
        f"with one: {', '.join(sorted(addresses)) or 'none'}); set it in {profile.source}."
    )
    if elsewhere:
        text = f"{net.interface} has none here; checked inside an allocation, where Labs run"
    return Check("interface", None if elsewhere else False, text)


def check_folder(label: str, path: Path, key: str, source: str) -> Check:
    """`path` exists and takes a file, or its nearest existing parent lets it be created."""
    fix = f"set paths.{key} in {source} (or HPCLAB_RUNS) to a folder you can write"
    if path.exists():
        if not path.is_dir():
            return Check(label, False, f"{path} is a file, not a folder; {fix}.")
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".hpclab-doctor-"):
                pass
        except OSError as exc:
            return Check(label, False, f"{path} is not writable ({exc.strerror}); {fix}.")
        return Check(label, True, f"{path} (writable)")
    parent = next(p for p in path.parents if p.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        return Check(label, False, f"{path} does not exist and {parent} is not writable; {fix}.")
    return Check(label, True, f"{path} (created when a Lab starts, under {parent})")


def rank_allreduce() -> dict:
    """Runs on every engine (Horovod initialised by `Lab`): allreduce ``rank + 1``, and say
    which controller Horovod runs."""
    import horovod.tensorflow as hvd

    from hpclab.rank import engine

    result = engine.allreduce_check()
    result["controller"] = (
        "MPI" if hvd.mpi_enabled() else ("Gloo" if hvd.gloo_enabled() else "unknown")
    )
    return result


def check_allreduce(lab, timeout: float) -> Check:
    """The doctors' one engine check (`hpclab doctor`, with or without ``--profile``): on the
    started `lab`, every rank allreduces ``rank + 1`` and must get 1 + 2 + ... + N. `details`
    has one row per rank (pid, host, local rank, controller, the value it got)."""
    n = lab.workers
    expected = float(sum(range(1, n + 1)))
    start = time.perf_counter()
    try:
        probes = lab.apply(rank_allreduce, timeout=timeout)
    except LabError as exc:
        if lab.lost:  # a rank still busy at the timeout, or one that died
            text = (
                f"The allreduce did not finish on every rank within {timeout:g} s; the ranks are "
                "probably not in one MPI job, so run `make setup` again (or give a slow machine "
                "more time with --timeout)."
            )
        else:
            reason = str(exc).rstrip(".")
            text = (
                f"The allreduce failed on the engines ({reason}); run `make setup` to rebuild it."
            )
        return Check("allreduce", False, text)
    seconds = time.perf_counter() - start
    by_rank = {p["rank"]: p for p in probes}
    details = tuple(
        (
            f"rank {info['rank']}/{info['size']}",
            f"pid {info['pid']} on {info['host']}, local rank {info['local_rank']}, controller "
            f"{by_rank.get(info['rank'], {}).get('controller', '?')}: allreduce(sum of rank+1) = "
            f"{by_rank.get(info['rank'], {}).get('value', float('nan')):g}",
        )
        for info in lab.ranks
    )
    if sorted(by_rank) != list(range(n)) or any(r["size"] != n for r in lab.ranks):
        text = (
            f"The engines formed Horovod ranks {sorted(by_rank)} instead of one job of {n}; "
            f"Horovod and {lab.launcher} probably use different MPIs, so run `make setup` again."
        )
        return Check("allreduce", False, text, details)
    values = [by_rank[r]["value"] for r in sorted(by_rank)]
    if any(v != expected for v in values):
        text = (
            f"The allreduce returned {values} instead of {expected:g} on every rank; "
            "Horovod's collectives are broken here, so rebuild it with `make setup`."
        )
        return Check("allreduce", False, text, details)
    text = f"all {n} ranks agree: {expected:g} ({lab.launcher}, {seconds:.1f} s)"
    return Check("allreduce", True, text, details)


def check_profile_allreduce(choice: str, timeout: float) -> Check:
    """`check_allreduce` on 2 engines started through the profile's launch plan."""
    import ipyparallel as ipp

    from hpclab.cluster.lab import Lab

    try:
        lab = Lab(workers=WORKERS, profile=choice, verbose=False)
    except (LabError, ConfigError, ipp.error.EngineError, ipp.error.RemoteError) as exc:
        return Check("allreduce", False, f"the {WORKERS} engines did not start: {exc}")
    with lab:
        return check_allreduce(lab, timeout)


def checks(
    profile: Profile, choice: str, env: dict, quick: bool, timeout: float
) -> Iterator[Check]:
    """Every check for `profile` (given as `choice`), in order; stops nothing on a failure."""
    mode = mode_of(profile, env)
    done = [*check_launcher(profile, mode)]
    yield from done
    if mode in ("srun", "sbatch") and all(c.ok for c in done):
        done.append(check_srun_mpi(profile))
        yield done[-1]
    if mode == "sbatch" and all(c.ok for c in done):
        done.append(check_sbatch(profile))
        yield done[-1]
    net = profile.network
    addresses = host.interfaces() if (net.interface or net.controller_ip) else {}
    done.append(check_network(profile, mode, env, addresses))
    yield done[-1]
    runs, _ = profiles.folders(profile)
    state = paths.state_root(runs, profile.paths.state)
    for label, path, key in (("runs folder", runs, "runs"), ("state folder", state, "state")):
        done.append(check_folder(label, path, key, profile.source))
        yield done[-1]
    if quick:
        yield Check("allreduce", None, "(--quick)")
    elif mode == "srun" and not env.get("SLURM_JOB_ID"):
        inside = f"salloc -n{WORKERS} hpclab doctor --profile {choice}"
        yield Check("allreduce", None, f"srun needs an allocation: run `{inside}`")
    elif any(c.ok is False for c in done):
        yield Check("allreduce", None, "fix the failures above first")
    else:
        print(f"  {'allreduce':<14}starting {WORKERS} engines ({mode}) ...", flush=True)
        yield check_profile_allreduce(choice, timeout)


def run(args: argparse.Namespace) -> int:
    """``hpclab doctor --profile X``: 0 when every check passes (skips allowed), else 1."""
    env = dict(os.environ)
    profile = profiles.load(args.profile, env)  # an unknown or invalid profile: ConfigError
    mode = mode_of(profile, env)
    auto = (
        " (srun inside an allocation)" if profile.launch.mode == "auto" and mode != "srun" else ""
    )
    print(f"Profile {profile.name} ({profile.source}): engines by {mode}{auto}", flush=True)
    start = time.perf_counter()
    results = []
    for check in checks(profile, args.profile, env, args.quick, args.timeout):
        print(check.line(), flush=True)
        for label, text in check.details:
            print(f"  {label:<14}{'':<9}{text}", flush=True)
        results.append(check)
    failed = [c for c in results if c.ok is False]
    for check in failed:
        print(f"hpclab doctor: {check.text}", file=sys.stderr, flush=True)
    if failed:
        return 1
    skipped = sum(c.ok is None for c in results)
    print(
        f"\nhpclab doctor: profile {profile.name} OK ({len(results) - skipped} passed, "
        f"{skipped} skipped) in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    return 0


__all__ = ["Check", "add_arguments", "check_allreduce", "checks", "mode_of", "mpi_plugins", "run"]
