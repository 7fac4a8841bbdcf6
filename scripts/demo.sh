#!/usr/bin/env bash
# `make demo`: 2 workers on MNIST-1D: batch size vs learning-rate rule, and the learning-rate window
# of momentum SGD vs LARS at the largest batch. One self-contained HTML report opens with what the
# runs show, in sentences computed from their numbers (hpclab/views/charts/lessons.py).
#
# Every run starts from the workshop preset (hpclab.core.presets: MNIST-1D, 40,960 samples, the 1-D CNN,
# momentum 0.9, base_lr 0.05 tuned at global batch 64) with 10 epochs, a 2-epoch warm-up from
# peak x 64/B up to the peak, then polynomial (power 2) decay as in the LARS paper.
#   sweep 1  momentum SGD, lr not scaled vs linear scaling (Goyal et al. 2017), per worker 64,
#            256, 1024 (global 128, 512, 2048): without scaling the large batches under-train;
#            linear scaling helps until its peak lr (0.05 x 2048/64 = 1.6) is too much;
#   sweep 2  LARS (trust coefficient 0.01, You et al. 2017), linear scaling, the same batches and
#            peak lrs: where SGD fails at 2048, does the layer-wise trust ratio train?
#   sweep 3  the window: at global batch 2048, peak lr 0.1 .. 6.4 for momentum SGD and for LARS,
#            tagged lr-window: the range of learning rates each one trains at.
# Finished, diverged and collapsed runs are results and are reused, so a second `make demo` only
# rewrites the report (delete the runs folder to start over). Overridable: HPCLAB_DEMO_RUNS,
# HPCLAB_DEMO_EPOCHS.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
HPCLAB=.venv/bin/hpclab
RUNS="${HPCLAB_DEMO_RUNS:-runs/demo}"
EPOCHS="${HPCLAB_DEMO_EPOCHS:-10}"
T0=$SECONDS

COMMON=(--workers 2 --runs-dir "$RUNS" --preset workshop
        --epochs "$EPOCHS" --warmup-epochs 2 --lr-schedule poly)
LARS=(--optimizer lars --lars-eta 0.01)

echo "==> [demo] sweep 1/3: momentum SGD, learning rate not scaled vs linear scaling + warm-up"
"$HPCLAB" sweep "${COMMON[@]}" --batch-per-worker 64,256,1024 --optimizer momentum \
    --lr-scaling none,linear

echo "==> [demo] sweep 2/3: LARS (trust coefficient 0.01), linear scaling + warm-up"
"$HPCLAB" sweep "${COMMON[@]}" --batch-per-worker 64,256,1024 "${LARS[@]}" --lr-scaling linear

echo "==> [demo] sweep 3/3: the learning-rate window at global batch 2048 (peak lr 0.1 .. 6.4)"
WINDOW=(--batch-per-worker 1024 --lr-scaling linear --tags lr-window
        --base-lr 0.003125,0.0125,0.025,0.05,0.1,0.2)
"$HPCLAB" sweep "${COMMON[@]}" "${WINDOW[@]}" --optimizer momentum
"$HPCLAB" sweep "${COMMON[@]}" "${WINDOW[@]}" "${LARS[@]}"

echo "==> [demo] recorded runs"
"$HPCLAB" runs --runs-dir "$RUNS"

echo "==> [demo] report"
REPORT=$("$HPCLAB" report "$RUNS" -o "$RUNS/report.html" \
         --title "hpclab demo: batch size, learning-rate rules and the LR window (MNIST-1D, 2 workers)")
echo "==> [demo] done in $((SECONDS - T0)) s; open the report:"
echo "$(cd "$(dirname "$REPORT")" && pwd)/$(basename "$REPORT")"
