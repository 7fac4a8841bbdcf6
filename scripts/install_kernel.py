"""Install the Jupyter kernel "Python (hpclab)" for this venv: `make kernel` runs it.

    python scripts/install_kernel.py                       # this user only (~/.local/share/jupyter)
    python scripts/install_kernel.py --prefix /usr/local   # every user: <prefix>/share/jupyter/kernels
    python scripts/install_kernel.py --sys-prefix          # a Jupyter that runs from this venv
    python scripts/install_kernel.py --prefix /opt/hub \\
        --env HPCLAB_PROFILE=gpu --env HPCLAB_DATA=/datasets/hpclab \\
        --setup "source /etc/profile.d/lmod.sh" --setup "module load cray-mpich/8.1"

`--env KEY=VALUE` goes into the kernel spec's `env` (Jupyter adds it to the kernel's
environment; jupyter_client's kernel spec format). `--setup` lines run in `bash` before the
kernel starts, in the order given, and the kernel then replaces that shell (`exec`), so
whatever they export (`module load ...`) is the kernel's environment, and the engines' (they
inherit it). A setup line that fails stops the kernel from starting (`set -e`): a kernel with
the wrong MPI would fail later, at every engine's `MPI_Init`. Prints the kernel's folder, and
for a kernel other users start (`--prefix`) a warning naming the first folder above this
install's Python or package that they cannot enter (`hpclab.tools.reachable`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def wrapped_argv(argv: list[str], setup: list[str]) -> list[str]:
    """The kernel's command line run after `setup` in one bash: `bash -c SCRIPT NAME ARGV...`
    ($0 is NAME, "$@" the kernel's own argv, `{connection_file}` left for Jupyter to fill)."""
    script = "set -e\n" + "\n".join(setup) + '\nexec "$@"\n'
    return ["/bin/bash", "-c", script, "hpclab-kernel", *argv]


def main(args: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--prefix", default="", help="install under PREFIX/share/jupyter/kernels")
    where.add_argument("--sys-prefix", action="store_true", help="install into this venv")
    p.add_argument("--name", default="hpclab")
    p.add_argument("--display-name", default="Python (hpclab)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--setup", action="append", default=[], metavar="LINE")
    opts = p.parse_args(args)
    env = {}
    for item in opts.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--env {item!r} must be KEY=VALUE")
        env[key] = value
    setup = [line for line in opts.setup if line.strip()]

    from ipykernel.kernelspec import install

    prefix = sys.prefix if opts.sys_prefix else opts.prefix or None
    folder = Path(
        install(
            user=prefix is None,
            kernel_name=opts.name,
            display_name=opts.display_name,
            prefix=prefix,
            env=env or None,
        )
    )
    spec_file = folder / "kernel.json"
    spec = json.loads(spec_file.read_text())
    if setup:
        spec["argv"] = wrapped_argv(spec["argv"], setup)
    spec.setdefault("metadata", {})["hpclab"] = {"setup": setup}
    spec_file.write_text(json.dumps(spec, indent=1) + "\n")
    print(folder)
    if opts.prefix:  # a kernel for every user of that Jupyter
        from hpclab.tools.reachable import sentence

        said = sentence()
        if said:
            print(f"WARNING: {said}", file=sys.stderr)
    return folder


if __name__ == "__main__":
    main()
