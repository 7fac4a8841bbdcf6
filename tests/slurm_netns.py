"""A real Slurm across network namespaces: `login`, `n1`, `n2` as hosts on a private bridge.

tests/slurm/cluster.py emulates two nodes on 127.0.0.1 with one hostname (Slurm's
MULTIPLE_SLURMD mode), so no Slurm traffic there crosses a network. Here every host is a network
namespace with its own address, loopback and hostname (a UTS namespace per process) on a bridge
that lives in a namespace of its own: `slurmctld` and the MUNGE daemon run on `login` (where
users submit), one `slurmd` runs on each of `n1` and `n2` under that node's hostname and address
(`NodeHostname`/`NodeAddr`), all on Slurm's standard ports (nothing else listens in these
namespaces). One `munged` serves every host: its socket is a file path, reachable from any
network namespace.

`login` has a firewall (nftables) that, besides loopback and replies, opens only
`slurmctld`'s port (slurmd registers, srun/sbatch on compute nodes ask for steps), Slurm's
`SrunPortRange` (where an srun started on `login` listens for its tasks' I/O and PMI callbacks;
without the range srun takes random ports the firewall closes) and the hpclab profile's
`network.ports` range (the ipyparallel controller). Each rule counts its packets
(`counters()`), so a test can show which way traffic went.

Everything is the test's own: namespaces named `hpclab-s<pid>-<host>`, a subnet used only on the
bridge, a conf/state/log folder, daemons started here as children. `stop()` cancels every job,
stops the daemons by pid (SlurmCluster.stop), kills whatever is left in the namespaces and deletes
them. No pytest dependency; by hand (root):

    cd tests && python slurm_netns.py   # start, print how to reach it, wait for ^C
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm.cluster import SlurmCluster, missing_tools  # noqa: E402

PREFIX = "hpclab-s"  # namespaces: hpclab-s<pid>-<host>
SUBNET = "10.213.8"  # only on the test's own bridge
HOSTS = {"login": f"{SUBNET}.10", "n1": f"{SUBNET}.11", "n2": f"{SUBNET}.12"}
SLURMCTLD_PORT = 6817  # Slurm's defaults: inside these namespaces nothing else listens
SLURMD_PORT = 6818
SRUN_PORTS = (41200, 41219)  # slurm.conf SrunPortRange
PORTS = (41000, 41017)  # the profile's network.ports (two labs' worth, hpclab/cluster/ports.py)

FIREWALL = """
table inet hpclab {{
  chain input {{
    type filter hook input priority 0; policy drop;
    iif "lo" accept
    ct state established,related accept
    tcp dport {ctld} counter accept comment "slurmctld"
    tcp dport {s_low}-{s_high} counter accept comment "SrunPortRange"
    tcp dport {low}-{high} counter accept comment "profile network.ports"
    meta l4proto tcp counter reject with tcp reset comment "rejected"
  }}
}}
"""


def unavailable() -> str | None:
    """Why Slurm in namespaces cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces, nftables and slurmd need root"
    missing = [
        t for t in ("ip", "nsenter", "unshare", "nft") if not shutil.which(t)
    ] + missing_tools()
    if missing:
        return f"missing {', '.join(missing)} (scripts/install-slurm.sh installs them)"
    return None


def sh(*args: str, ns: str = "", check: bool = True, **kw) -> subprocess.CompletedProcess:
    cmd = ["ip", "netns", "exec", ns, *args] if ns else list(args)
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=60, **kw)


def remove_namespaces(names: list[str]) -> list[str]:
    """SIGKILL every process in the namespaces and delete them; what could not be removed."""
    left = []
    for name in names:
        for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        if sh("ip", "netns", "del", name, check=False).returncode:
            left.append(name)
    return left


def stale_namespaces(prefix: str = PREFIX) -> list[str]:
    """Namespaces named `prefix`<pid>-<host> from an earlier run whose process is gone (a killed
    test)."""
    names = [ln.split()[0] for ln in sh("ip", "netns", "list").stdout.splitlines() if ln]
    stale = []
    for name in names:
        pid = name[len(prefix) :].split("-")[0] if name.startswith(prefix) else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.append(name)
    return stale


def on_host(ns: str, host: str, argv: list[str]) -> list[str]:
    """`argv` inside network namespace `ns` under hostname `host`. nsenter, not `ip netns exec`:
    the latter mounts a fresh /sys, which hides /sys/fs/cgroup, and slurmd 22.05 refuses to start
    without it (even with proctrack/linuxproc). Every step execs the next, so the process started
    is `argv` itself (its pid is the daemon's)."""
    return [
        "nsenter",
        f"--net=/run/netns/{ns}",
        "unshare",
        "--uts",
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        host,
        *argv,
    ]


