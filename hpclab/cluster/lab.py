"""`Lab`: the lifecycle of N ipyparallel MPI engines running Horovod, and runs on them.

Start/stop come in pairs (ipyparallel's own style); `with Lab(...) as lab:` tears everything
down, and an `atexit` hook stops labs a notebook forgot. TensorFlow and Horovod are imported only
on the engines (by `hpclab.rank.engine`), never here.

Messages go to the ``hpclab.cluster.lab`` logger (no handler of our own: an application's logging
configuration decides). Warnings a user must act on show even without any configuration, through
Python's last-resort handler on stderr; the lab's state is also on the object (`healthy`, `lost`,
`repr(lab)`), and the panel's status line says the same.
"""

from __future__ import annotations

import atexit
import logging
import os
import platform
import time
import weakref
from dataclasses import replace
from pathlib import Path

from hpclab.cluster import host, profiles, site_mpi
from hpclab.cluster.engines import EngineSet
from hpclab.cluster.host import find_mpiexec
from hpclab.cluster.idle import IdleStop, check_after
from hpclab.cluster.lab_args import (
    LAUNCHERS,
    check_args,
    check_groups,
    cpus_for,
    settings_of,
    threads_for,
)
from hpclab.cluster.launch import plan_launch
from hpclab.cluster.profiles import Profile
from hpclab.cluster.resume import prepare as prepare_resume
from hpclab.cluster.run import Run
from hpclab.cluster.world import check_world
from hpclab.core import devices
from hpclab.core.catalog import check_user_model
from hpclab.core.config import RunConfig
from hpclab.core.engine_settings import EngineSettings
from hpclab.core.errors import ConfigError, LabError
from hpclab.rank.features.groups import across_nodes
from hpclab.records import paths
from hpclab.records.store import RunStore

INIT_TIMEOUT_S = 300  # importing TensorFlow and hvd.init() on every engine, however busy
log = logging.getLogger(__name__)
_LIVE_LABS: weakref.WeakSet[Lab] = weakref.WeakSet()


