"""`Lab`: the lifecycle of N ipyparallel MPI engines running Horovod, and runs on them.

Start/stop come in pairs (ipyparallel's own style); `with Lab(...) as lab:` tears everything
down, and an `atexit` hook stops labs a notebook forgot. TensorFlow and Horovod are imported only
on the engines (by `hpclab.rank.engine`), never here.

Messages go to the ``hpclab.lab`` logger (no handler of our own: an application's logging
configuration decides). Warnings a user must act on show even without any configuration, through
Python's last-resort handler on stderr; the lab's state is also on the object (`healthy`, `lost`,
`repr(lab)`), and the panel's status line says the same.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import time
import weakref
from pathlib import Path

from hpclab import paths
from hpclab.catalog import MAX_THREADS_PER_WORKER, MAX_WORKERS
from hpclab.config import RunConfig
from hpclab.errors import ConfigError, LabError, RunFailed
from hpclab.launch import find_mpiexec
from hpclab.run import Run
from hpclab.runs import RunStore

LAUNCHERS = ("mpi",)  # engines under mpiexec; Slurm launch modes are planned, not yet offered
log = logging.getLogger(__name__)
_LIVE_LABS: weakref.WeakSet[Lab] = weakref.WeakSet()


def _check_args(workers, launcher, threads_per_worker, start_timeout) -> None:
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(
            f"Lab.workers must be an integer from 1 to {MAX_WORKERS}; "
            f"you passed workers={workers!r}."
        )
    if launcher not in LAUNCHERS:
        raise ConfigError(
            "Lab.launcher must be 'mpi' (engines started by mpiexec), the only launcher this "
            "version supports; Slurm support is tracked for a later version. "
            f"You passed launcher={launcher!r}."
        )
    if (
        not isinstance(threads_per_worker, int)
        or isinstance(threads_per_worker, bool)
        or not 1 <= threads_per_worker <= MAX_THREADS_PER_WORKER
    ):
        raise ConfigError(
            "Lab.threads_per_worker must be an integer from 1 to "
            f"{MAX_THREADS_PER_WORKER}; "
            f"you passed threads_per_worker={threads_per_worker!r}."
        )
    if (
        isinstance(start_timeout, bool)
        or not isinstance(start_timeout, (int, float))
        or not 1 <= start_timeout <= 3600
    ):
        raise ConfigError(
            "Lab.start_timeout must be a number of seconds from 1 to 3600; "
            f"you passed start_timeout={start_timeout!r}."
        )


class Lab:
    """N MPI engines with Horovod initialised, ready to train.

    >>> with Lab(workers=2) as lab:
    ...     run = lab.run(RunConfig())
    ...     run.wait()

    `verbose=True` prints one line when the engines are ready (in the cell that started them; it
    is also logged at INFO). `lab.ranks` maps rank -> engine id, pid and host.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        launcher: str = "mpi",
        threads_per_worker: int = 1,
        runs_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        start_timeout: float = 90,
        mpiexec: str | None = None,
        verbose: bool = True,
    ):
        _check_args(workers, launcher, threads_per_worker, start_timeout)
        self.workers = workers
        self.launcher = launcher
        self.threads_per_worker = threads_per_worker
        self.start_timeout = start_timeout
        self.runs_dir = Path(runs_dir) if runs_dir is not None else paths.runs_dir()
        self.data_dir = Path(data_dir) if data_dir is not None else paths.data_dir()
        self.verbose = verbose
        self._mpiexec = mpiexec
        self.client = None
        self.view = None
        self.ranks: list[dict] = []
        self.current_run: Run | None = None
        self.startup_s: float | None = None
        # controller_s, engines_s (registered), tf_import_s and horovod_init_s (slowest rank),
        # total_s: where a cold start goes (benchmarks/run.py reports them)
        self.startup_phases: dict[str, float] = {}
        self._cluster = None
        self._engine_ids: list[int] = []
        self._lost: str | None = None
        defaults = RunConfig()
        self._horovod = (defaults.hvd_cycle_time_ms, defaults.hvd_fusion_mb)
        _LIVE_LABS.add(self)  # before start(): an interrupted start still gets cleaned up at exit
        self.start()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the controller and `workers` MPI engines, then Horovod on each."""
        import ipyparallel as ipp
        from traitlets.config import Config

        from hpclab.rank import engine

        if self._cluster is not None:
            return
        t0 = time.perf_counter()
        config = Config()
        if self.launcher == "mpi":
            config.MPILauncher.mpi_cmd = [find_mpiexec(self._mpiexec)]
        # Engines inherit this environment: quiet TF, and no hidden thread oversubscription.
        env = {
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "OMP_NUM_THREADS": str(self.threads_per_worker),
            "PYTHONUNBUFFERED": "1",
            **horovod_env(*self._horovod),
        }
        config.EngineLauncher.environment = env
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        cluster = ipp.Cluster(
            engines=self.launcher,
            n=self.workers,
            config=config,
            engine_timeout=int(self.start_timeout),
            log_level=logging.ERROR,  # our own errors say what to do
            delay=0,  # engines get the connection info from the controller, no wait needed
            controller_args=[f"--ping={HEARTBEAT_MS}"],
        )
        self._cluster = cluster
        phases = {}
        try:
            # Cluster.start_and_connect, step by step so each phase is timed.
            cluster.start_controller_sync()
            phases["controller_s"] = time.perf_counter() - t0
            cluster.start_engines_sync(self.workers)
            self.client = cluster.connect_client_sync()
            self.client.wait_for_engines(
                self.workers, timeout=self.start_timeout, interactive=False
            )
            phases["engines_s"] = time.perf_counter() - t0 - phases["controller_s"]
        except (TimeoutError, ipp.error.TimeoutError, ipp.error.EngineError) as exc:
            output = self.launcher_output()
            self.stop()
            what = (
                "stopped before they registered"
                if isinstance(exc, ipp.error.EngineError)
                else f"did not register within {self.start_timeout:g} s"
            )
            raise LabError(
                f"{self.workers} MPI engines {what} ({exc}); check that `hpclab doctor` passes."
                + (f"\nmpiexec said:\n{output[-2000:]}" if output else "")
            ) from None
        except BaseException:  # anything else (Ctrl-C included): leave nothing running
            self.stop()
            raise
        _stop_forgotten_labs_first()  # ipyparallel has registered its exit hook by now
        ids = sorted(self.client.ids)
        try:
            identities = self.client[ids].apply_sync(engine.init_worker, self.threads_per_worker)
        except Exception as exc:  # ipyparallel wraps the engine's error; stop what we started
            self.stop()
            raise LabError(
                f"the engines started but could not initialise TensorFlow/Horovod "
                f"({exc}); run `hpclab doctor` to see which part is missing."
            ) from exc
        for phase in ("tf_import_s", "horovod_init_s"):
            phases[phase] = max(ident.pop(phase, 0.0) for ident in identities)
        order = sorted(range(len(ids)), key=lambda i: identities[i]["rank"])
        self._engine_ids = [ids[i] for i in order]
        self.ranks = [dict(identities[i], engine_id=ids[i]) for i in order]
        self.view = self.client[self._engine_ids]
        self._lost = None
        self.startup_s = time.perf_counter() - t0
        self.startup_phases = {**phases, "total_s": self.startup_s}
        ready = f"{self.workers} MPI engine(s) with Horovod ready in {self.startup_s:.1f} s"
        log.info(ready)
        if self.verbose:  # start() runs on the caller's thread: the user's cell, never a monitor
            print(f"hpclab: {ready}")

    def stop(self) -> None:
        """Stop a running run (if any), the engines and the controller."""
        if self.current_run is not None and not self.current_run.done and self._lost is None:
            self.current_run.stop(timeout=5)
        cluster, self._cluster = self._cluster, None
        if self.client is not None and self._lost is None and self._engine_ids:
            try:  # a clean exit lets Horovod and MPI finalise together (TERM alone takes 5 s)
                self.client.shutdown(targets=self._engine_ids, block=True)
            except Exception as exc:  # noqa: BLE001 — engines already gone: the cluster stop below cleans up
                log.info("engine shutdown reported %r; stopping the cluster cleans up", exc)
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 — closing a client whose engines died can fail; nothing to keep
                pass
        self.client = self.view = None
        if cluster is not None:
            cluster.stop_cluster_sync()

    def restart(self, workers: int | None = None) -> None:
        """Fresh engines (after a failure, or to change the number of workers)."""
        if workers is not None:
            _check_args(workers, self.launcher, self.threads_per_worker, self.start_timeout)
            self.workers = workers
        self.stop()
        self.start()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "lost" if self._lost else ("running" if self._cluster else "stopped")
        return f"<Lab workers={self.workers} launcher={self.launcher!r} {state}>"

    @property
    def healthy(self) -> bool:
        """Engines running and usable (False when stopped or lost)."""
        return self._cluster is not None and self._lost is None

    @property
    def lost(self) -> str | None:
        """Why the engines were lost (a sentence), or None; the next `run()` restarts them."""
        return self._lost

    def launcher_output(self) -> str:
        """What mpiexec and the engines printed (for naming a rank that died)."""
        if self._cluster is None:
            return ""
        text = []
        for engine_set in self._cluster.engines.values():
            # read the file, not get_output(): ipyparallel caches that on the first call
            path = getattr(engine_set, "output_file", "")
            if path and os.path.isfile(path):
                with open(path, errors="replace") as f:
                    text.append(f.read())
        return "".join(text)

    # -- runs -------------------------------------------------------------------------------------
    def run(self, cfg: RunConfig) -> Run:
        """Start `cfg` on every rank and return its `Run` at once."""
        from hpclab.rank import engine

        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"Lab.run needs a RunConfig; you passed {type(cfg).__name__}.")
        if self.current_run is not None and not self.current_run.done:
            raise LabError(
                f"run {self.current_run.run_id} is still running; call "
                "run.stop() or run.wait() before starting another."
            )
        cfg.global_batch(self.workers)  # validates workers against cfg (raises ConfigError)
        paths.check_staged(cfg, self.data_dir)  # before any rank waits for another
        wanted = (cfg.hvd_cycle_time_ms, cfg.hvd_fusion_mb)
        if self._lost is not None:
            log.warning("the previous engines were lost (%s); restarting them.", self._lost)
            self._horovod = wanted  # one restart, with the settings this run asks for
            self.restart()
        if wanted != self._horovod and self._cluster is not None:
            # Horovod reads these once, at hvd.init(): other values need fresh engines.
            log.warning(
                "restarting the engines for Horovod cycle time %g ms and fusion buffer %g MB "
                "(they were %g ms and %g MB).",
                *wanted,
                *self._horovod,
            )
            self._horovod = wanted
            self.restart()
        if self._cluster is None:
            raise LabError("this lab is stopped; call lab.start() or make a new Lab.")
        store = RunStore(self.runs_dir)
        store.create(
            {
                "config": cfg.to_dict(),
                "workers": self.workers,
                "derived": cfg.derived(self.workers),
                "lab": {
                    "launcher": self.launcher,
                    "threads_per_worker": self.threads_per_worker,
                    "horovod_env": horovod_env(*self._horovod),
                    "ranks": self.ranks,
                },
            }
        )
        results = [
            self.client[eid].apply_async(
                engine.train, cfg.to_dict(), str(store.path), str(self.data_dir)
            )
            for eid in self._engine_ids
        ]
        run = Run(
            config=cfg,
            workers=self.workers,
            store=store,
            results=results,
            ranks=self.ranks,
            on_engines_lost=self._engines_lost,
            abort=self._abort,
            launcher_output=self.launcher_output,
        )
        self.current_run = run
        return run

    def _engines_lost(self, why: str) -> None:
        self._lost = why

    def _abort(self) -> None:
        """Last resort: end the MPI job (signals land at different points on different ranks)."""
        import psutil  # ipyparallel's own dependency: its launchers raise psutil.NoSuchProcess

        if self._cluster is None:
            return
        try:
            self._cluster.signal_engines_sync(signal.SIGKILL)
        except (ProcessLookupError, psutil.NoSuchProcess) as exc:  # already gone: the usual case
            log.debug("aborting the engines: %r (already gone)", exc)
        except Exception as exc:  # noqa: BLE001 — from a run's monitor thread: log, never raise
            log.warning(
                "aborting the engines reported %r; if they still run, call lab.restart().", exc
            )

    def sweep(self, cfg: RunConfig, *, progress=None, **grid):
        from hpclab.sweep import run_sweep

        return run_sweep(self, cfg, progress=progress, **grid)

    def panel(self, **kwargs):
        """The control panel and live dashboard (kwargs go to `hpclab.views.panel.Panel`,
        e.g. `base=RunConfig(...)` for the knobs' starting values)."""
        from hpclab.views.panel import Panel

        return Panel(self, **kwargs).widget


# The controller's heartbeat (ipyparallel's HeartMonitor.period, 3000 ms by default): a new engine
# is ready at the first beat after it registers, and one that misses 10 beats is declared dead.
HEARTBEAT_MS = 1000


def horovod_env(cycle_time_ms: float, fusion_mb: float) -> dict[str, str]:
    """The environment that gives Horovod's background loop these settings at `hvd.init()`:
    the cycle between negotiation rounds and the tensor-fusion buffer (Horovod docs,
    "Tensor Fusion"; 0 MB turns fusion off)."""
    return {
        "HOROVOD_CYCLE_TIME": f"{cycle_time_ms:g}",
        "HOROVOD_FUSION_THRESHOLD": str(int(fusion_mb * 1024 * 1024)),
    }


def _stop_forgotten_labs() -> None:
    for lab in list(_LIVE_LABS):
        try:
            lab.stop()
        except Exception:  # noqa: BLE001 — interpreter shutdown: best effort only
            pass


def _stop_forgotten_labs_first() -> None:
    """(Re-)register the exit hook after ipyparallel's own: atexit runs the last registered first,
    so a forgotten lab still shuts its engines down cleanly (Horovod and MPI finalise together)
    before ipyparallel's hook stops whatever cluster is left."""
    atexit.unregister(_stop_forgotten_labs)
    atexit.register(_stop_forgotten_labs)


atexit.register(_stop_forgotten_labs)


__all__ = ["Lab", "LabError", "Run", "RunFailed", "find_mpiexec"]  # re-exported for hpclab
