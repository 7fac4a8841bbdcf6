"""JupyterHub + batchspawner + configurable-http-proxy on the throw-away Slurm cluster.

What an HPC centre runs, on loopback: a JupyterHub (root, from the project venv) whose spawner
submits each user's JupyterLab as a Slurm batch job (`batchspawner.MultiSlurmSpawner`: the
emulated node names n1/n2 map to 127.0.0.1), routed by configurable-http-proxy from npm
(`scripts/install-hub.sh`). Used by tests/slurm/test_hub.py; no pytest dependency.

Pieces, each cleaned up by its own `close()`/`remove()`:

* `TestUser`: a real Unix user (`useradd -m`), removed with `userdel -r` after its processes
  (listed with `pgrep -u`, killed by pid) are gone.
* `grant_traverse`: the user's jobs run the venv's interpreter, which here is a symlink into
  /root/.pyenv, and /root is 0700. Instead of `chmod o+x /root` (every user of the machine) it
  adds a POSIX ACL entry `user:<test user>:--x` to each ancestor directory the user cannot
  traverse (written as the `system.posix_acl_access` xattr, so no `acl` package is needed), and
  `restore()` puts back the exact previous xattr (or none) and mode. Only on a file system
  without ACL support does it fall back to `o+x` (restored the same way).
* `Hub`: renders jupyterhub_config.py (0600, it holds the password and the service token),
  starts `jupyterhub`, waits for /hub/api, offers the REST API with a service token, and
  collects the hub, job and Slurm log tails for failure messages.
"""

from __future__ import annotations

