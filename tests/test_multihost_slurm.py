"""A real Slurm across hosts: slurmd on n1 and n2, slurmctld and the user on a firewalled login.

tests/slurm_netns.py makes the hosts (network namespaces with their own addresses and hostnames
on a private bridge) and starts the daemons in them. Here a user on `login` first runs a plain
`srun` whose tasks' callbacks come back through the firewall's `SrunPortRange`, then starts a
`Lab` in submission mode (`launch.mode = "sbatch"`): the engines go in as a batch job, run on n1
and n2 as one MPI world (srun --mpi=pmi2 inside the job, on n1), and register with the
controller bound through `network.interface = "eth0"` across login's firewall, which opens only
the profile's `network.ports` range besides Slurm's ports. (No training here: tests/slurm trains
through sbatch and tests/test_multihost.py across these namespaces; a run would add ~25 s.)

Found on Slurm 22.05 (Debian bookworm) while building this: `SrunPortRange` covers srun's I/O and
message ports but not the pmi2 plugin's own listening port (an ephemeral one, seen with `ss` on
login), so `srun --mpi=pmi2` started on a firewalled login node fails in MPI_Init ("mpi/pmi2:
failed to send temp kvs to srun", 40 packets rejected); with the ephemeral range 32768-60999 also
open the same srun forms a 2-rank world in 0.8 s (checked by hand, not here: the failing case
costs 16 s). Submission mode runs srun on a compute node and is not affected.

Needs root, iproute2, nsenter/unshare, nft and the Slurm/MUNGE packages; skipped with the reason
elsewhere and an error when HPCLAB_REQUIRE_SLURM=1 (root CI). Teardown cancels the jobs, stops
the daemons by pid and removes the namespaces with everything in them, pass or fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from slurm_netns import HOSTS, PORTS, NetnsSlurm, on_host, unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.own_lab]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    reason = unavailable()
    if reason:
        if os.environ.get("HPCLAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"HPCLAB_REQUIRE_SLURM=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    made = NetnsSlurm(tempfile.mkdtemp(prefix="hpclab-slurm-netns-"))
    try:
        made.start()
        yield made
    finally:
        problems = made.stop()
        tails = made.log_tails() if problems else ""
        shutil.rmtree(made.root, ignore_errors=True)
        assert not problems, "\n".join(problems) + "\n" + tails


def test_srun_from_login_reaches_both_hosts_through_the_srun_port_range(cluster):
    """Each slurmd registered under its own name and address; srun on login gets its tasks'
    output back through SrunPortRange (the only range the firewall opens for it)."""
    before = cluster.counters()
    nodes = cluster.run(["scontrol", "show", "nodes", "-o"], timeout=15).stdout.splitlines()
    addr = dict(
        (f["NodeName"], f["NodeAddr"])
        for f in (dict(x.split("=", 1) for x in line.split() if "=" in x) for line in nodes)
    )
    assert addr == {"n1": HOSTS["n1"], "n2": HOSTS["n2"]}
    r = cluster.run(["srun", "-N2", "-n2", "-l", "hostname"], timeout=60)
    assert r.returncode == 0, r.stderr + cluster.log_tails()
    assert sorted(r.stdout.split()) == ["0:", "1:", "n1", "n2"]
    after = cluster.counters()
    assert after["SrunPortRange"] > before["SrunPortRange"]
    assert after["slurmctld"] >= 1  # the slurmds' registrations


def test_without_srun_port_range_the_firewall_stops_srun_on_login(cluster):
    """The same srun with a client conf that lacks SrunPortRange listens on random ports: the
    tasks' callbacks hit login's firewall and srun never gets its output (it waits; killed
    here once the firewall has rejected them)."""
    no_range = cluster.root / "no-srun-port-range.conf"
    text = cluster.conf.read_text()
    no_range.write_text("".join(ln for ln in text.splitlines(True) if "SrunPortRange=" not in ln))
    before = cluster.counters()["rejected"]
    env = {**cluster.env, "SLURM_CONF": str(no_range)}
    cmd = on_host(
        cluster.ns["login"], "login", ["srun", "-N2", "-n2", "-J", "no-range", "hostname"]
    )
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as srun:
        deadline = time.monotonic() + 30
        while cluster.counters()["rejected"] == before and time.monotonic() < deadline:
            assert srun.poll() is None, srun.communicate()
            time.sleep(0.2)
        rejected = cluster.counters()["rejected"] - before
        finished = srun.poll()
        srun.kill()  # the srun process itself (on_host execs down to it)
        out, _ = srun.communicate()
    cluster.run(["scancel", "--name=no-range"], timeout=15)
    assert rejected > 0 and finished is None and b"n1" not in out, (rejected, finished, out)
    deadline = time.monotonic() + 20
    while cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not cluster.jobs()


def _profile(root: Path) -> Path:
    path = root / "netns-slurm.toml"
    path.write_text(
        textwrap.dedent(f"""\
            [cluster]
            name = "netns-slurm"
            description = "tests/test_multihost_slurm.py: engines as a job from login"
            [launch]
            mode = "sbatch"
            [slurm]
            partition = "debug"
            time = "00:10:00"
            srun_mpi = "pmi2"
            queue_timeout_s = 60
            registration_timeout_s = 90
            [network]
            interface = "eth0"
            ports = "{PORTS[0]}-{PORTS[1]}"
            [environment.vars]
            FI_TCP_IFACE = "eth0"
            FI_SOCKETS_IFACE = "eth0"
            UCX_NET_DEVICES = "eth0"
            """)
    )
    return path


def test_engines_submitted_from_login_run_on_n1_and_n2_and_register_through_the_firewall(
    cluster,
):
    """The lab on login submits its engines; they form one world across the two hosts, reach
    the controller on login's eth0 through the profile's range, and allreduce; afterwards no job and no process of the lab is left."""
    runs = cluster.root / "runs"
    runs.mkdir()
    before = cluster.counters()
    t0 = time.monotonic()
    argv = [
        sys.executable,
        HERE / "netns_lab.py",
        "--profile",
        _profile(cluster.root),
        "--runs-dir",
        runs,
    ]
    env = {**cluster.env, "HPCLAB_DATA": str(cluster.root / "data")}
    done = cluster.run(argv, env=env, timeout=240)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no result (exit {done.returncode}):\n{done.stderr[-3000:]}"
    out = json.loads(lines[-1])
    assert "error" not in out, out["error"] + "\n" + cluster.log_tails()
    print(f"lab started, allreduced and stopped in {time.monotonic() - t0:.1f} s")
    assert out["client_host"] == "login"
    assert out["plan"]["mode"] == "sbatch"
    assert out["plan"]["controller_ip"] == HOSTS["login"]
    assert out["plan"]["ports"] == f"{PORTS[0]}-{PORTS[1]}"
    ranks = out["ranks"]
    assert sorted(r["host"] for r in ranks) == ["n1", "n2"]
    assert {r["size"] for r in ranks} == {2} and sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["slurm_job"] for r in ranks)
    assert [a["value"] for a in out["allreduce"]] == [3.0, 3.0]  # 1 + 2 on both ranks
    assert sorted(r["node"] for r in ranks) == ["n1", "n2"]  # SLURMD_NODENAME
    after = cluster.counters()
    assert after["profile network.ports"] > before["profile network.ports"]
    deadline = time.monotonic() + 15
    while cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not cluster.jobs(), "the engines' job outlived lab.stop()"
    left = [cmd for _, cmd in cluster.processes() if "ipyparallel" in cmd or "srun" in cmd]
    assert not left, f"lab processes left: {left}"