def create_bridge(ns: dict[str, str], hosts: dict[str, str]) -> None:
    """A switch namespace `ns["sw"]` with a bridge, and for each host (name -> address) its own
    namespace `ns[host]` with `lo` and an `eth0` plugged into the bridge."""
    sw = ns["sw"]
    sh("ip", "netns", "add", sw)
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    for i, (host, ip) in enumerate(hosts.items()):
        sh("ip", "netns", "add", ns[host])
        sh("ip", "-n", ns[host], "link", "set", "lo", "up")
        port = f"p{i}"  # the bridge side, inside the switch namespace
        sh(
            "ip",
            "-n",
            sw,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns[host],
        )
        sh("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", ns[host], "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns[host], "link", "set", "eth0", "up")


def firewall_counters(ns: str) -> dict[str, int]:
    """Packets each commented nftables rule in namespace `ns` matched so far."""
    listing = sh("nft", "-j", "list", "ruleset", ns=ns).stdout
    found = {}
    for item in json.loads(listing)["nftables"]:
        rule = item.get("rule")
        if rule and rule.get("comment"):
            counter = next(e["counter"] for e in rule["expr"] if "counter" in e)
            found[rule["comment"]] = counter["packets"]
    return found


def namespace_pids(ns: dict[str, str]) -> dict[str, list[str]]:
    """The pids in each host's namespace."""
    return {h: sh("ip", "netns", "pids", n).stdout.split() for h, n in ns.items()}


class NetnsSlurm(SlurmCluster):
    """SlurmCluster whose controller runs on `login` and whose nodes are the hosts n1, n2."""

    def __init__(self, root: Path | str):
        super().__init__(root, nodes=2, cpus_per_node=2)
        self.ns = {h: f"{PREFIX}{os.getpid()}-{h}" for h in [*HOSTS, "sw"]}
        self.ports = {"slurmctld": SLURMCTLD_PORT, **{n: SLURMD_PORT for n in self.nodes}}
        self.hostname = "login"

    def slurm_conf_text(self) -> str:
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={n} NodeAddr={HOSTS[n]} Port={SLURMD_PORT} CPUs=2 "
            f"Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 "
            f"RealMemory={self._real_memory_mb()} State=UNKNOWN"
            for n in self.nodes
        )
        lines = []
        for line in super().slurm_conf_text().splitlines():
            if line.startswith("NodeName="):
                continue
            if line.startswith("SlurmctldHost="):
                line = f"SlurmctldHost=login({HOSTS['login']})"
            if line.startswith("PartitionName="):
                lines += [
                    "# srun listens for its tasks' callbacks (I/O, PMI) only in this range, which",
                    "# login's firewall opens; without it srun takes random ephemeral ports.",
                    f"SrunPortRange={SRUN_PORTS[0]}-{SRUN_PORTS[1]}",
                    "# Each node is a host of its own: its own name and address, standard port.",
                    nodes,
                ]
            lines.append(line)
        return "\n".join(lines) + "\n"

    def _spawn(self, name: str, args: list[str]) -> None:
        host = name.split(".", 1)[1] if name.startswith("slurmd.") else "login"
        super()._spawn(name, on_host(self.ns[host], host, args))

    def run(self, args: list[str], host: str = "login", **kw) -> subprocess.CompletedProcess:
        """`args` on `host` (default `login`, where users submit) with this cluster's env."""
        return super().run(on_host(self.ns[host], host, [str(a) for a in args]), **kw)

    # ------------------------------------------------------------- the network
    def create_network(self) -> None:
        create_bridge(self.ns, HOSTS)
        rules = FIREWALL.format(
            ctld=SLURMCTLD_PORT,
            s_low=SRUN_PORTS[0],
            s_high=SRUN_PORTS[1],
            low=PORTS[0],
            high=PORTS[1],
        )
        sh("nft", "-f", "-", ns=self.ns["login"], input=rules)

    def counters(self) -> dict[str, int]:
        """Packets each commented firewall rule on `login` accepted (or rejected) so far."""
        return firewall_counters(self.ns["login"])

    def namespace_pids(self) -> dict[str, list[str]]:
        return namespace_pids(self.ns)

    def start(self, timeout: float = 30) -> NetnsSlurm:
        remove_namespaces(stale_namespaces())
        self.create_network()
        return super().start(timeout)

    def stop(self, grace: float = 10) -> list[str]:
        """Jobs cancelled and daemons stopped by pid, then the namespaces removed; [] is clean."""
        problems = super().stop(grace)
        left = {h: p for h, p in self.namespace_pids().items() if p}
        if left:
            problems.append(f"processes left in the namespaces (SIGKILLed): {left}")
        gone = remove_namespaces(list(self.ns.values()))
        if gone:
            problems.append(f"namespaces that could not be deleted: {gone}")
        return problems


if __name__ == "__main__":  # manual use: start, keep until ^C
    import signal
    import tempfile

    c = NetnsSlurm(tempfile.mkdtemp(prefix="hpclab-slurm-netns-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        c.start()
        print(f"up in {c.started_s:.1f} s: SLURM_CONF={c.conf} ip netns exec {c.ns['login']} ...")
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        print(c.stop() or "stopped cleanly", flush=True)
        shutil.rmtree(c.root, ignore_errors=True)
