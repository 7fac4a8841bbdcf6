"""A profile's `network.ports` range on a host with several labs (hpclab/cluster/ports.py).

ipyparallel hands a configured range out from its first port, so before this a second lab given
the same range failed to bind (its controller took the first lab's ports). Each lab now takes a
free part of the range, chosen under a host-wide lock held until its controller has bound it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpclab.cluster import ports
from hpclab.cluster.profiles import parse
from hpclab.core.errors import ConfigError, LabError


def free_range(width: int) -> str:
    """A range of `width` consecutive ports all free on 127.0.0.1 now (searched from a port the
    kernel hands out, so tests on one machine rarely pick the same one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        start = s.getsockname()[1]
    for low in [*range(start, 65535 - width, width), *range(20000, start, width)]:
        if all(ports.is_free("127.0.0.1", p) for p in range(low, low + width)):
            return f"{low}-{low + width - 1}"
    raise AssertionError(f"no {width} consecutive free ports on 127.0.0.1")


def test_a_bad_range_is_refused_with_the_field_and_the_rule():
    for bad in ("50000", "50100-50000", "80-90", "5e4-5e4"):
        with pytest.raises(ConfigError, match=r"network\.ports = .* is not a port range"):
            parse(f'[network]\nports = "{bad}"\n', source="site.toml")
    assert parse('[network]\nports = "50000-50100"\n').network.ports == "50000-50100"
    with pytest.raises(ConfigError, match="holds 3 port"):
        ports.pick("50000-50002", "127.0.0.1")


def test_taken_ports_are_skipped_and_a_full_range_says_so():
    spec = free_range(ports.ENGINE_PORTS + 2)
    low = ports.parse(spec).start
    with socket.socket() as held:  # someone else listens on the range's first port
        held.bind(("127.0.0.1", low))
        held.listen()
        chosen = ports.pick(spec, "127.0.0.1")
        assert low not in chosen and len(chosen) == ports.ENGINE_PORTS
        assert ports.pick(spec, "127.0.0.2")[0] == low  # free on another address
        blockers = [socket.socket() for _ in range(2)]
        try:
            for s, port in zip(blockers, (low + 1, low + 2), strict=True):
                s.bind(("127.0.0.1", port))
                s.listen()
            with pytest.raises(LabError, match=rf"{spec}.* has 8 free port\(s\)"):
                ports.pick(spec, "127.0.0.1")
        finally:
            for s in blockers:
                s.close()


HOLDER = """
import socket, sys, time
from hpclab.cluster import ports
spec = sys.argv[1]
with ports.reserved(spec, "127.0.0.1") as chosen:
    listeners = []
    for port in chosen:  # what the controller does inside the reservation
        s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen(); listeners.append(s)
print(" ".join(map(str, chosen)), flush=True)
sys.stdin.read()  # hold the ports until the test closes stdin
"""


def test_labs_starting_at_once_take_disjoint_parts_of_one_range():
    """Four processes reserve from one range at the same moment, each binding what it got (as
    its controller would): all succeed with disjoint ports, all inside the range."""
    spec = free_range(4 * ports.ENGINE_PORTS)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        got = [set(map(int, p.stdout.readline().split())) for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
    errors = [p.stderr.read() for p in procs if p.returncode]
    assert not errors, errors
    assert all(len(g) == ports.ENGINE_PORTS for g in got), got
    assert len(set().union(*got)) == 4 * ports.ENGINE_PORTS  # disjoint
    assert set().union(*got) == set(ports.parse(spec))


def _engine_ports(lab) -> set[int]:
    """The ports in the engine connection file of a running lab's controller."""
    (path,) = Path(lab._engines.plan.state_dir, "security").glob("*engine.json")
    info = json.loads(path.read_text())
    found = set()
    for value in info.values():
        found |= {value} if isinstance(value, int) else set()
        found |= {v for v in value if isinstance(v, int)} if isinstance(value, list) else set()
    return found


@pytest.mark.mpi
@pytest.mark.own_lab
def test_two_labs_with_the_same_range_on_one_host_both_start(tmp_path):
    """The range holds exactly two controllers' engine ports: the second lab must take the part
    the first one left (before, it tried the first lab's ports and failed to bind)."""
    from hpclab import Lab

    spec = free_range(2 * ports.ENGINE_PORTS)
    profile = tmp_path / "site.toml"
    profile.write_text(f'[launch]\nmode = "mpiexec"\n[network]\nports = "{spec}"\n')
    with Lab(workers=1, profile=profile, runs_dir=tmp_path / "a", verbose=False) as first:
        with Lab(workers=1, profile=profile, runs_dir=tmp_path / "b", verbose=False) as second:
            assert first.healthy and second.healthy
            a, b = _engine_ports(first), _engine_ports(second)
            print(f"\nrange {spec}: lab 1 engine ports {sorted(a)}, lab 2 {sorted(b)}")
            assert a | b == set(ports.parse(spec)) and not a & b
            assert second.plan.record()["ports"] == spec
