"""The ``hpclab`` command line: ``hpclab <command> [options]``.

Each command is one entry in :data:`COMMANDS`: a help line, a function that adds the command's
options to its sub-parser, and a function that runs it and returns the exit code. Command
modules are imported only when their command runs, so ``hpclab --help`` never imports
TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Command:
    """One ``hpclab`` sub-command."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _doctor_configure(parser: argparse.ArgumentParser) -> None:
    from hpclab import doctor

    doctor.add_arguments(parser)


def _doctor_run(args: argparse.Namespace) -> int:
    from hpclab import doctor

    return doctor.run(args)


#: name -> Command; add run / sweep / report here.
COMMANDS: dict[str, Command] = {
    "doctor": Command(
        help="check the stack: versions, Horovod build, devices, and a 2-rank MPI allreduce",
        configure=_doctor_configure,
        run=_doctor_run,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="hpclab",
        description="Data-parallel deep learning lab: MPI engines, TensorFlow/Keras under Horovod.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, command in COMMANDS.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: ``sys.argv[1:]``), run the command and return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return COMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
