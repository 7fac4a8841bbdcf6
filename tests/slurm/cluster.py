"""A real, throw-away Slurm cluster on this one host, for the Slurm tests.

`SlurmCluster(root).start()` writes a slurm.conf and a MUNGE key under `root`, starts its own
`munged`, `slurmctld` and one `slurmd` per emulated node (Slurm's MULTIPLE_SLURMD mode: several
slurmd on one host, each with its own node name and port), and waits until every node is idle.
Nothing under /etc is read or written and no system service is touched: clients find the cluster
through `SLURM_CONF` in `cluster.env`, and jobs inherit it. `stop()` cancels every job and stops
the daemons by pid. Needs root (slurmd runs job steps as the submitting user) and the Debian
packages that `scripts/install-slurm.sh` installs. No pytest dependency: usable from a shell too:

    cd tests && python -m slurm.cluster /tmp/hpclab-slurm   # start, print SLURM_CONF, wait for ^C
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["SlurmCluster", "SlurmClusterError", "free_port"]

SLURM_DAEMONS = ("munged", "slurmctld", "slurmd", "srun")


class SlurmClusterError(RuntimeError):
    """The cluster did not start or stop cleanly; the message carries the daemons' log tails."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_tools() -> list[str]:
    """The Slurm/MUNGE programs this module needs that are not on PATH."""
    return [
        t
        for t in (*SLURM_DAEMONS, "sinfo", "squeue", "scancel", "scontrol", "mungekey")
        if shutil.which(t) is None
    ]


def _alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"({exc})"
    return "\n".join(text.splitlines()[-lines:])


