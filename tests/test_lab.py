"""hpclab.cluster.lab.Lab: argument checks, and the lifecycle of real MPI engines (hpclab/cluster/lab.py, cluster/run.py).

Argument checks and the run handle's logging need no engines. The `mpi` tests start their own
labs (the shared `lab2` fixture must stay up for the other tests), each with one or two workers
because every start costs seconds: start, restart (after a rank was killed: the next run restarts
the engines, with a logged warning) and stop are checked by pid, through the lab's own rank -> pid
map; `with Lab(...)` must tear down on a normal exit and on an exception; a script that forgets
`lab.stop()` must leave no engine behind when it exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from hpclab.cluster.lab import Lab
from hpclab.cluster.run import Run
from hpclab.core.catalog import MAX_THREADS_PER_WORKER, MAX_WORKERS
from hpclab.core.config import RunConfig
from hpclab.core.engine_settings import EngineSettings
from hpclab.core.errors import ConfigError, LabError, RunFailed
from hpclab.records.store import RunStore
from hpclab.views.panel.panel import Panel

ROOT = Path(__file__).resolve().parents[1]

# -- arguments: checked before any engine starts ---------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, quoted",
    [
        ({"workers": 0}, "workers=0"),
        ({"workers": True}, "workers=True"),
        ({"workers": 2.0}, "workers=2.0"),
        ({"workers": MAX_WORKERS + 1}, f"workers={MAX_WORKERS + 1}"),
        ({"launcher": "pbs"}, "launcher='pbs'"),
        ({"threads_per_worker": 0}, "threads_per_worker=0"),
        ({"threads_per_worker": "2"}, "threads_per_worker='2'"),
        ({"threads_per_worker": MAX_THREADS_PER_WORKER + 1}, "threads_per_worker="),
        ({"start_timeout": 0}, "start_timeout=0"),
        ({"start_timeout": True}, "start_timeout=True"),
        ({"groups": 3}, "groups=3"),  # (of the default 2 workers)
        ({"groups": 0}, "groups=0"),
    ],
)
def test_bad_arguments_are_refused_with_the_value_quoted(kwargs, quoted):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        Lab(**kwargs)
    assert quoted in str(err.value) and f"Lab.{next(iter(kwargs))}" in str(err.value)
    assert time.perf_counter() - t0 < 1  # refused before any engine starts


def test_srun_outside_an_allocation_and_mpiexec_srun_are_refused_before_any_engine(monkeypatch):
    """launcher='srun' needs an allocation; mpiexec='srun' would skip --mpi= (N 1-rank worlds)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("HPCLAB_PROFILE", raising=False)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set"):
        Lab(workers=2, launcher="srun")
    with pytest.raises(ConfigError, match=r"mpiexec='srun'.*launcher='srun'"):
        Lab(workers=2, mpiexec="/usr/bin/srun")
    with pytest.raises(ConfigError, match=r"Lab.nodes.*nodes=-1"):
        Lab(workers=2, nodes=-1)
    assert time.perf_counter() - t0 < 1


# -- the run handle's monitor thread logs, it never prints -----------------------------------------


class _FakeResult:
    """One rank's AsyncResult: publishes two rows once `go` is set, then returns a summary."""

    def __init__(self, go: threading.Event):
        self.go, self.polls = go, 0

    @property
    def data(self):
        if not self.go.is_set():
            return {}
        self.polls += 1
        rows = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]
        return {"hpclab": {"state": "running", "rows": rows, "epochs": []}}

    def ready(self):
        return self.polls >= 2

    def get(self, return_exceptions=False):
        return {"rank": 0, "status": "finished", "rows": [], "epochs": [], "weights_digest": "d"}


