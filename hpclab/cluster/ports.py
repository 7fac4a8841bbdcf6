"""Controller ports from a profile's `network.ports` range, shared by every lab on one host.

ipyparallel hands a configured range out in order from its first port
(`IPController.next_port`, ipyparallel 9.2 controller/app.py), so every controller given the same
range tries the same ports and a second lab on one login node fails to bind. Here each lab takes
the first ports of the range that are free on the address its controller binds, chosen under a
host-wide lock that is held until the controller has bound them: labs started at the same moment,
by the same or different users, take different parts of the range.

Only the sockets engines connect to come from the range (`IPController.engine_ports`): they are
the ones a firewall between compute and login nodes must open. The client's sockets, the
schedulers' internal ones and the monitor stay on ports the kernel picks, reached only from this
host (the client runs beside the controller in every launch mode).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import socket
import tempfile
import time
from pathlib import Path

from hpclab.core.errors import ConfigError, LabError

log = logging.getLogger(__name__)
#: Sockets a controller binds for engines (ipyparallel 9.2, IPController.init_hub): registration,
#: control, mux, task, iopub, heartbeat ping and pong, and one per leaf broadcast scheduler
#: (2 ** broadcast_scheduler_depth, depth 1 by default).
ENGINE_PORTS = 9
LOCK_WAIT_S = 30.0  # another lab's controller binds within seconds; never wait for ever
BIND_WAIT_S = 15.0  # our controller (and its heart monitor, a process of its own) binds within this
_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")


def parse(spec: str, where: str = "network.ports") -> range:
    """The ports of a "LOW-HIGH" range (inclusive); ConfigError naming `where` otherwise."""
    match = _RANGE.fullmatch(spec)
    low, high = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if not match or not 1024 <= low <= high <= 65535:
        raise ConfigError(
            f'{where} = {spec!r} is not a port range; write it as "LOW-HIGH" with '
            '1024 <= LOW <= HIGH <= 65535, e.g. "50000-50100".'
        )
    return range(low, high + 1)


def bind_address(controller_ip: str) -> str:
    """The address a controller planned with `controller_ip` binds ('' is ipyparallel's
    loopback default, '*' every interface)."""
    return {"": "127.0.0.1", "*": "0.0.0.0"}.get(controller_ip, controller_ip)


def is_free(address: str, port: int) -> bool:
    """Whether a TCP listener could bind `address:port` now. SO_REUSEADDR as ZeroMQ sets it, so
    a port in TIME_WAIT counts as free, a listening one never (Linux refuses that bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def pick(spec: str, address: str, count: int = ENGINE_PORTS) -> list[int]:
    """The first `count` ports of range `spec` free on `address`; LabError if there are fewer."""
    ports = parse(spec)
    if len(ports) < count:
        raise ConfigError(
            f"network.ports = {spec!r} holds {len(ports)} port(s) and a lab's controller needs "
            f"{count}; give a range of {count} ports per lab that may run on one host at once."
        )
    free: list[int] = []
    for port in ports:
        if is_free(address, port):
            free.append(port)
            if len(free) == count:
                return free
    raise LabError(
        f"network.ports = {spec!r} has {len(free)} free port(s) on {address} and a lab's "
        f"controller needs {count}: other labs on this host hold the rest; ask for a range of "
        f"{count} ports per lab that may run here at once."
    )


def _lock_file() -> int | None:
    """A descriptor of the host-wide lock file, opened read-only (flock needs no write access,
    so every user shares the first one's file); None if it cannot be opened."""
    path = Path(tempfile.gettempdir()) / "hpclab-ports.lock"
    for flags in (os.O_RDONLY, os.O_RDONLY | os.O_CREAT | os.O_EXCL, os.O_RDONLY):
        try:  # never O_CREAT on an existing file: fs.protected_regular refuses it in /tmp
            return os.open(path, flags, 0o444)
        except FileExistsError:
            continue
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.debug("no port lock at %s (%r)", path, exc)
            return None
    return None


@contextlib.contextmanager
def _host_lock():
    fd = _lock_file()
    if fd is None:
        yield
        return
    deadline = time.monotonic() + LOCK_WAIT_S
    held = False
    try:
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning(
                        "the port lock stayed taken %g s; choosing ports anyway", LOCK_WAIT_S
                    )
                    break
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def reserved(spec: str, controller_ip: str, count: int = ENGINE_PORTS):
    """Yield the engine ports for one controller from range `spec` ([] when `spec` is empty).

    The body must start the controller: the host lock is released once every yielded port is
    bound (or after BIND_WAIT_S), so the next lab's choice cannot take them."""
    if not spec:
        yield []
        return
    address = bind_address(controller_ip)
    with _host_lock():
        ports = pick(spec, address, count)
        yield ports
        deadline = time.monotonic() + BIND_WAIT_S
        while any(is_free(address, p) for p in ports) and time.monotonic() < deadline:
            time.sleep(0.05)


def controller_arg(ports: list[int]) -> list[str]:
    """The ipcontroller option that hands `ports` to the engine-facing sockets."""
    return [f"--IPController.engine_ports={','.join(map(str, ports))}"] if ports else []


__all__ = ["ENGINE_PORTS", "parse", "pick", "reserved", "controller_arg", "bind_address"]
