"""The engines' undertaker: a small process that ends a lab whose client died without stopping it.

ipyparallel starts the controller and ``mpiexec`` in sessions of their own, so a client killed by
SIGKILL (an out-of-memory kill, a kernel killed by its server, ``kill -9``) leaves them — and
every MPI engine — running, holding cores on a shared login node until someone notices.
:class:`hpclab.cluster.engines.EngineSet` therefore starts this module next to them, in a session of its
own too, with the client's pid and the processes it started on this host::

    python .../hpclab/reaper.py CLIENT_PID:START_TIME PID:START_TIME ... [--scancel JOB]

Once a second it checks that the client still exists (the same process: pid and start time).
When it does not, it sends SIGTERM to every listed process still alive (mpiexec forwards it to
the ranks), SIGKILL to what is left after :data:`GRACE_S`, ``scancel`` to the engines' Slurm job
if one was named, and exits. It also exits, doing nothing, once every listed process is gone
(the lab stopped normally). A lab's processes thus outlive a killed client by at most
:data:`BOUND_S`. psutil only (ipyparallel's own dependency); no hpclab import.
"""

from __future__ import annotations

import subprocess
import sys
import time

POLL_S = 1.0
GRACE_S = 5.0  # between SIGTERM and SIGKILL
BOUND_S = POLL_S + GRACE_S + 2.0  # a lab's processes outlive a killed client by at most this


def spec(process) -> str:
    """'pid:start_time' of a psutil.Process: names that exact process, never a reused pid."""
    return f"{process.pid}:{process.create_time():.3f}"


def _same(token: str):
    """The psutil.Process a spec names, or None if that process is gone."""
    import psutil

    pid, _, started = token.partition(":")
    try:
        p = psutil.Process(int(pid))
        if abs(p.create_time() - float(started)) > 0.01 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.Error, ValueError):
        return None


def start(client, processes: list, scancel: str = "") -> subprocess.Popen:
    """Start the reaper for `processes` (psutil.Process) on behalf of `client` (one too)."""
    # the file, not `-m hpclab.cluster.reaper`: the package's imports (pandas…) would cost ~70 MB
    argv = [sys.executable, __file__, spec(client), *map(spec, processes)]
    return subprocess.Popen(
        argv + (["--scancel", scancel] if scancel else []),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the client's process group must not reach it
        close_fds=True,
    )


def watch(client: str, tokens: list[str], scancel: str = "") -> str:
    """Poll until the client dies (then end the lab: 'reaped') or the lab ends ('done')."""
    import psutil

    while True:
        alive = [p for p in map(_same, tokens) if p is not None]
        if not alive:
            return "done"
        if _same(client) is None:
            for p in alive:
                try:
                    p.terminate()
                except psutil.Error:
                    pass
            _, left = psutil.wait_procs(alive, timeout=GRACE_S)
            for p in left:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            if scancel:
                subprocess.run(["scancel", scancel], check=False, capture_output=True)
            return "reaped"
        time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    scancel = ""
    if "--scancel" in argv:
        i = argv.index("--scancel")
        scancel, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
    if not argv:
        print("usage: python cluster/reaper.py CLIENT PID:START ... [--scancel JOB]")
        return 2
    watch(argv[0], argv[1:], scancel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
