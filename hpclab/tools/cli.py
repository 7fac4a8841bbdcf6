"""The ``hpclab`` command line: ``hpclab <command> [options]``.

Each command is one entry in :data:`COMMANDS`: a help line, a function that adds the command's
options to its sub-parser, and a function that runs it and returns the exit code. The command
modules import their heavy dependencies (the lab, ipyparallel, plotly) only when their command
runs, so ``hpclab --help`` is quick and never imports TensorFlow (nothing on the client does:
only the engines import it).

Commands::

    hpclab doctor                      check the stack (versions, Horovod build, a 2-rank allreduce)
    hpclab run   [field options]       one run; --json prints its summary as one JSON line
    hpclab sweep [field options]       one run per combination of comma-separated values
    hpclab report RUN_DIR... -o FILE   one self-contained HTML report of recorded runs
    hpclab runs                        a table of the recorded runs
    hpclab profiles [NAME]             cluster profiles; one's launch plan, hub snippet, job script
    hpclab plan  [options]             time to target and GPU-hours at scale, from a short measurement

Where each lives: this module (parser, ``main``, the one-sentence error path),
:mod:`~hpclab.tools.cli_fields` (RunConfig fields as options: ``--batch-per-worker``,
``--lr-scaling {none,linear,sqrt}``, ``--image-shape 32,32,3``, ``--fp16-allreduce`` /
``--no-fp16-allreduce``, ..., each with the field's ``metadata["help"]`` as its help),
:mod:`~hpclab.tools.cli_run` (run, sweep), :mod:`~hpclab.tools.cli_progress` (stderr while a
run goes), :mod:`~hpclab.tools.cli_records` (report, runs), :mod:`~hpclab.tools.cli_profiles`
(profiles) and :mod:`~hpclab.tools.doctor`.

Exit codes of ``run`` and ``sweep`` (see :data:`EXIT_CODES`): 0 finished; 1 a run failed or was
stopped from outside; 2 a usage mistake (bad option or value, missing staged dataset, unknown run
folder, engines that cannot start) — one sentence on stderr, never a traceback; 3 the run
diverged (a result, not a crash: the learning rate was too high for that batch); 4 the run
collapsed (finite loss, but at chance level past warm-up: :mod:`hpclab.core.health`); 130 Ctrl-C, or
SIGTERM, SIGHUP or SIGUSR1 (Slurm's walltime warning `--signal=B:USR1@120`, `scancel`, a closed
terminal): the run is stopped collectively and its record kept, exactly as for Ctrl-C. A sweep exits 0 when every point ran to its end,
diverged and collapsed ones included, and 1 if any point failed or was stopped.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpclab.core.errors import ConfigError, LabError, RecordError, RunFailed
from hpclab.tools import cli_plan, cli_profiles, cli_run, doctor
from hpclab.tools import cli_records as cli_runs
from hpclab.tools.cli_progress import say
from hpclab.tools.cli_run import EXIT_CODES
from hpclab.tools.stop_signals import signals_stop_like_ctrl_c


@dataclass(frozen=True)
class Command:
    """One ``hpclab`` sub-command."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: name -> Command.
COMMANDS: dict[str, Command] = {
    "doctor": Command(
        help="check the stack: versions, Horovod build, devices, and a 2-rank MPI allreduce",
        configure=doctor.add_arguments,
        run=doctor.run,
    ),
    "run": Command(
        help="train once on N MPI workers and record the run",
        configure=cli_run.configure_run,
        run=cli_run.run,
    ),
    "sweep": Command(
        help="one run per combination of comma-separated values (resumable), then a report",
        configure=cli_run.configure_sweep,
        run=cli_run.sweep,
    ),
    "report": Command(
        help="write one self-contained HTML report of recorded runs",
        configure=cli_runs.configure_report,
        run=cli_runs.report,
    ),
    "runs": Command(
        help="list the recorded runs",
        configure=cli_runs.configure_runs,
        run=cli_runs.show_runs,
    ),
    "profiles": Command(
        help="list the cluster profiles, or show one with its launch plan, hub snippet, job script",
        configure=cli_profiles.configure,
        run=cli_profiles.run,
    ),
    "plan": Command(
        help="plan an allocation: time to target and GPU-hours at scale from a short measurement",
        configure=cli_plan.configure,
        run=cli_plan.run,
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one sentence (not the whole usage block) and exit 2;
    options are spelled out (no prefixes: a new option would turn a script's `--e` from one
    option into an error, as `--eval-every` did to `--epochs`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_CODES["usage"], f"{self.prog}: {message} (see `{self.prog} --help`).\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per entry of :data:`COMMANDS`."""
    parser = _Parser(
        prog="hpclab",
        description="Data-parallel deep learning lab: MPI engines, TensorFlow/Keras under Horovod.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, command in COMMANDS.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: ``sys.argv[1:]``), run the command and return its exit code.

    The user's mistakes — a bad value (ConfigError), a missing file or run folder
    (FileNotFoundError), an unreadable run file named on the command line (RecordError), engines
    that cannot start (LabError), a folder it cannot write (OSError) — end as one sentence on
    stderr and
    exit status 2; a run that failed (RunFailed) as one sentence and status 1. Anything else is a
    bug in hpclab and keeps its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_CODES["usage"]
    try:
        with signals_stop_like_ctrl_c(say):
            return COMMANDS[args.command].run(args)
    except (ConfigError, FileNotFoundError, LabError, RecordError) as exc:
        say(f"hpclab {args.command}: {_sentence(exc)}")
        return EXIT_CODES["usage"]
    except RunFailed as exc:
        say(f"hpclab {args.command}: {_sentence(exc)}")
        return EXIT_CODES["failed"]
    except OSError as exc:  # a folder not writable, a full disk: the file and the reason
        say(f"hpclab {args.command}: {_sentence(exc)}")
        return EXIT_CODES["usage"]
    except KeyboardInterrupt:  # e.g. during engine start-up; runs handle Ctrl-C themselves
        say(f"\nhpclab {args.command}: interrupted.")
        return EXIT_CODES["interrupted"]


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename and not str(exc.args[0]).endswith("."):
        text = f"{exc.filename} does not exist."
    elif isinstance(exc, OSError) and exc.filename and exc.strerror:
        text = f"{exc.filename}: {exc.strerror.lower()}."
    return text


__all__ = ["Command", "COMMANDS", "EXIT_CODES", "build_parser", "main"]


if __name__ == "__main__":
    sys.exit(main())