def test_a_failing_on_update_callback_is_logged_once_not_printed(tmp_path, caplog, capsys):
    store = RunStore(tmp_path)
    store.create({"config": RunConfig().to_dict(), "workers": 1})
    go = threading.Event()
    run = Run(
        config=RunConfig(),
        workers=1,
        store=store,
        results=[_FakeResult(go)],
        ranks=[{"rank": 0, "pid": 1, "host": "h"}],
        on_engines_lost=lambda why: None,
        abort=lambda: None,
        launcher_output=lambda: "",
    )

    def broken_chart(run):
        raise KeyError("trace")

    caplog.set_level(logging.DEBUG, logger="hpclab")
    run.on_update(broken_chart)
    go.set()
    assert run.wait(10)["status"] == "finished"  # the run's bookkeeping went on

    def failures():
        return [r for r in caplog.records if "on_update callback" in r.getMessage()]

    deadline = time.monotonic() + 5  # the last call comes just after `done` is set
    while len(failures()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.callback_errors == 2  # new rows, then the end
    failures = failures()
    assert [r.levelno for r in failures] == [logging.ERROR, logging.DEBUG]  # shown once
    assert failures[0].name == "hpclab.cluster.run" and failures[0].exc_info[0] is KeyError
    assert "broken_chart" in failures[0].getMessage()
    assert run.run_id in failures[0].getMessage()
    assert capsys.readouterr() == ("", "")  # nothing printed into the cell


# -- real engines ------------------------------------------------------------------------------


def rank_pids(lab) -> list[int]:
    return [r["pid"] for r in lab.ranks]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, timeout=15.0) -> list[int]:
    """The pids still alive after `timeout` s (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def engine_pids_answer(lab) -> list[int]:
    """Ask every engine for its pid, in rank order (proves they run and answer)."""
    return lab.client[[r["engine_id"] for r in lab.ranks]].apply_sync(os.getpid)


def our_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if alive(p.pid)}


@pytest.mark.mpi
def test_start_and_stop_by_pid(tmp_path):
    before = our_children()
    with Lab(workers=2, runs_dir=tmp_path, verbose=False) as lab:  # a normal exit stops it
        pids = rank_pids(lab)
        assert [r["rank"] for r in lab.ranks] == [0, 1] and len(set(pids)) == 2
        assert lab.healthy and lab.lost is None and "running" in repr(lab)
        assert engine_pids_answer(lab) == pids
        assert lab.startup_s is not None and lab.startup_s > 0
    assert wait_gone(pids) == []
    assert our_children() - before == set()  # controller, mpiexec, nannies: all gone
    assert not lab.healthy and "stopped" in repr(lab)
    lab.stop()  # stopping twice is fine
    with pytest.raises(LabError, match="this lab is stopped"):
        lab.run(RunConfig(num_samples=4000, epochs=1))


@pytest.mark.mpi
def test_a_clean_stop_lets_each_engines_nanny_end_by_itself(tmp_path, monkeypatch, caplog):
    """Each engine's ipyparallel nanny tells the controller its engine left, then ends; on
    another host nothing could kill it, so the lab must let it finish: the controller hears
    every engine leave before it stops, and the stop kills nothing."""
    from hpclab.cluster import engines

    heard = []
    shut_down = engines._shut_down

    def recording(client, ids, seconds):
        shut_down(client, ids, seconds)
        heard.append(client.ids)  # the engines the controller still counts

    def nannies_now() -> list:
        return [
            p
            for p in psutil.Process().children(recursive=True)
            if "ipyparallel.engine.nanny" in " ".join(p.cmdline())
        ]

    monkeypatch.setattr(engines, "_shut_down", recording)
    others = {p.pid for p in nannies_now()}  # another test's lab (the session's shared one)
    lab = Lab(workers=2, runs_dir=tmp_path, verbose=False)
    nannies = [p for p in nannies_now() if p.pid not in others]
    assert len(nannies) == 2, nannies
    with caplog.at_level(logging.WARNING, logger="hpclab.cluster.engines"):
        lab.stop()
    assert heard == [[]]  # every nanny's notice reached the controller
    killed = [r.message for r in caplog.records if "outlived" in r.message]
    assert not [m for m in killed if "nanny" in m], killed  # none ended by the lab
    assert [p.pid for p in nannies if alive(p.pid)] == []


@pytest.mark.mpi
def test_a_users_ipcluster_config_never_leaks_in_and_state_is_private(tmp_path, monkeypatch):
    """ipyparallel loads ~/.ipython/profile_default/ipcluster_config.py by default; a Lab uses a
    private 0700 state folder instead (here the user's file would break mpiexec and time out)."""
    ipython = tmp_path / "ipython" / "profile_default"
    ipython.mkdir(parents=True)
    (ipython / "ipcluster_config.py").write_text(
        "c.MPILauncher.mpi_args = ['--no-such-mpiexec-flag']\nc.Cluster.engine_timeout = 1\n"
    )
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.delenv("HPCLAB_PROFILE", raising=False)
    runs = tmp_path / "runs"
    with Lab(workers=2, runs_dir=runs, verbose=False) as lab:
        state = Path(lab.plan.state_dir)
        assert state.parent == runs / ".state" and oct(state.stat().st_mode & 0o777) == "0o700"
        assert lab.profile.name == "local" and lab.profile_reason == "auto: default"
        assert [r["size"] for r in lab.ranks] == [2, 2]
        assert not list(runs.glob(".probe-*"))  # the shared-folder probe is cleaned up
    assert not state.exists()  # a clean stop removes it


@pytest.mark.mpi
def test_a_controller_whose_heart_is_silent_is_replaced_once(tmp_path, monkeypatch, caplog):
    """A CI run once saw engines reach the controller and hear no heartbeat for 75 s (its
    heart monitor, a process of its own, was gone). Made so here by killing the controller's
    heart monitor right after it started: the engines' missed heartbeats are noticed and a
    second controller serves the lab."""
    import ipyparallel as ipp

    original = ipp.Cluster.start_controller  # start_controller_sync wraps it (by __getattr__)
    first: list[tuple[psutil.Process, str]] = []

    async def start_controller_then_stop_its_heart(self, *args, **kwargs):
        out = await original(self, *args, **kwargs)
        if not first:  # the heart monitor: the child that listens on the hb_ping port
            name = f"ipcontroller-{self.cluster_id}-engine.json"
            connection = Path(self.profile_dir) / "security" / name
            controller = psutil.Process(self.controller.process.pid)
            deadline = time.time() + 30
            while time.time() < deadline:
                await asyncio.sleep(0.1)
                try:  # written once the controller is up
                    info = json.loads(connection.read_text())
                except (OSError, ValueError):
                    continue
                heart = [
                    child
                    for child in controller.children()
                    for conn in child.net_connections("tcp")
                    if conn.status == psutil.CONN_LISTEN and conn.laddr.port == info["hb_ping"]
                ]
                if heart:
                    break
            heart[0].kill()
            first.append((controller, self.cluster_id))
        return out

    monkeypatch.setattr(ipp.Cluster, "start_controller", start_controller_then_stop_its_heart)
    before = our_children()
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="hpclab.cluster.engines"):
        with Lab(workers=2, runs_dir=tmp_path, verbose=False) as lab:
            took = time.perf_counter() - t0
            (silent, silent_id), *_ = first
            assert not alive(silent.pid)  # the silent controller was stopped
            assert lab.healthy and [r["rank"] for r in lab.ranks] == [0, 1]
            assert lab.plan.cluster_id.startswith(silent_id + "-")  # a new cluster and folder
            pids = rank_pids(lab)
    assert (
        "heard no heartbeat from it" in caplog.text and "starting a new controller" in caplog.text
    )
    print(f"[silent controller] replaced and started in {took:.1f} s")
    assert wait_gone(pids) == [] and our_children() - before == set()


