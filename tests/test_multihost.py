"""Several hosts on one machine: network namespaces with their own addresses and hostnames.

The Slurm tests emulate two nodes on 127.0.0.1 with one hostname, so nothing there crosses a
network. Here the test makes a private bridge (in a namespace of its own) and three "hosts" on
it, each a network namespace with its own address, hostname (a UTS namespace per process) and
loopback: `login`, where the client and the ipyparallel controller run, and `n1`, `n2`, where
the engines run. The engines start under the venv's MPICH `mpiexec -hosts n1,n2` whose rsh
launcher enters the host's namespace (`nsexec`, written by the fixture), so MPI and Horovod
cross the bridge for real, and they register with a controller bound through the profile's
`network.interface` across a firewall (nftables, in `login`) that opens only the profile's
`network.ports` range and the launcher's own range (Hydra's `MPIEXEC_PORT_RANGE`; under Slurm it
would be srun's `SrunPortRange`). A node that cannot see the runs folder (a private tmpfs over it
on `n2`) is named by the world check.

Traffic stays inside the namespaces the test made; they are removed in the fixture's teardown,
pass or fail (and leftovers of a killed earlier run at the next start). Needs root, `ip`,
`unshare` and `nft` (scripts/install-slurm.sh installs nftables); skipped with the reason
elsewhere, and an error when HPCLAB_REQUIRE_SLURM=1 (root CI, like the Slurm tests). Not covered
here: the engines' launcher is Hydra's; tests/test_multihost_slurm.py runs slurmd per namespace
and submits the engines from `login`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from slurm_netns import (
    create_bridge,
    firewall_counters,
    namespace_pids,
    remove_namespaces,
    sh,
    stale_namespaces,
)

pytestmark = [pytest.mark.mpi, pytest.mark.own_lab]

HERE = Path(__file__).resolve().parent
PREFIX = "hpclab-t"  # namespaces: hpclab-t<pid>-<host>
SUBNET = "10.213.7"  # only inside the test's own namespaces
HOSTS = {"login": f"{SUBNET}.10", "n1": f"{SUBNET}.11", "n2": f"{SUBNET}.12"}
PORTS = (41000, 41000 + 2 * 9 - 1)  # the profile's range: two labs' engine ports (cluster/ports.py)
LAUNCHER_PORTS = (41100, 41109)  # Hydra's control port (MPIEXEC_PORT_RANGE)
CLOSED_PORT = 42000  # outside both ranges


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces, veth pairs and nftables need root"
    missing = [tool for tool in ("ip", "unshare", "nft") if not shutil.which(tool)]
    if missing:
        return f"missing {', '.join(missing)} (scripts/install-slurm.sh installs nftables)"
    return None


NSEXEC = """#!/bin/sh
# Hydra's rsh launcher: nsexec HOST COMMAND -> COMMAND inside HOST's namespace, with its hostname.
# With HIDE_RUNS_ON=<host> that host gets a private tmpfs over $HIDE_RUNS (a node that cannot see
# the runs folder).
host=$1; shift
case "$host" in
{cases}
  *) echo "nsexec: unknown host $host" >&2; exit 1;;
esac
if [ "$name" = "${{HIDE_RUNS_ON:-}}" ]; then
  exec ip netns exec "$ns" unshare --uts --mount --propagation private sh -c \\
    'hostname "$0" && mount -t tmpfs hidden "$1" && exec sh -c "$2"' "$name" "$HIDE_RUNS" "$*"