import atexit
import errno
import grp
import os
import pwd
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
CHP = ROOT / ".cache" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
TEST_USER = "hpclabci"
# useradd -m puts this in the home: a leftover user of a killed run carries it, so the next run
# may remove that user; a user without it is never touched.
USER_MARKER = ".hpclab-test-user"
# The singleuser step does not hold the job's CPUs exclusively, so steps started from the
# notebook (the Lab's engines) can start beside it. Measured on Slurm 22.05: with this, a nested
# `srun -n2` starts with or without its own --overlap; with batchspawner's default plain `srun`,
# a nested `srun -n2` without --overlap waits forever for the CPUs the singleuser step holds.
DEFAULT_SRUN = "srun --ntasks=1 --nodes=1 --overlap"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing() -> str | None:
    """Why the hub cannot run here (besides Slurm itself), or None."""
    if os.geteuid() != 0:
        return "the hub test needs root (it creates a Unix user and runs a root JupyterHub)"
    for mod in ("jupyterhub", "batchspawner", "jinja2"):
        try:
            __import__(mod)
        except ImportError:
            return f"python package {mod} is missing (run `make setup`)"
    if not os.access(CHP, os.X_OK):
        return f"{CHP} is missing; run scripts/install-hub.sh"
    for tool in ("useradd", "userdel", "pgrep"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    if not exec_prefix():
        return "neither sudo nor runuser is available to submit jobs as the test user"
    return None


def exec_prefix() -> str:
    """How the hub runs sbatch/squeue/scancel as the user (batchspawner's `exec_prefix`)."""
    if shutil.which("sudo"):
        return "sudo -E -u {username}"  # batchspawner's default
    if shutil.which("runuser"):
        return "runuser -u {username} --"
    return ""


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"({exc})"
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------ POSIX ACLs
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF


def _acl_entries(path: str) -> list[tuple[int, int, int]]:
    """The access ACL of `path` as (tag, perm, id) entries (synthesised from the mode if none)."""
    try:
        raw = os.getxattr(path, _ACL_XATTR)
    except OSError:
        raw = b""
    if raw:
        return [struct.unpack_from("<HHI", raw, off) for off in range(4, len(raw), 8)]
    mode = os.stat(path).st_mode
    return [
        (_USER_OBJ, (mode >> 6) & 7, _UNDEFINED_ID),
        (_GROUP_OBJ, (mode >> 3) & 7, _UNDEFINED_ID),
        (_OTHER, mode & 7, _UNDEFINED_ID),
    ]


def _acl_bytes(entries: list[tuple[int, int, int]]) -> bytes:
    entries = sorted(entries, key=lambda e: (e[0], e[2]))  # the kernel wants tag, then id order
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _can_traverse(path: str, uid: int, gids: set[int]) -> bool:
    st = os.stat(path)
    for tag, perm, ident in _acl_entries(path):
        if tag == _USER and ident == uid:
            mask = next((p for t, p, _ in _acl_entries(path) if t == _MASK), 7)
            return bool(perm & mask & 1)
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid in gids:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


class Grants:
    """Directories given `user:<uid>:--x`; `restore()` puts back each one's xattr and mode."""

    def __init__(self):
        self.saved: list[tuple[str, bytes | None, int]] = []  # (dir, old xattr, old mode)
        self.fallbacks: list[str] = []  # dirs that got o+x because they cannot hold an ACL

    def add(self, directory: str, uid: int) -> None:
        st = os.stat(directory)
        try:
            old = os.getxattr(directory, _ACL_XATTR)
        except OSError:
            old = None
        entries = [e for e in _acl_entries(directory) if not (e[0] == _USER and e[2] == uid)]
        entries.append((_USER, 1, uid))
        group_class = [p for t, p, _ in entries if t in (_USER, _GROUP_OBJ, _GROUP)]
        entries = [e for e in entries if e[0] != _MASK]
        mask = 0
        for p in group_class:
            mask |= p
        entries.append((_MASK, mask, _UNDEFINED_ID))
        self.saved.append((directory, old, st.st_mode & 0o7777))
        try:
            os.setxattr(directory, _ACL_XATTR, _acl_bytes(entries))
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                self.saved.pop()
                raise
            # a file system without POSIX ACLs: design 3.5's o+x for the duration of the test
            os.chmod(directory, (st.st_mode & 0o7777) | 0o001)
            self.fallbacks.append(directory)

    def restore(self) -> list[str]:
        problems = []
        while self.saved:
            directory, old, mode = self.saved.pop()
            try:
                if old is not None:
                    os.setxattr(directory, _ACL_XATTR, old)
                elif directory not in self.fallbacks:
                    os.removexattr(directory, _ACL_XATTR)
                os.chmod(directory, mode)  # an ACL's mask shows as the group bits: put them back
            except OSError as exc:
                problems.append(f"could not restore {directory}: {exc}")
        return problems

    def __str__(self) -> str:
        dirs = [
            d + (" (o+x: no ACL support)" if d in self.fallbacks else "") for d, _, _ in self.saved
        ]
        return ", ".join(dirs) or "(nothing)"


def grant_traverse(user: str, paths: list[Path | str]) -> Grants:
    """Let `user` reach every path in `paths`: `--x` by ACL on each ancestor directory (and each
    path that is a directory) the user cannot traverse now. Nothing else changes."""
    pw = pwd.getpwnam(user)
    gids = {pw.pw_gid, *(g.gr_gid for g in grp.getgrall() if user in g.gr_mem)}
    dirs: list[str] = []
    for p in paths:
        p = Path(os.path.realpath(p))
        chain = [*reversed(p.parents)] + ([p] if p.is_dir() else [])
        for d in chain:
            if str(d) not in dirs:
                dirs.append(str(d))
    grants = Grants()
    atexit.register(grants.restore)  # a crashed test must not leave /root open
    try:
        for d in dirs:
            if not _can_traverse(d, pw.pw_uid, gids):
                grants.add(d, pw.pw_uid)
    except OSError:
        grants.restore()
        raise
    return grants


# ------------------------------------------------------------------------------ the test user
class TestUser:
    """A throw-away Unix user with a home; `remove()` kills its processes and deletes it."""

    def __init__(self, name: str = TEST_USER):
        self.name = name
        try:
            old = pwd.getpwnam(name)
        except KeyError:
            old = None
        if old is not None:
            if not (Path(old.pw_dir) / USER_MARKER).exists():
                raise RuntimeError(
                    f"a user {name!r} already exists and was not created by this test; "
                    "refusing to touch it"
                )
            self._delete()  # left over from a killed run
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/bash", "--comment", "hpclab CI", name],
            check=True,
            capture_output=True,
            text=True,
        )
        pw = pwd.getpwnam(name)
        self.uid, self.gid, self.home = pw.pw_uid, pw.pw_gid, Path(pw.pw_dir)
        (self.home / USER_MARKER).write_text("created by tests/slurm/hub.py; safe to delete\n")

    def pids(self) -> list[int]:
        """Live processes of the user. Zombies are left out: they have exited and wait for
        PID 1 (this VM's init) to reap them, which can take a while after their parent died."""
        return [int(line.split()[0]) for line in self.processes()]

    def processes(self) -> list[str]:
        r = subprocess.run(
            ["ps", "-o", "pid=,stat=,args=", "-u", self.name], capture_output=True, text=True
        )
        rows = [line.split(None, 2) for line in r.stdout.splitlines() if line.strip()]
        return [f"{row[0]} {row[-1]}"[:200] for row in rows if not row[1].startswith("Z")]

    def chown(self, path: Path) -> None:
        os.chown(path, self.uid, self.gid)

    def run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        """Run `args` as this user (runuser: no PAM session, no password)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        kw.setdefault("cwd", self.home)
        return subprocess.run(["runuser", "-u", self.name, "--", *map(str, args)], **kw)

    def _kill_all(self, timeout: float = 10) -> list[str]:
        """SIGTERM, then SIGKILL, every process of this user (only this test user exists for
        the test, so they are all ours). Returns what was still running at the start."""
        found = self.processes()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + timeout
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
        return found

    def _delete(self) -> None:
        self._kill_all()
        subprocess.run(["userdel", "--remove", self.name], capture_output=True, text=True)
        # userdel -r complains about the missing mail spool but deletes the user and home

    def remove(self) -> list[str]:
        """Kill what is left (returned, for the assertion), delete the user and home."""
        left = self._kill_all()
        r = subprocess.run(["userdel", "--remove", self.name], capture_output=True, text=True)
        try:
            pwd.getpwnam(self.name)
            left.append(f"userdel failed ({r.returncode}): {r.stderr.strip()}")
        except KeyError:
            pass
        return left


# ------------------------------------------------------------------------------ the hub
CONFIG = """\
# Rendered by tests/slurm/hub.py: a loopback JupyterHub whose users' servers are Slurm jobs.
import batchspawner  # noqa: F401 — registers /hub/api/batchspawner (the port callback)
from batchspawner import MultiSlurmSpawner
from traitlets import Unicode