HOROVOD_KEYS = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_TIMELINE")


@pytest.mark.mpi
def test_engine_settings_reach_the_engines_and_other_settings_restart_them(tmp_path, caplog):
    """The lab's EngineSettings are what Horovod read at hvd.init(): lab.restart(settings=...)
    changes them; a run that needs others (here a timeline) restarts the engines once, with a
    logged warning, keeping the lab's cycle time and fusion buffer; the same settings again
    restart nothing. Every record names them."""

    def horovod_env():  # read on the engine itself (os.getenv travels by reference)
        return [
            tuple(lab.client[e].apply_sync(os.getenv, key) for key in HOROVOD_KEYS)
            for e in lab.client.ids
        ]

    default = EngineSettings()
    with Lab(workers=1, runs_dir=tmp_path, verbose=False) as lab:
        assert lab.engine_settings == default
        assert horovod_env() == [
            (f"{default.cycle_time_ms:g}", str(int(default.fusion_mb * 2**20)), None)
        ]
        assert set(lab.startup_phases) == {
            "controller_s", "engines_s", "tf_import_s", "horovod_init_s", "total_s"
        }  # fmt: skip
        before = rank_pids(lab)
        lab.restart(settings=EngineSettings(cycle_time_ms=2.0, fusion_mb=0.0))
        assert rank_pids(lab) != before and wait_gone(before) == []
        assert horovod_env() == [("2", "0", None)]
        pids = rank_pids(lab)
        cfg = RunConfig(num_samples=4000, max_steps=8, steps_per_call=2, timeline_steps=2)
        with caplog.at_level(logging.WARNING, logger="hpclab.cluster.lab"):
            run = lab.run(cfg)
            run.wait(timeout=300)
        assert (
            "restarting the engines for Horovod cycle time 2 ms, fusion buffer 0 MB, dynamic "
            "timeline on, 1 synchronous group (they had cycle time 2 ms, fusion buffer 0 MB, "
            "dynamic timeline off" in caplog.text
        )
        assert rank_pids(lab) != pids and horovod_env() == [("2", "0", "DYNAMIC")]
        meta = json.loads((run.path / "config.json").read_text())
        assert meta["lab"]["horovod_env"] == {
            "HOROVOD_CYCLE_TIME": "2", "HOROVOD_FUSION_THRESHOLD": "0",
            "HPCLAB_HOROVOD_GROUPS": "1", "HOROVOD_TIMELINE": "DYNAMIC",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
        }  # fmt: skip
        assert meta["lab"]["engine_settings"] == {
            "cycle_time_ms": 2.0, "fusion_mb": 0.0, "timeline": True, "groups": 1, "stall_s": 120.0
        }  # fmt: skip
        assert "hvd_cycle_time_ms" not in meta["config"]
        pids = rank_pids(lab)
        lab.run(cfg.replace(seed=1, timeline_steps=0)).wait(timeout=300)  # kept: no restart
        assert rank_pids(lab) == pids