class Lab:
    """N MPI engines with Horovod initialised, ready to train.

    >>> with Lab(workers=2) as lab:
    ...     run = lab.run(RunConfig())
    ...     run.wait()

    Where and how the engines start comes from a cluster profile (`hpclab.cluster.profiles`):
    `profile=` (a name, a TOML path or a `Profile`), else `$HPCLAB_PROFILE`, else auto-detection
    (inside a Slurm allocation: `srun`; elsewhere: `mpiexec` on this machine). `nodes=` spreads
    the engines over that many nodes. `start_timeout` bounds registration (None: the profile's,
    90 s on this machine). `verbose=True` prints one line when the engines are ready (and the
    queue state while a Slurm job waits). `lab.ranks` maps rank -> engine id, pid, host, node,
    and its resident memory at start (`rss_mib`, `peak_rss_mib`). `idle_stop_s=` stops the
    engines after that many idle seconds (an idle engine spins: hpclab.cluster.idle); the next
    run or `apply` starts them again. `gpus=` says the ranks must have GPUs (None: when the
    profile's node.gpus asks for them): a rank that sees none fails the start with a sentence
    naming it; each rank's GPU (index, uuid, name) is in `lab.ranks` (hpclab.core.devices).
    `threads_per_worker` (-c and OMP_NUM_THREADS; None: 1, or 2 on GPU ranks as the CPUs allow,
    hpclab.cluster.lab_args.threads_for; the profile's node.threads_per_worker wins).

    What Horovod reads once, at ``hvd.init()``, is the lab's, not a run's:
    ``engine_settings=EngineSettings(cycle_time_ms=..., fusion_mb=...)``
    (hpclab.core.engine_settings; `lab.engine_settings` holds the current ones, and
    ``lab.restart(settings=...)`` changes them). `groups` registers that many synchronous groups
    as Horovod process sets at start, for ``update="hybrid"`` runs (hpclab.rank.features.groups;
    the same as ``engine_settings=EngineSettings(groups=G)``). A run that needs other settings
    (a hybrid run with other groups, a run recording a timeline) restarts the engines once
    (:meth:`EngineSettings.for_run`).
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        profile: str | Path | Profile | None = None,
        nodes: int = 0,
        launcher: str | None = None,
        threads_per_worker: int | None = None,
        runs_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        start_timeout: float | None = None,
        mpiexec: str | None = None,
        groups: int = 1,
        engine_settings: EngineSettings | None = None,
        idle_stop_s: float | None = None,
        gpus: int | None = None,
        verbose: bool = True,
    ):
        check_args(workers, launcher, threads_per_worker, start_timeout, nodes, mpiexec, groups)
        settings = settings_of(engine_settings, groups)
        check_groups(workers, settings.groups)
        self.profile, self.profile_reason = profiles.resolve(profile)
        if launcher is not None:
            mode = LAUNCHERS[launcher]
            self.profile = replace(self.profile, launch=replace(self.profile.launch, mode=mode))
        profiles.check_login_node(self.profile, self.profile_reason, launcher)  # before any start
        self.workers = workers
        self.nodes = nodes
        # GPUs the ranks expect (None: the profile's node.gpus): a rank that sees none fails the start
        self.gpus = self.profile.node.gpus if gpus is None else devices.check_gpus_arg(gpus)
        self._threads_asked = threads_per_worker  # None: 1, or 2 on GPU ranks (_threads)
        self.start_timeout = start_timeout
        default_runs, default_data = profiles.folders(self.profile)
        self.runs_dir = paths.check_folder(runs_dir or default_runs, "runs_dir")  # before any
        self.data_dir = paths.check_folder(data_dir or default_data, "data_dir")  # engine starts
        self.verbose = verbose
        state = paths.state_root(self.runs_dir, self.profile.paths.state)
        where, own = paths.where(self.runs_dir, self.data_dir, state)
        (self._say if own else log.info)(where)  # a user's own folder is said: docs say checkout
        self._mpiexec = mpiexec or self.profile.launch.mpiexec or None
        self.client = None
        self.view = None
        self.ranks: list[dict] = []
        self.plan = None  # the LaunchPlan of the running engines (hpclab.cluster.launch)
        self.threads_per_worker = self._threads(workers)
        self.current_run: Run | None = None
        self.startup_s: float | None = None
        # controller_s, queue_s (a Slurm job waiting), engines_s (registered), tf_import_s and
        # horovod_init_s (slowest rank), total_s: where a cold start goes (benchmarks/run.py)
        self.startup_phases: dict[str, float] = {}
        self._engines: EngineSet | None = None
        self._engine_ids: list[int] = []
        self._lost: str | None = None
        self._settings = settings
        self._idle = IdleStop(self, check_after(idle_stop_s))
        _LIVE_LABS.add(self)  # before start(): an interrupted start still gets cleaned up at exit
        self.start()

    @property
    def launcher(self) -> str:
        """How the engines start: 'mpiexec', 'srun' or 'sbatch' (from the plan or profile)."""
        if self.plan is not None:
            return self.plan.mode
        mode = self.profile.launch.mode
        return mode if mode != "auto" else ("srun" if os.environ.get("SLURM_JOB_ID") else "mpiexec")

    def _threads(self, workers: int) -> int:
        """Threads per worker for `workers` (hpclab.cluster.lab_args.threads_for: the profile's,
        else the one passed, else 2 on GPU ranks as the CPUs allow, else 1)."""
        cpus = cpus_for(self.launcher, dict(os.environ), os.cpu_count())
        node = self.profile.node.threads_per_worker
        threads, why = threads_for(self._threads_asked, node, self.gpus, workers, cpus)
        if self._threads_asked is None and self.gpus > 0:
            log.info("threads_per_worker=%d: %s", threads, why)
        return threads

    # -- lifecycle ------------------------------------------------------------------------------
    def make_plan(self):
        """The LaunchPlan `start()` would execute now (hpclab.cluster.launch.plan_launch); no side effect."""
        import uuid

        mode = self.profile.launch.mode
        local = mode == "mpiexec" or (mode == "auto" and not os.environ.get("SLURM_JOB_ID"))
        return plan_launch(
            self.profile,
            self.workers,
            self.threads_per_worker,
            self.nodes,
            dict(os.environ),
            cluster_id=f"{int(time.time())}-{uuid.uuid4().hex[:6]}",
            state_root=str(paths.state_root(self.runs_dir, self.profile.paths.state)),
            mpiexec=find_mpiexec(self._mpiexec) if local else "",
            interfaces=host.interfaces() if self.profile.network.interface else {},
            registration_timeout_s=self.start_timeout,
            horovod=self._settings.env(),
            **site_mpi.plan_facts(self.profile.slurm.srun_mpi, local, self.profile.launch.python),
        )

    def start(self) -> None:
        """Start the controller and `workers` MPI engines, then Horovod on each; check the world.
        Interrupted (Ctrl-C) at any moment, it stops what it started and raises
        KeyboardInterrupt."""
        if self._engines is not None:
            return
        t0 = time.perf_counter()
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.plan = plan = self.make_plan()
        for note in plan.notes:
            log.info("launch plan: %s", note)
        self._engines = EngineSet(plan, on_status=self._say)
        try:
            self._start_engines(t0)
        except KeyboardInterrupt:  # Ctrl-C at any moment of the start: leave nothing running
            self.stop()
            raise

    def _start_engines(self, t0: float) -> None:
        from hpclab.rank import engine

        self.client = self._engines.start()  # raises LabError and leaves nothing running
        self.plan = plan = self._engines.plan  # a second controller has a plan of its own
        _stop_forgotten_labs_first()  # ipyparallel has registered its exit hook by now
        ids = sorted(self.client.ids)
        probe = self.runs_dir / f".probe-{plan.cluster_id}"
        probe.write_text(plan.cluster_id)
        try:  # bounded: a rank stopped or hung during start must not hang the caller
            identities = (
                self.client[ids]
                .apply_async(engine.init_worker, plan.threads, (str(probe), plan.cluster_id))
                .get(timeout=INIT_TIMEOUT_S)
            )
        except Exception as exc:  # ipyparallel wraps the engine's error; stop what we started
            self.stop()
            raise LabError(
                f"the engines started but could not initialise TensorFlow/Horovod "
                f"({type(exc).__name__}: {exc}); run `hpclab doctor` to see which part is missing."
            ) from exc
        finally:
            probe.unlink(missing_ok=True)
        errors, warnings = check_world(
            identities, self.workers, plan.threads, plan.mode, plan.srun_mpi, plan.engine_env
        )
        gpu_errors, gpu_warnings = devices.check_gpus(identities, expected=self.gpus > 0)
        errors, warnings = errors + gpu_errors, warnings + gpu_warnings
        if errors:
            self.stop()
            raise LabError(" ".join(errors))
        for warning in warnings:
            log.warning(warning)
        phases = dict(self._engines.phases)
        for phase in ("tf_import_s", "horovod_init_s"):
            phases[phase] = max(ident.pop(phase, 0.0) for ident in identities)
        order = sorted(range(len(ids)), key=lambda i: identities[i]["rank"])
        self._engine_ids = [ids[i] for i in order]
        self.ranks = [dict(identities[i], engine_id=ids[i]) for i in order]
        for rank in self.ranks:
            rank.pop("runs_dir_shared", None)
        self.view = self.client[self._engine_ids]
        self._lost = None
        self.startup_s = time.perf_counter() - t0
        self.startup_phases = {**phases, "total_s": self.startup_s}
        where = f" ({plan.mode}, profile {plan.profile})" if plan.mode != "mpiexec" else ""
        self._say(
            f"{self.workers} MPI engine(s) with Horovod ready in {self.startup_s:.1f} s{where}"
        )

    def _say(self, text: str) -> None:
        log.info(text)
        if self.verbose:  # start() runs on the caller's thread: the user's cell, never a monitor
            print(f"hpclab: {text}", flush=True)

    def stop(self) -> None:
        """Stop a running run (if any), the engines and the controller; bounded in time."""
        self._idle.cancel()
        if self.current_run is not None and not self.current_run.done and self._lost is None:
            try:
                self.current_run.stop(timeout=5)
            except Exception as exc:  # noqa: BLE001 — the engines must go even if the record can't
                log.warning("stopping the run reported %r; stopping the engines anyway", exc)
        if self.current_run is not None:  # still setting up: it ends with the engines, 'stopped'
            self.current_run.end_with_lab()
        engines, self._engines = self._engines, None
        self.client = self.view = None
        if engines is not None:
            engines.stop(clean=self._lost is None)  # lost engines cannot answer a clean shutdown

    @property
    def engine_settings(self) -> EngineSettings:
        """What Horovod read at ``hvd.init()`` on these engines (or will, at the next start)."""
        return self._settings

    def restart(
        self,
        workers: int | None = None,
        cfg: RunConfig | None = None,
        settings: EngineSettings | None = None,
    ) -> None:
        """Fresh engines: after a failure, for another number of workers, or with other
        ``settings`` (:class:`EngineSettings`); with ``cfg``, started with the settings its run
        needs (:meth:`EngineSettings.for_run`), so that run restarts nothing."""
        if workers is not None:
            check_args(workers, None, self._threads_asked, self.start_timeout, self.nodes, None)
        n = self.workers if workers is None else workers
        if settings is None:  # the current ones; groups that no longer divide the ranks: none
            wanted = self._settings.for_workers(n)
        else:
            wanted = settings_of(settings, 1)  # (checks its type)
        check_groups(n, wanted.groups)
        self.workers = n
        self.threads_per_worker = self._threads(n)
        self._settings = wanted if cfg is None else wanted.for_run(cfg, n)
        self.stop()
        self.start()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "lost" if self._lost else ("running" if self._engines else "stopped")
        return (
            f"<Lab workers={self.workers} launcher={self.launcher!r} "
            f"profile={self.profile.name!r} {state}>"
        )

    @property
    def healthy(self) -> bool:
        """Engines running and usable (False when stopped or lost)."""
        return self._engines is not None and self._lost is None

    @property
    def lost(self) -> str | None:
        """Why the engines were lost (a sentence), or None; the next `run()` restarts them."""
        return self._lost

    def launcher_output(self) -> str:
        """What mpiexec/srun and the engines printed (for naming a rank that died)."""
        return self._engines.output() if self._engines is not None else ""

    # -- runs -------------------------------------------------------------------------------------
    def ready_for(self, cfg: RunConfig) -> None:
        """Engines that can run ``cfg``: restarted if they were lost, or if Horovod must read
        other settings at ``hvd.init()`` for it (:meth:`EngineSettings.for_run`, the one rule)."""
        wanted = self._settings.for_run(cfg, self.workers)
        if self._lost is not None:
            log.warning("the previous engines were lost (%s); restarting them.", self._lost)
            self.restart(settings=wanted)  # one restart, with the settings this run asks for
        elif wanted != self._settings and self._engines is not None:
            # Horovod reads these once, at hvd.init(): other values need fresh engines.
            log.warning(
                "restarting the engines for Horovod %s (they had %s).",
                wanted.describe(),
                self._settings.describe(),
            )
            self.restart(settings=wanted)
        if self._engines is None:
            raise LabError("this lab is stopped; call lab.start() or make a new Lab.")
        split = cfg.update == "hybrid" and across_nodes([r["host"] for r in self.ranks], cfg.groups)
        if split:
            log.warning(
                "hybrid groups %s have ranks on more than one node: their every-step allreduce "
                "crosses the network (choose groups so each node's ranks are whole groups).",
                split,
            )

    def run(self, cfg: RunConfig | None = None, *, resume=None, rescale: str | None = None) -> Run:
        """Start `cfg` on every rank and return its `Run` at once.

        ``resume=``: a stopped, failed or abandoned run (its Run, RunRecord, id or folder)
        goes on in its own folder from its latest checkpoint (hpclab.cluster.resume); ``cfg``
        then defaults to the recorded one, and may differ only in hpclab.cluster.resume.FREE.
        On another number of workers than recorded, ``rescale=`` "keep_global_batch" or
        "keep_per_rank_batch" says how the batch and LR follow (not bit for bit)."""
        with self._idle.active():  # engines stopped while idle start again
            return self._run(cfg, resume, rescale)

    def _run(self, cfg: RunConfig | None, resume, rescale: str | None = None) -> Run:
        from hpclab.rank import engine

        resuming = None
        if resume is not None:  # checked before any engine works
            resuming = prepare_resume(resume, cfg, self.workers, self.runs_dir, rescale)
            cfg = resuming.cfg
        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"Lab.run needs a RunConfig; you passed {type(cfg).__name__}.")
        if self.current_run is not None and not self.current_run.done:
            raise LabError(
                f"run {self.current_run.run_id} is still running; call "
                "run.stop() or run.wait() before starting another."
            )
        plan = cfg.for_workers(self.workers)  # validates workers against cfg (ConfigError)
        paths.check_staged(cfg, self.data_dir)  # before any rank waits for another
        check_user_model(cfg.model)  # your own model's module can be found here
        self.ready_for(cfg)
        client = {"pid": os.getpid(), "host": platform.node()}  # records/store.py: abandoned?
        if resuming is not None:
            store = resuming.open_store(client)
        else:
            store = RunStore(self.runs_dir)
            store.create(
                {
                    "config": cfg.to_dict(),
                    "workers": self.workers,
                    "derived": plan.derived(),
                    "client": client,
                    "lab": {
                        "launcher": self.launcher,
                        "launch": self.plan.record(),
                        "threads_per_worker": self.threads_per_worker,
                        "engine_settings": self._settings.to_dict(),
                        "horovod_env": self._settings.env(),
                        "ranks": self.ranks,
                    },
                }
            )
        results = [
            self.client[eid].apply_async(
                engine.train,
                cfg.to_dict(),
                plan.to_dict(),
                str(store.path),
                str(self.data_dir),
                str(resuming.checkpoint) if resuming is not None else None,
                resuming.start_step if resuming is not None else None,
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
            link_state=self._link_state,
            stall_s=self._settings.stall_s,
            resumed=resuming.resumed if resuming is not None else None,
        )
        self.current_run = run
        return run

    def apply(self, fn, *args, timeout: float = 900.0, **kwargs) -> list:
        """``fn(*args, **kwargs)`` on every rank at once; the results in rank order.

        For studies that run their own collectives on the ranks (hpclab.studies); ``fn`` must be
        importable on the engines. Lost engines are restarted first, as by `run()`. A rank that
        raises ends the call with a LabError naming it. A rank that dies, or ranks still busy
        ``timeout`` seconds in (or 10 s after another rank raised: they wait in a collective for
        ever), end every rank, like a run that loses its engines: the next call restarts them.
        """
        with self._idle.active():  # engines stopped while idle start again
            return self._apply(fn, *args, timeout=timeout, **kwargs)

    def _apply(self, fn, *args, timeout: float, **kwargs) -> list:
        if self._lost is not None:
            log.warning("the previous engines were lost (%s); restarting them.", self._lost)
            self.restart()
        if self._engines is None:
            raise LabError("this lab is stopped; call lab.start() or make a new Lab.")
        results = [self.client[eid].apply_async(fn, *args, **kwargs) for eid in self._engine_ids]
        end = time.monotonic() + timeout
        while not all(r.ready() for r in results) and time.monotonic() < end:
            if any(r.ready() and not r.successful() for r in results):
                end = min(end, time.monotonic() + 10.0)
            time.sleep(0.05)
        outcomes = [r.get(return_exceptions=True) if r.ready() else None for r in results]
        errors = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
        busy = [i for i, r in enumerate(results) if not r.ready()]
        if not errors and not busy:
            return outcomes
        name = getattr(fn, "__qualname__", repr(fn))
        if errors:
            i, exc = errors[0]
            what = f"rank {i} raised {getattr(exc, 'ename', type(exc).__name__)}: "
            what += str(getattr(exc, "evalue", exc))
        else:
            what = f"rank(s) {busy} still ran after {timeout:g} s"
        dead = any(getattr(o, "ename", type(o).__name__) == "EngineError" for _, o in errors)
        if not (busy or dead):
            raise LabError(f"{name} failed on the lab's ranks: {what}.")
        why = f"{name} on the lab's ranks: {what}; every rank was ended"
        self._abort()
        self._lost = why
        raise LabError(f"{why} — call lab.restart() for a fresh set (the next run does it).")

    def _engines_lost(self, why: str) -> None:
        self._lost = why

    def _abort(self) -> None:
        """Last resort: end the MPI job (signals land at different points on different ranks),
        and kill this host's ranks by pid (a stopped or hung rank ignores a forwarded SIGTERM)."""
        if self._engines is not None:
            self._engines.abort(pids=[r["pid"] for r in self.ranks if r["host"] == platform.node()])

    def _link_state(self) -> str:
        """Why ranks cannot reach the client: a sentence, or '' while controller and launcher run."""
        return self._engines.link_state() if self._engines is not None else ""

    def sweep(self, cfg: RunConfig, *, progress=None, **grid):
        from hpclab.records.sweep import run_sweep

        return run_sweep(self, cfg, progress=progress, **grid)

    def panel(self, **kwargs):
        """The control panel and live dashboard (kwargs go to `hpclab.views.panel.panel.Panel`:
        `preset="quick"` (a name in `hpclab.core.presets`) or `base=RunConfig(...)` sets the knobs'
        starting values; the workshop preset by default)."""
        from hpclab.views.panel.panel import Panel

        return Panel(self, **kwargs).widget


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


__all__ = ["Lab"]
