"""The engines' undertaker: a small process that ends a lab whose client died without stopping it.

ipyparallel starts the controller and ``mpiexec`` in sessions of their own, so a client killed by
SIGKILL (an out-of-memory kill, a kernel killed or restarted by its server, ``kill -9``) leaves
them — and every MPI engine, or a queued Slurm job — running, holding cores on a shared login
node or waiting in the queue until someone notices. :class:`hpclab.cluster.engines.EngineSet`
therefore starts this module *before* it starts anything else, in a session of its own too::

    python .../hpclab/cluster/reaper.py CLIENT [PID:START ...] [--lab ID] [--slurm-name NAME]

It owns the lab from its first process on: once a second it finds the lab's processes by the
variable ipyparallel sets in the environment of everything it launches (``IPP_CLUSTER_ID=ID``:
the controller, ``mpiexec`` or ``sbatch``) together with their descendants (Hydra's proxies, the
engines), and remembers each. When the client no longer exists it sends SIGTERM to every lab
process still alive (mpiexec forwards it to the ranks), SIGKILL to what is left after
:data:`GRACE_S`, sweeps once more for a process started meanwhile, cancels the engines' Slurm
job by name (``scancel --name``: a pending job too, even one whose id the client never
learned), and exits. It also exits, doing nothing, once every lab process it saw is gone (the
lab stopped normally). A lab's processes thus outlive a killed client by at most
:data:`BOUND_S`.

A process is named by its pid and its start time in clock ticks since boot (/proc/PID/stat,
field 22, proc(5)): a reused pid never matches, and a clock step (NTP, a resumed VM) changes
nothing, unlike psutil's ``create_time()``, which is recomputed from the wall clock.
psutil only (ipyparallel's own dependency); no hpclab import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

POLL_S = 1.0
GRACE_S = 5.0  # between SIGTERM and SIGKILL
BOUND_S = POLL_S + GRACE_S + 2.0  # a lab's processes outlive a killed client by at most this
LAB_VARIABLE = "IPP_CLUSTER_ID"  # ipyparallel's launchers set it for every process they start


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22), or None.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses,
    so the fields are counted from the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # fields 3, 4, ... of proc(5)
    return int(fields[22 - 3])


def spec(process) -> str:
    """'pid:ticks' naming exactly one process (a psutil.Process or a pid), never a reused pid.
    Without /proc (not Linux): 'pid:wSECONDS', psutil's wall-clock start time (clock steps then
    lose the process)."""
    pid = process if isinstance(process, int) else process.pid
    ticks = start_ticks(pid)
    if ticks is not None:
        return f"{pid}:{ticks}"
    import psutil

    return f"{pid}:w{psutil.Process(pid).create_time():.2f}"


def _same(token: str):
    """The psutil.Process a spec names, or None if that process is gone (or a zombie)."""
    import psutil

    pid, _, started = token.partition(":")
    try:
        p = psutil.Process(int(pid))
        if started.startswith("w"):
            same = abs(p.create_time() - float(started[1:])) <= 0.01
        else:
            same = start_ticks(p.pid) == int(started)
        return p if same and p.status() != psutil.STATUS_ZOMBIE else None
    except (psutil.Error, ValueError):
        return None


def _carriers(lab_id: str) -> list[int]:
    """Pids of this user's processes whose environment holds IPP_CLUSTER_ID=`lab_id`.

    Read from /proc/PID/environ directly (a scan costs a few ms, not psutil's ~50 ms per hundred
    processes); psutil where there is no /proc."""
    import psutil

    me, uid = os.getpid(), os.getuid()
    if not os.path.isdir("/proc/self"):
        return [
            p.pid
            for p in psutil.process_iter()
            if p.pid != me and _environ_of(p).get(LAB_VARIABLE) == lab_id
        ]
    needle = f"\0{LAB_VARIABLE}={lab_id}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    found.append(int(name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _environ_of(process) -> dict:
    import psutil

    try:
        return process.environ()
    except psutil.Error:
        return {}


def lab_processes(lab_id: str) -> dict[str, object]:
    """{spec: psutil.Process} of this user's processes whose environment holds
    IPP_CLUSTER_ID=`lab_id`, and of their descendants (this process excluded)."""
    import psutil

    me = os.getpid()
    found = {}
    for pid in _carriers(lab_id):
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in family:
            if p.pid == me:
                continue
            try:
                found[spec(p)] = p
            except (psutil.Error, ValueError):
                continue
    return found


def start(client, lab_id: str = "", processes: list = (), slurm_name: str = ""):
    """Start the reaper on behalf of `client` (a psutil.Process or a pid) for the lab whose
    launched processes carry IPP_CLUSTER_ID=`lab_id`, and for `processes` (psutil.Process);
    `slurm_name`: the engines' Slurm job name, cancelled if the client dies."""
    # the file, not `-m hpclab.cluster.reaper`: the package's imports (pandas…) would cost ~70 MB
    argv = [sys.executable, __file__, spec(client), *map(spec, processes)]
    argv += ["--lab", lab_id] if lab_id else []
    argv += ["--slurm-name", slurm_name] if slurm_name else []
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the client's process group must not reach it
        close_fds=True,
    )


def watch(client: str, tokens: list[str], lab_id: str = "", slurm_name: str = "") -> str:
    """Poll until the client dies (then end the lab: 'reaped') or the lab ends ('done')."""
    known = dict.fromkeys(tokens)
    while True:
        if lab_id:
            known.update(dict.fromkeys(lab_processes(lab_id)))
        alive = [p for p in map(_same, known) if p is not None]
        if _same(client) is None:
            _end(alive, lab_id, slurm_name)
            return "reaped"
        if known and not alive and not slurm_name:  # (a job may still wait in the queue)
            return "done"
        time.sleep(POLL_S)


def _end(alive: list, lab_id: str, slurm_name: str) -> None:
    """SIGTERM, GRACE_S, SIGKILL to the lab's processes; then once more for a process started
    meanwhile (a proxy, a late sbatch); and its Slurm job cancelled, before and after."""
    import psutil

    _cancel(slurm_name)
    victims = {p.pid: p for p in alive}
    if lab_id:
        victims.update({p.pid: p for p in lab_processes(lab_id).values()})
    for p in victims.values():
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(list(victims.values()), timeout=GRACE_S)
    if lab_id:
        left += [p for p in lab_processes(lab_id).values() if p.pid not in victims]
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    _cancel(slurm_name)


def _cancel(slurm_name: str) -> None:
    """`scancel --name=NAME --user=ME`: the job, pending or running (scancel(1))."""
    if not slurm_name:
        return
    import getpass

    try:
        subprocess.run(
            ["scancel", f"--name={slurm_name}", f"--user={getpass.getuser()}"],
            check=False,
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        pass


def _option(argv: list[str], name: str) -> tuple[str, list[str]]:
    if name not in argv:
        return "", argv
    i = argv.index(name)
    return argv[i + 1], argv[:i] + argv[i + 2 :]


def main(argv: list[str]) -> int:
    lab_id, argv = _option(argv, "--lab")
    slurm_name, argv = _option(argv, "--slurm-name")
    if not argv:
        print("usage: python cluster/reaper.py CLIENT [PID:START ...] [--lab ID] [--slurm-name N]")
        return 2
    watch(argv[0], argv[1:], lab_id, slurm_name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