def test_restart_decides_the_engine_settings_before_starting(tmp_path, monkeypatch):
    """Which settings a restart starts the engines with (no engines: start and stop are
    replaced): other workers drop groups that no longer divide them, ``settings=`` replaces
    them, ``cfg=`` adds what its run needs (EngineSettings.for_run)."""
    monkeypatch.setattr(Lab, "start", lambda self: None)
    monkeypatch.setattr(Lab, "stop", lambda self: None)
    lab = Lab(workers=4, groups=2, runs_dir=tmp_path, verbose=False)
    assert lab.engine_settings == EngineSettings(groups=2)
    lab.restart(workers=3)
    assert lab.workers == 3 and lab.engine_settings == EngineSettings()
    lab.restart(workers=4, cfg=RunConfig(update="hybrid", groups=2, timeline_steps=2))
    assert lab.engine_settings == EngineSettings(timeline=True, groups=2)
    lab.restart(settings=EngineSettings(cycle_time_ms=1.0))
    assert lab.engine_settings == EngineSettings(cycle_time_ms=1.0)
    with pytest.raises(ConfigError, match="divisor of workers \\(4\\).*groups=3"):
        lab.restart(settings=EngineSettings(groups=3))
    assert lab.engine_settings == EngineSettings(cycle_time_ms=1.0)  # (unchanged)


