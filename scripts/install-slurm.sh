#!/usr/bin/env bash
# Slurm + MUNGE for the single-host Slurm tests (tests/slurm/), from Debian's packages.
#
# Idempotent: does nothing when slurmctld, slurmd, srun and munged are all on PATH. Installing
# needs root (CI runs as root); without root it prints what to do and exits 0, and the Slurm
# tests (pytest -m slurm) then skip with a reason (or fail when HPCLAB_REQUIRE_SLURM=1).
# No daemon is started here and no /etc file is edited: tests/slurm/cluster.py writes its own
# slurm.conf and munge key under a temp dir and starts munged/slurmctld/slurmd itself.
# --no-install-recommends keeps out slurm-wlm-plugins (mysql, hdf5, ...); sudo is for the
# JupyterHub test (batchspawner's default exec_prefix is `sudo -E -u {username}`); nftables and
# iproute2 for the multi-host test (tests/test_multihost.py: namespaces, a bridge, a firewall).
set -euo pipefail

if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
   && command -v srun >/dev/null && command -v munged >/dev/null \
   && command -v sudo >/dev/null && command -v nft >/dev/null && command -v ip >/dev/null; then
  echo "==> [slurm] $(slurmctld -V 2>/dev/null || echo slurm) and munge already installed"
  exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "==> [slurm] NOTE: Slurm/MUNGE are missing and installing them needs root; ask an admin for" \
       "\`apt-get install --no-install-recommends slurmctld slurmd slurm-client munge sudo\`." \
       "The Slurm tests (pytest -m slurm) will skip until then."
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "==> [slurm] NOTE: no apt-get on this machine; install Slurm (slurmctld, slurmd, srun)" \
       "and MUNGE to run the Slurm tests (they skip until then)."
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
PKGS=(slurmctld slurmd slurm-client munge sudo nftables iproute2)
# The package lists here may be stale or lack -updates/-security: refresh them unless every
# package already has an install candidate.
if ! apt-get install -s -q --no-install-recommends "${PKGS[@]}" >/dev/null 2>&1; then
  echo "==> [slurm] apt-get update"
  apt-get update -q
fi
echo "==> [slurm] installing ${PKGS[*]} with apt-get"
if ! apt-get install -y -q --no-install-recommends "${PKGS[@]}"; then
  # A candidate from stale lists may be gone from the mirror: refresh once and retry.
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${PKGS[@]}"
fi
echo "==> [slurm] $(slurmctld -V 2>/dev/null || echo slurm) installed"