fi
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$name" "$*"
"""

FIREWALL = """
table inet hpclab {{
  chain input {{
    type filter hook input priority 0; policy drop;
    iif "lo" accept
    ct state established,related accept
    tcp dport {low}-{high} counter accept comment "profile network.ports"
    tcp dport {l_low}-{l_high} counter accept comment "launcher (MPIEXEC_PORT_RANGE)"
    meta l4proto tcp counter reject with tcp reset
  }}
}}
"""


class Hosts:
    """The namespaces, the launcher script, the profile and the folders of one test module."""

    def __init__(self, root: Path):
        self.root = root
        self.ns = {host: f"{PREFIX}{os.getpid()}-{host}" for host in [*HOSTS, "sw"]}
        self.runs = root / "runs"
        self.data = root / "data"
        self.nsexec = root / "nsexec"
        self.profile = root / "netns.toml"
        self.profile_state_apart = root / "netns-state-apart.toml"  # paths.state not under runs

    def create(self) -> None:
        create_bridge(self.ns, HOSTS)
        rules = FIREWALL.format(
            low=PORTS[0], high=PORTS[1], l_low=LAUNCHER_PORTS[0], l_high=LAUNCHER_PORTS[1]
        )
        sh("nft", "-f", "-", ns=self.ns["login"], input=rules)
        cases = "\n".join(
            f"  {ip}) ns={self.ns[host]}; name={host};;" for host, ip in HOSTS.items()
        )
        self.nsexec.write_text(NSEXEC.format(cases=cases))
        self.nsexec.chmod(0o755)
        self.runs.mkdir()
        self.data.mkdir()
        text = textwrap.dedent(f"""\
            [cluster]
            name = "netns"
            description = "tests/test_multihost.py: engines on n1 and n2, the client on login"
            [launch]
            mode = "mpiexec"
            mpiexec_args = ["-hosts", "{HOSTS["n1"]},{HOSTS["n2"]}", "-launcher", "rsh",
                            "-launcher-exec", "{self.nsexec}", "-iface", "eth0"]
            [network]
            interface = "eth0"
            ports = "{PORTS[0]}-{PORTS[1]}"
            [environment.vars]
            FI_TCP_IFACE = "eth0"
            FI_SOCKETS_IFACE = "eth0"
            UCX_NET_DEVICES = "eth0"
            MPIEXEC_PORT_RANGE = "{LAUNCHER_PORTS[0]}:{LAUNCHER_PORTS[1]}"
            """)
        self.profile.write_text(text)
        self.profile_state_apart.write_text(f'{text}[paths]\nstate = "{self.root / "state"}"\n')

    def run(self, host: str, argv: list[str], env: dict | None = None, timeout: float = 60):
        """`argv` on `host` (its namespace and hostname), as a login shell there would."""
        cmd = [
            "ip",
            "netns",
            "exec",
            self.ns[host],
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host,
            *argv,
        ]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )

    def lab(self, *extra: str, env: dict | None = None, profile: Path | None = None) -> dict:
        """tests/netns_lab.py on `login`; its JSON line."""
        env = {"HPCLAB_DATA": str(self.data), **(env or {})}
        profile = profile or self.profile
        argv = [
            sys.executable,
            str(HERE / "netns_lab.py"),
            "--profile",
            str(profile),
            "--runs-dir",
            str(self.runs),
            *extra,
        ]
        done = self.run("login", argv, env=env, timeout=240)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert lines, f"no result (exit {done.returncode}):\n{done.stderr[-3000:]}"
        return json.loads(lines[-1])

    def counters(self) -> dict[str, int]:
        """Packets each commented firewall rule on `login` matched so far."""
        return firewall_counters(self.ns["login"])

    def pids(self) -> dict[str, list[str]]:
        return namespace_pids(self.ns)


@pytest.fixture(scope="module")
def hosts():
    reason = _unavailable()
    if reason:
        if os.environ.get("HPCLAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"HPCLAB_REQUIRE_SLURM=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    remove_namespaces(stale_namespaces(PREFIX))
    root = Path(tempfile.mkdtemp(prefix="hpclab-netns-"))
    made = Hosts(root)
    try:
        made.create()
        yield made
    finally:
        left = remove_namespaces(list(made.ns.values()))
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"namespaces left behind: {left}"


def _connects(hosts: Hosts, host: str, port: int) -> str:
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({HOSTS['login']!r}, {port}), timeout=5).close()\n"
        "    print('open')\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    return hosts.run(host, [sys.executable, "-c", probe]).stdout.strip()


def test_the_firewall_on_login_opens_only_the_profiles_range(hosts):
    """A listener on `login` outside the range is refused from n1 but reached on `login`
    itself; one inside the range is reached from n1."""
    listen = (
        "import socket, sys\n"
        "socks = []\n"
        f"for port in ({CLOSED_PORT}, {PORTS[1]}):\n"
        "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"    s.bind(({HOSTS['login']!r}, port)); s.listen(); socks.append(s)\n"
        "print('listening', flush=True)\n"
        "sys.stdin.read()\n"
    )
    cmd = ["ip", "netns", "exec", hosts.ns["login"], sys.executable, "-c", listen]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout.readline().strip() == "listening"
            assert _connects(hosts, "n1", CLOSED_PORT) == "ConnectionRefusedError"
            assert _connects(hosts, "login", CLOSED_PORT) == "open"  # the listener is there
            assert _connects(hosts, "n1", PORTS[1]) == "open"
        finally:
            server.stdin.close()
    assert hosts.counters()["profile network.ports"] >= 1


def test_engines_on_two_hosts_register_with_a_controller_on_the_login_interface(hosts):
    """Two engines on n1 and n2 form one MPI world, reach the controller on login's eth0
    through the firewall's range, allreduce across the bridge and train a short run; then
    nothing of the lab is left on any host."""
    before = hosts.counters()
    out = hosts.lab("--train")
    assert "error" not in out, out["error"]
    assert out["client_host"] == "login"
    ranks = out["ranks"]
    assert sorted(r["host"] for r in ranks) == ["n1", "n2"]
    assert {r["size"] for r in ranks} == {2} and sorted(r["rank"] for r in ranks) == [0, 1]
    assert out["plan"]["controller_ip"] == HOSTS["login"]
    assert out["plan"]["ports"] == f"{PORTS[0]}-{PORTS[1]}"
    assert [a["value"] for a in out["allreduce"]] == [3.0, 3.0]  # 1 + 2 on both ranks
    assert out["status"] == "finished"
    after = hosts.counters()
    assert after["profile network.ports"] > before["profile network.ports"]
    assert after["launcher (MPIEXEC_PORT_RANGE)"] > before["launcher (MPIEXEC_PORT_RANGE)"]
    left = {h: p for h, p in hosts.pids().items() if p}
    assert not left, f"lab processes left in the namespaces: {left}"


def test_a_node_that_cannot_see_the_state_folder_is_named_at_once(hosts):
    """n2 has a private tmpfs over the runs folder, where the lab's state folder lives by
    default: ipyparallel's engine there quits at once, and the lab says why within seconds
    (before, it waited out the registration timeout and said only that)."""
    hide = {"HIDE_RUNS_ON": "n2", "HIDE_RUNS": str(hosts.runs)}
    out = hosts.lab(env=hide)
    assert "error" in out, out
    error = out["error"]
    assert "could not find the lab's state folder" in error, error
    assert "every node shares" in error and "HPCLAB_RUNS" in error, error


def test_a_node_that_cannot_see_the_runs_folder_is_named(hosts):
    """Same, with the state folder elsewhere (the profile's paths.state, seen by every host):
    the engines start and the world check names the rank, its host and the fix."""
    hide = {"HIDE_RUNS_ON": "n2", "HIDE_RUNS": str(hosts.runs)}
    out = hosts.lab(env=hide, profile=hosts.profile_state_apart)
    assert "error" in out, out
    error = out["error"]
    assert "on n2 cannot read the runs folder" in error and "HPCLAB_RUNS" in error, error
    assert "on n1" not in error, error