def test_engine_settings_and_groups_are_given_once():
    with pytest.raises(ConfigError, match=r"groups must be 1 or engine_settings.groups \(2\)"):
        Lab(workers=4, groups=4, engine_settings=EngineSettings(groups=2))
    with pytest.raises(ConfigError, match="engine_settings must be an EngineSettings"):
        Lab(workers=2, engine_settings={"cycle_time_ms": 1.0})
    with pytest.raises(ConfigError, match="divisor of workers \\(2\\).*groups=4"):
        Lab(workers=2, engine_settings=EngineSettings(groups=4))


@pytest.mark.mpi
def test_lost_engines_restart_fresh_with_a_logged_warning_and_an_exception_tears_down(
    tmp_path, caplog, capsys
):
    caplog.set_level(logging.INFO, logger="hpclab")
    with pytest.raises(RuntimeError, match="a bug in the notebook"):
        with Lab(workers=1, runs_dir=tmp_path, verbose=False) as lab:
            old = rank_pids(lab)
            # many epochs: it is killed long before it could end
            doomed = lab.run(RunConfig(num_samples=4000, epochs=50, batch_per_worker=16))
            time.sleep(1.0)  # the task is on the engine
            os.kill(old[0], signal.SIGKILL)
            with pytest.raises(RunFailed, match=f"rank 0 \\(pid {old[0]}"):
                doomed.wait(60)
            assert lab.lost and not lab.healthy and "lost" in repr(lab)

            # the next run restarts them; through the panel, whose status line says so
            panel = Panel(lab, base=RunConfig(num_samples=4000, epochs=1), dashboard=False)
            said = []
            panel.widgets["status"].observe(lambda c: said.append(c["new"]), names="value")
            panel.widgets["run"].click()
            run = panel.run
            assert any("previous engines were lost" in s for s in said)
            warnings = [
                r
                for r in caplog.records
                if r.name.startswith("hpclab") and r.levelno >= logging.WARNING
            ]
            assert [r.name for r in warnings] == ["hpclab.cluster.lab"], (
                caplog.text
            )  # the abort is quiet
            assert "previous engines were lost" in warnings[0].getMessage()
            assert "rank 0" in warnings[0].getMessage()  # says why
            assert lab.healthy and lab.lost is None
            new = rank_pids(lab)
            assert new != old and wait_gone(old) == []
            assert engine_pids_answer(lab) == new
            assert run.wait(120)["status"] == "finished"
            raise RuntimeError("a bug in the notebook")
    assert wait_gone(new) == [] and not lab.healthy and "stopped" in repr(lab)
    assert "lost" not in capsys.readouterr().out  # logged, not printed


