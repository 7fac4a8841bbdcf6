"""Which libmpi the installed Horovod links: read from the files, without importing Horovod.

Used by `hpclab doctor` at run time and by `scripts/horovod_cache.py` at install time, so both
judge a Horovod build by the same rule.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re


def parse_ldd_libmpi(ldd_output: str) -> tuple[str, str | None] | None:
    """The ``libmpi`` line of ``ldd`` output as (soname, resolved path or None if not found).

    Returns None when the object does not depend on any ``libmpi``. Open MPI's language
    bindings (``libmpi_cxx``, ``libmpi_mpifh``, ``libmpi_usempi*``, ``libmpi_java``) are not the
    MPI library and are skipped: Horovod's ops link ``libmpi_cxx.so.40`` before ``libmpi.so.40``;
    Cray MPICH's ``libmpi_cray`` / ``libmpi_gnu_123`` are the library itself.
    """
    for line in ldd_output.splitlines():
        match = re.match(
            r"\s*(libmpi(?:_(?!cxx|mpifh|usempi|java)\w+)?\.so[.\d]*)\s*=>\s*(\S+)", line
        )
        if match:
            soname, target = match.groups()
            return soname, (None if target == "not" else target)
    return None


def horovod_mpi_libs() -> list[str]:
    """Paths of the installed Horovod's TensorFlow MPI ops library (found without importing)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[str] = []
    for location in spec.submodule_search_locations:
        found += glob.glob(os.path.join(location, "tensorflow", "mpi_lib*.so"))
    return sorted(found)


__all__ = ["parse_ldd_libmpi", "horovod_mpi_libs"]