c = get_config()  # noqa: F821


class LoopbackSlurmSpawner(MultiSlurmSpawner):
    # batchspawner's start() resets `ip` to the class default (0.0.0.0, all interfaces) rather
    # than the configured value, so loopback must be the class default.
    ip = Unicode("127.0.0.1").tag(config=True)


c.JupyterHub.bind_url = "http://127.0.0.1:{port}/"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = {proxy_pid!r}
c.JupyterHub.pid_file = {hub_pid!r}
c.JupyterHub.db_url = "sqlite:///{db}"
c.JupyterHub.cookie_secret_file = {cookie!r}
c.JupyterHub.log_level = "INFO"
# Straight to the spawn-pending page (with the spawner's progress) instead of waiting 10 s.
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {password!r}
c.Authenticator.allowed_users = {{{user!r}}}

c.JupyterHub.spawner_class = LoopbackSlurmSpawner
c.MultiSlurmSpawner.daemon_resolver = {resolver!r}
c.SlurmSpawner.exec_prefix = {exec_prefix!r}
c.SlurmSpawner.req_partition = {partition!r}
c.SlurmSpawner.req_runtime = "00:15:00"
c.SlurmSpawner.req_nprocs = {nprocs!r}
c.SlurmSpawner.req_options = "--nodelist={node}"
c.SlurmSpawner.req_srun = {srun!r}
# sudo resets PATH to its secure_path: the job puts the venv first again (a site's `module load`)
c.SlurmSpawner.req_prologue = "export PATH={venv}/bin:$PATH"
c.SlurmSpawner.batchspawner_singleuser_cmd = "{venv}/bin/batchspawner-singleuser"
c.SlurmSpawner.startup_poll_interval = 0.5
c.Spawner.cmd = ["{venv}/bin/jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {environment!r}
# batchspawner 1.3.0 does not notice a job that dies before reporting its port (bs #253):
# without this a broken job would hold the spawn page for the default 300 s.
c.Spawner.start_timeout = {start_timeout}
c.Spawner.http_timeout = {start_timeout}

c.JupyterHub.services = [{{"name": "hpclab-ci", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [
    {{"name": "hpclab-ci", "services": ["hpclab-ci"], "scopes": ["admin:servers", "read:users"]}}
]
"""


class Hub:
    """A JupyterHub on 127.0.0.1 spawning `user`'s JupyterLab as a Slurm job on `node`.

    `environment` is merged into `Spawner.environment` (what the job's JupyterLab and kernels
    see): the hook for HPCLAB_PROFILE / HPCLAB_PROFILE_PATH and anything else the notebook
    needs. SLURM_CONF, HPCLAB_RUNS and HPCLAB_DATA are set unless `environment` maps them to
    None (then the user's lab picks its own folders, as on a centre-wide read-only install).
    """

    def __init__(
        self,
        slurm,
        workdir: Path,
        user: TestUser,
        *,
        environment: dict[str, str] | None = None,
        runs_dir: Path | None = None,
        data_dir: Path | None = None,
        node: str | None = None,
        nprocs: int = 2,
        srun: str = DEFAULT_SRUN,
        start_timeout: int = 120,
    ):
        self.slurm, self.user = slurm, user
        self.node = node or slurm.nodes[0]
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)
        self.port, self.hub_port, self.proxy_api_port = free_port(), free_port(), free_port()
        self.password = secrets.token_urlsafe(16)
        self.token = secrets.token_hex(32)
        self.runs_dir = runs_dir or self.dir / "hub-runs"
        self.data_dir = data_dir or self.dir / "data"
        for d in (self.runs_dir, self.data_dir):
            if not d.exists():
                d.mkdir(parents=True)
                user.chown(d)
        env = {
            "SLURM_CONF": str(slurm.conf),
            "HPCLAB_RUNS": str(self.runs_dir),
            "HPCLAB_DATA": str(self.data_dir),
        }
        env.update(environment or {})
        env = {k: v for k, v in env.items() if v is not None}  # None: left unset
        self.environment = env
        self.config = self.dir / "jupyterhub_config.py"
        self.config.write_text(
            CONFIG.format(
                port=self.port,
                hub_port=self.hub_port,
                proxy_api_port=self.proxy_api_port,
                chp=str(CHP),
                proxy_pid=str(self.dir / "proxy.pid"),
                hub_pid=str(self.dir / "hub.pid"),
                db=self.dir / "hub.sqlite",
                cookie=str(self.dir / "cookie_secret"),
                password=self.password,
                user=user.name,
                resolver={n: "127.0.0.1" for n in slurm.nodes},
                exec_prefix=exec_prefix(),
                partition=slurm.partition,
                nprocs=str(nprocs),
                node=self.node,
                srun=srun,
                venv=VENV,
                environment=env,
                start_timeout=start_timeout,
                token=self.token,
            )
        )
        self.config.chmod(0o600)  # holds the password and the service token
        self.log_path = self.dir / "hub.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Hub:
        env = {k: v for k, v in self.slurm.env.items() if not k.startswith(("JUPYTER", "JPY_"))}
        env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["SLURM_CONF"] = str(self.slurm.conf)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(VENV / "bin" / "jupyterhub"), "-f", str(self.config)],
            cwd=self.dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"jupyterhub exited with {self.proc.returncode}:\n{tail(self.log_path, 60)}"
                )
            try:
                if requests.get(f"{self.url}/hub/api", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise AssertionError(
            f"JupyterHub did not answer within {timeout} s:\n{tail(self.log_path, 60)}"
        )

    def api(self, method: str, path: str, timeout: float = 30, **kw):
        """A request to /hub/api with the `hpclab-ci` service's token."""
        import requests

        return requests.request(
            method,
            f"{self.url}/hub/api{path}",
            headers={"Authorization": f"token {self.token}"},
            timeout=timeout,
            **kw,
        )

    def squeue(self) -> list[str]:
        """`STATE NODE JOBNAME` of each of the user's jobs in squeue."""
        r = self.slurm.run(["squeue", "-h", "-u", self.user.name, "-o", "%T %N %j"], timeout=15)
        return [line.strip() for line in r.stdout.splitlines() if line.strip()]

    def job_logs(self) -> list[Path]:
        return sorted(self.user.home.glob("jupyterhub_slurmspawner_*.log"))

    def log_tails(self, lines: int = 40) -> str:
        parts = [f"--- hub log {self.log_path} ---\n{tail(self.log_path, lines * 2)}"]
        parts += [f"--- job log {p} ---\n{tail(p, lines)}" for p in self.job_logs()]
        if hasattr(self.slurm, "log_tails"):
            parts.append(self.slurm.log_tails(15))
        else:
            for p in sorted(Path(self.slurm.root).glob("log/*")):
                parts.append(f"--- {p} ---\n{tail(p, 15)}")
        try:
            parts.append("--- squeue ---\n" + "\n".join(self.squeue()))
        except (subprocess.SubprocessError, OSError) as exc:
            parts.append(f"--- squeue failed: {exc}")
        return "\n".join(parts)

    def stop(self, timeout: float = 30) -> list[str]:
        """SIGTERM the hub (it stops the users' servers, i.e. scancels their jobs, and its
        proxy); SIGKILL after `timeout`. Returns what had to be forced."""
        problems: list[str] = []
        if self.proc is None:
            return problems
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                problems.append(f"jupyterhub ignored SIGTERM for {timeout} s: SIGKILL")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # the proxy is the hub's child; with cleanup_proxy it goes with the hub
        pid_file = self.dir / "proxy.pid"
        try:
            proxy_pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            proxy_pid = None
        if proxy_pid and _alive(proxy_pid) and _cmdline(proxy_pid).find(str(CHP.name)) >= 0:
            problems.append(f"configurable-http-proxy (pid {proxy_pid}) outlived the hub: SIGKILL")
            os.kill(proxy_pid, signal.SIGKILL)
        return problems


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