@pytest.mark.mpi
def test_a_script_that_forgets_to_stop_its_lab_leaves_no_engines(tmp_path):
    script = textwrap.dedent(
        f"""
        import json, sys
        from hpclab import Lab
        lab = Lab(workers=1, runs_dir={str(tmp_path)!r}, verbose=False)
        print(json.dumps([r["pid"] for r in lab.ranks]), flush=True)
        # exits here without lab.stop(): the atexit hook must stop the engines
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = json.loads(proc.stdout.strip().splitlines()[-1])
    assert pids and wait_gone(pids) == []
    # hpclab's hook ran before ipyparallel's own (which would say "Stopping cluster"), so the
    # engines were shut down cleanly, and the exit did not hang on a client whose cluster was gone
    assert "Stopping cluster" not in proc.stderr, proc.stderr[-3000:]


def _lab_script(tmp_path, ending: str) -> str:
    """A script that starts a 2-worker lab and a long run, prints the pids of every process of
    the lab once the run trains (controller, mpiexec and their trees), then does `ending`."""
    return textwrap.dedent(
        f"""
        import json, time, psutil
        from hpclab import Lab, RunConfig
        lab = Lab(workers=2, runs_dir={str(tmp_path)!r}, verbose=False)
        run = lab.run(RunConfig(num_samples=8000, epochs=400))
        while run.history.empty and not run.done:
            time.sleep(0.2)
        tree = [psutil.Process(lab._engines.cluster.controller.process.pid),
                psutil.Process(lab._engines._engine_set.process.pid)]
        tree += [c for p in tree for c in p.children(recursive=True)]
        print(json.dumps({{"pids": [p.pid for p in tree], "run": str(run.path)}}), flush=True)
        {ending}
        """
    )


@pytest.mark.mpi
def test_a_client_killed_by_sigkill_leaves_no_engines_and_its_run_reads_abandoned(tmp_path):
    from hpclab.cluster import reaper
    from hpclab.records.index import list_runs

    proc = subprocess.Popen(
        [sys.executable, "-c", _lab_script(tmp_path, "time.sleep(600)")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(proc.stdout.readline())
    finally:
        proc.kill()  # SIGKILL: no atexit hook, no signal handler runs
        proc.wait()
    t0 = time.perf_counter()
    left = wait_gone(info["pids"], timeout=reaper.BOUND_S + 5)
    print(f"\nthe lab's {len(info['pids'])} processes were gone "
          f"{time.perf_counter() - t0:.1f} s after the client's SIGKILL")  # fmt: skip
    assert left == [], f"processes outlived the killed client: {left}"
    runs = list_runs(tmp_path)
    assert runs["status"].tolist() == ["abandoned"], runs[["run_id", "status"]]


@pytest.mark.mpi
def test_a_script_that_returns_mid_run_records_the_run_as_stopped(tmp_path):
    from hpclab.records.store import load_run

    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _lab_script(tmp_path, "# returns: the run is still training")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nthe script that returned mid-run exited after {time.perf_counter() - t0:.1f} s")
    assert wait_gone(info["pids"], timeout=10) == []
    summary = load_run(info["run"]).summary
    assert summary["status"] == "stopped", summary


@pytest.mark.mpi
def test_stop_with_a_rank_stopped_while_idle_is_bounded_and_leaves_nothing(tmp_path):
    from hpclab.cluster.engines import STOP_BOUND_S

    before = our_children()
    lab = Lab(workers=2, runs_dir=tmp_path, verbose=False)
    pids = rank_pids(lab)
    os.kill(pids[1], signal.SIGSTOP)  # idle: no run, the clean shutdown cannot be answered
    t0 = time.perf_counter()
    lab.stop()
    took = time.perf_counter() - t0
    print(f"\nlab.stop() with a SIGSTOPped idle rank took {took:.1f} s (bound {STOP_BOUND_S:g} s)")
    assert took < STOP_BOUND_S
    assert wait_gone(pids, timeout=5) == []
    assert our_children() - before == set()


@pytest.mark.mpi
def test_a_kernel_shut_down_as_jupyter_does_records_its_run_as_stopped(tmp_path):
    """What JupyterLab's "Shut Down Kernel" and `DELETE /api/kernels/<id>` do, with Jupyter's
    default settings: a shutdown request, 5 s of grace (shutdown_wait_time), then SIGKILL."""
    from jupyter_client.manager import KernelManager

    from hpclab.records.index import list_runs

    km = KernelManager(kernel_name="python3")
    assert km.shutdown_wait_time == 5.0  # the default a JupyterLab server uses
    km.start_kernel(cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(ROOT)})
    printed: list[str] = []

    def keep_stdout(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            printed.append(msg["content"]["text"])

    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive(
            _lab_script(tmp_path, ""), timeout=180, output_hook=keep_stdout
        )
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
    info = json.loads("".join(printed).strip().splitlines()[-1])
    t0 = time.perf_counter()
    km.shutdown_kernel()  # request, 5 s grace, then kill
    print(f"\nthe kernel shut down in {time.perf_counter() - t0:.1f} s")
    assert wait_gone(info["pids"], timeout=10) == []
    assert list_runs(tmp_path)["status"].tolist() == ["stopped"]