class SlurmCluster:
    """A single-host Slurm cluster of `nodes` emulated nodes n1..nN with `cpus_per_node` each.

    Attributes: `root` (everything lives here), `conf` (path of slurm.conf), `env` (os.environ
    plus SLURM_CONF, for every subprocess that talks to this cluster), `partition` ("debug"),
    `nodes` (["n1", "n2", ...]), `hostname` (this host's short name), `ports`.
    """

    partition = "debug"

    def __init__(
        self,
        root: Path | str,
        nodes: int = 2,
        cpus_per_node: int = 2,
        task_plugin: str = "task/none",
    ):
        self.root = Path(root).resolve()
        self.task_plugin = task_plugin
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus_per_node = cpus_per_node
        self.first_job_id = random.SystemRandom().randint(100_000, 50_000_000)  # see FirstJobId
        self.hostname = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.log_dir = self.root / "log"
        self.munge_dir = self.root / "munge"
        self.munge_socket = self.munge_dir / "munge.socket.2"
        self.ports = {"slurmctld": free_port(), **{n: free_port() for n in self.nodes}}
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        # Drop SLURM_* inherited from an outer real job (srun would think it runs inside it).
        env["SLURM_CONF"] = str(self.conf)
        self.env = env
        self._procs: dict[str, subprocess.Popen] = {}
        self.started_s: float | None = None
        self.stopped_s: float | None = None

    # ---------------------------------------------------------------- configuration
    def _real_memory_mb(self) -> int:
        try:
            kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[1])
        except (OSError, TypeError):
            return 1000
        # Each emulated node claims a share of the host, so a --mem request cannot oversubscribe.
        return max(1, kb // 1024 // len(self.nodes) - 256)

    def slurm_conf_text(self) -> str:
        r = self.root
        ncpu = self.cpus_per_node
        overrides = ncpu > (os.cpu_count() or 1)
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={self.hostname} NodeAddr=127.0.0.1 Port={self.ports[n]} "
            f"CPUs={ncpu} Boards=1 SocketsPerBoard=1 CoresPerSocket={ncpu} ThreadsPerCore=1 "
            f"RealMemory={self._real_memory_mb()} State=UNKNOWN"
            for n in self.nodes
        )
        return f"""\
# Written by tests/slurm/cluster.py — a throw-away single-host cluster for the hpclab tests.
# Slurm 22.05 (Debian bookworm). Loopback only; everything lives under {r}.
ClusterName=hpclabci
# Must be this host's short name (slurmctld refuses to start otherwise); the address in
# parentheses keeps every client on loopback whatever the name resolves to.
SlurmctldHost={self.hostname}(127.0.0.1)
# Root daemons: slurmd must be root to run steps as other users (the JupyterHub test's user).
SlurmUser=root
SlurmdUser=root
# A free port, never 6817: the test cluster must not collide with (or talk to) a system Slurm.
SlurmctldPort={self.ports["slurmctld"]}
AuthType=auth/munge
CredType=cred/munge
# Our own munged's socket. Both the auth and the cred plugin honour socket= (auth_munge.c,
# cred_munge.c), so no client needs MUNGE_SOCKET or the system /run/munge.
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/ctld
# %n = node name: with MULTIPLE_SLURMD every slurmd needs its own spool, pid file and log.
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.%n.pid
SlurmctldLogFile={self.log_dir}/slurmctld.log
SlurmdLogFile={self.log_dir}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in this sandbox: track processes by parent pid (proctrack/cgroup would need a
# writable cgroup tree and a cgroup.conf).
ProctrackType=proctrack/linuxproc
# task/none (default here): no CPU binding, srun -c2 leaves the task's affinity at all host
# CPUs and sets no OMP_NUM_THREADS. task/affinity binds each task to its -c CPUs (the variant
# that tests CPU pinning for real; it needs sched_setaffinity, which this sandbox allows).
TaskPlugin={self.task_plugin}
# Slurm's default on most sites: without --mpi=pmi2 every rank is its own size-1 MPI world.
# Keeping it forces hpclab to pass --mpi=pmi2 itself (the real-world trap is tested).
MpiDefault=none
SwitchType=switch/none
# Cores are the consumable: a job with -c2 holds both CPUs of a node.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# FIFO, no backfill interval: queued jobs start as soon as CPUs free up.
SchedulerType=sched/builtin
# A job whose --begin time passes is started by the main loop's periodic pass, every 60 s by
# default: test_b's held job then waited up to 66 s, past its 60 s queue timeout (seen once in
# CI). Every 2 s here.
SchedulerParameters=sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# No mail program in the sandbox; silences slurmctld's "MailProg invalid" error.
MailProg=/bin/true
# A node that was DOWN (e.g. after a restart) returns to service as soon as it registers.
ReturnToService=2
SlurmdTimeout=60
# 0 = never kill a job because its srun/salloc client went quiet (slow CI machines).
InactiveLimit=0
# Finished jobs stay visible to `scontrol show job` (state, exit code) for 30 s, not 300.
MinJobAge=30
# Job ids start at a random number: MPICH names its shared-memory segments
# (/dev/shm/mpich_shm_*) after the PMI job identity, and a segment left behind by a crashed rank of
# an earlier cluster's job 1.0 makes a new job 1.0's MPI_Init fail ("Message truncated", UCX
# "invalid bandwidth 0.00"). Real clusters never reuse ids; throw-away ones must not either.
FirstJobId={self.first_job_id}
# SIGTERM → SIGKILL grace for cancelled steps: short, so teardown is quick.
KillWait=5
# 0 (the default, explicit here): when one task of a step exits, srun never kills the others
# after a timeout — engines of one step may finish at different times.
Waittime=0
{"# More CPUs than the host has: trust the conf (testing only, slurm.conf.5)." if overrides else ""}
{"SlurmdParameters=config_overrides" if overrides else ""}
{node_lines}
PartitionName={self.partition} Nodes={",".join(self.nodes)} Default=YES MaxTime=30 State=UP
"""

    def write_config(self) -> None:
        for d in ("ctld", "run", "log", "munge", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        # World-traversable so jobs of a non-root user (the hub test) can read the conf and
        # reach the MUNGE socket; munged insists the socket dir is not group/other-writable.
        for d in (self.root, self.munge_dir, self.log_dir):
            d.chmod(0o755)
        self.conf.write_text(self.slurm_conf_text())
        self.conf.chmod(0o644)
        key = self.munge_dir / "munge.key"
        if not key.exists():
            subprocess.run(
                ["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True
            )
        key.chmod(0o400)

    # ---------------------------------------------------------------- lifecycle
    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.log_dir / f"{name}.out", "ab")
        # Foreground (-D/-F) children of this process: we know the pid at once and reap them,
        # so no zombie is left behind (PID 1 in a container does not always reap orphans).
        self._procs[name] = subprocess.Popen(
            args,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _wait(self, what: str, ok, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            dead = [
                f"{n} (exit {p.returncode})" for n, p in self._procs.items() if p.poll() is not None
            ]
            if dead:
                raise SlurmClusterError(
                    f"{', '.join(dead)} died while waiting for {what}\n{self.log_tails()}"
                )
            time.sleep(0.2)
        raise SlurmClusterError(
            f"timed out after {timeout:.0f} s waiting for {what}\n{self.log_tails()}"
        )

    def idle_nodes(self) -> list[str]:
        r = self.run(["sinfo", "-h", "-N", "-p", self.partition, "-o", "%N %T"], timeout=10)
        return sorted(
            line.split()[0] for line in r.stdout.splitlines() if line.split()[1:] == ["idle"]
        )

    def start(self, timeout: float = 30) -> SlurmCluster:
        """Start munged, slurmctld and every slurmd; return when all nodes are idle."""
        t0 = time.monotonic()
        self.write_config()
        m = self.munge_dir
        # munged 0.5.15 runs as root without --force; no --force so that its security checks
        # (key 0400, socket/seed dir not group/other-writable) stay on. Key, socket, pid, log
        # and seed all live in our own dir; with --foreground it logs to stderr (munged.out).
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--key-file={m}/munge.key",
                f"--socket={self.munge_socket}",
                f"--pid-file={m}/munged.pid",
                f"--log-file={m}/munged.log",
                f"--seed-file={m}/munged.seed",
            ],
        )
        self._wait("the MUNGE socket", self.munge_socket.exists, timeout)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(
            "slurmctld",
            lambda: self.run(["scontrol", "ping"], timeout=10).stdout.find("is UP") >= 0,
            timeout,
        )
        for n in self.nodes:
            # -N: which NodeName this slurmd is (MULTIPLE_SLURMD, slurmd.8).
            self._spawn(f"slurmd.{n}", ["slurmd", "-D", "-f", str(self.conf), "-N", n])
        remaining = max(1.0, timeout - (time.monotonic() - t0))
        self._wait(
            f"{len(self.nodes)} idle nodes",
            lambda: self.idle_nodes() == sorted(self.nodes),
            remaining,
        )
        self.started_s = time.monotonic() - t0
        return self

    def jobs(self) -> list[str]:
        r = self.run(["squeue", "-h", "-o", "%A"], timeout=10)
        return r.stdout.split()

    def processes(self) -> list[tuple[int, str]]:
        """Live processes (not this one) whose environment carries this cluster's SLURM_CONF:
        the daemons, slurmstepd, every task and every srun client."""
        needle = f"SLURM_CONF={self.conf}".encode()
        found = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == os.getpid():
                continue
            try:
                if needle not in (p / "environ").read_bytes().split(b"\0"):
                    continue
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if _alive(int(p.name)):
                found.append((int(p.name), cmd.strip()))
        return found

    def _daemon_pids(self) -> dict[str, int]:
        """Daemon pids: our own children, else the pid files (stop() from another process)."""
        pids = {n: p.pid for n, p in self._procs.items() if p.poll() is None}
        files = {
            "munged": self.munge_dir / "munged.pid",
            "slurmctld": self.root / "run/slurmctld.pid",
            **{f"slurmd.{n}": self.root / f"run/slurmd.{n}.pid" for n in self.nodes},
        }
        for name, f in files.items():
            if name not in pids and name not in self._procs:
                try:
                    pid = int(f.read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
                if _alive(pid):
                    pids[name] = pid
        return pids

    def stop(self, grace: float = 10) -> list[str]:
        """Cancel every job, stop the daemons (SIGTERM, SIGKILL after `grace` s), reap them.

        Returns what had to be forced (jobs still queued, SIGKILLed processes); [] is clean."""
        t0 = time.monotonic()
        problems: list[str] = []
        if self._daemon_pids().get("slurmctld"):
            try:
                ids = self.jobs()
                if ids:
                    # --full: signal the batch shell too, not only the steps.
                    self.run(["scancel", "--full", *ids], timeout=15)
                    self.run(["scancel", *ids], timeout=15)
                deadline = time.monotonic() + grace + 5  # KillWait=5 after SIGTERM
                while (left := self.jobs()) and time.monotonic() < deadline:
                    time.sleep(0.3)
                if left:
                    problems.append(f"jobs still in squeue after scancel: {left}")
            except (subprocess.SubprocessError, OSError) as exc:
                problems.append(f"could not cancel jobs: {exc}")
        # slurmd first (it needs slurmctld and munged to deregister), munged last.
        order = [f"slurmd.{n}" for n in self.nodes] + ["slurmctld", "munged"]
        for group in (order[:-2], order[-2:-1], order[-1:]):
            pids = {n: p for n, p in self._daemon_pids().items() if n in group}
            for pid in pids.values():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(
                self._gone(n, p) is False for n, p in pids.items()
            ):
                time.sleep(0.1)
            for name, pid in pids.items():
                if self._gone(name, pid) is False:
                    problems.append(
                        f"{name} (pid {pid}) ignored SIGTERM for {grace:.0f} s: SIGKILL"
                    )
                    os.kill(pid, signal.SIGKILL)
                    self._gone(name, pid, wait=5)
        for pid, cmd in self.processes():
            problems.append(f"left over after stop: pid {pid} {cmd!r}: SIGKILL")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        still = [pid for pid in self._all_known_pids() if _alive(pid)]
        if still:
            problems.append(f"pids still alive after SIGKILL: {still}")
        self.stopped_s = time.monotonic() - t0
        return problems

    def _gone(self, name: str, pid: int, wait: float = 0) -> bool:
        proc = self._procs.get(name)
        if proc is not None and proc.pid == pid:
            try:
                proc.wait(timeout=wait or 0.001)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + wait
        while _alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def _all_known_pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.poll() is None]

    # ---------------------------------------------------------------- helpers
    def run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run with this cluster's env, text output captured, a 120 s timeout."""
        kw.setdefault("env", self.env)
        kw.setdefault("text", True)
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", 120)
        return subprocess.run([str(a) for a in args], **kw)

    def log_files(self) -> list[Path]:
        return sorted([*self.log_dir.glob("*"), *self.munge_dir.glob("*.log")])

    def log_tails(self, lines: int = 15) -> str:
        """The last `lines` lines of every daemon log, for error messages."""
        return "\n".join(f"--- {p} ---\n{_tail(p, lines)}" for p in self.log_files())

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":  # manual use: start a cluster, keep it until ^C
    import sys

    c = SlurmCluster(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hpclab-slurm")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill <pid>` stops it cleanly too
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with `&`
    c.start()
    print(f"cluster up in {c.started_s:.1f} s; use: export SLURM_CONF={c.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        print(c.stop() or "stopped cleanly", f"in {c.stopped_s:.1f} s")
