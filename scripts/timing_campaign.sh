#!/usr/bin/env bash
# Repeat the timing-sensitive tests (pytest marker `timing`: they assert on measured durations or
# rates) N times in a row and say how many passes were green: the check that a timing claim holds
# on this machine, not only once.
#
#   scripts/timing_campaign.sh [--passes N] [--one-core] [-- extra pytest args]
#
# --one-core pins the tests and every rank to CPU 0 (`taskset -c 0`): two ranks then time-slice
# one core, as on a slower machine or an oversubscribed node. Tests that cannot judge their claim
# there skip and say why. Run it on an otherwise idle machine: other work on the cores is part of
# what these tests measure. Each pass's pytest output goes to runs/.timing-campaign/<mode>-<k>.log;
# a summary line per pass and a final count are printed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
passes=5
one_core=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --passes) passes="$2"; shift 2 ;;
    --one-core) one_core=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "timing_campaign: unknown option '$1' (allowed: --passes N, --one-core, -- pytest args)" >&2; exit 2 ;;
  esac
done
[[ "$passes" =~ ^[1-9][0-9]*$ ]] || { echo "timing_campaign: --passes must be a positive integer, got '$passes'" >&2; exit 2; }
PY="${HPCLAB_VENV:-.venv}/bin/python"
mode="two-cores"; pin=()
if [[ $one_core == 1 ]]; then mode="one-core"; pin=(taskset -c 0); fi
out="runs/.timing-campaign"; mkdir -p "$out"
green=0
for k in $(seq 1 "$passes"); do
  log="$out/$mode-$k.log"
  t0=$SECONDS
  HPCLAB_REQUIRE_MPI=1 "${pin[@]}" "$PY" -m pytest -m timing -p no:cacheprovider -q -rs \
    "${extra[@]}" tests > "$log" 2>&1
  rc=$?
  summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed)|passed|failed' "$log" | tail -n 1)"
  echo "[timing] $mode pass $k/$passes: exit $rc in $((SECONDS - t0)) s: $summary"
  [[ $rc == 0 ]] && green=$((green + 1))
done
echo "[timing] $mode: $green of $passes passes green (logs in $out/)"
[[ $green == "$passes" ]]
