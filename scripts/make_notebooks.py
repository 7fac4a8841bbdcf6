#!/usr/bin/env python
"""Build the workshop notebooks in notebooks/ from the cells below (stored without outputs).

    .venv/bin/python scripts/make_notebooks.py          # rewrite notebooks/*.ipynb
    .venv/bin/python scripts/make_notebooks.py --check  # exit 1 if a stored notebook differs

Edit the cells here, not the .ipynb files: the notebooks stay thin, consistent with each other
and free of outputs, and tests/test_notebooks.py checks that the stored files match this script.
Cell ids are fixed (``<notebook>-<nn>``) so rebuilding gives byte-identical files.

Style (docs/architecture.md, DESIGN "Style"): imports, a preset, calls into hpclab, prose that
teaches; no ``def``, no ``%%px``, no training code, no absolute paths. Every claim a notebook makes
is something the notebook itself measures and shows; where a number could go either way the
prose asks the reader to compare, and GPU-only claims say so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "notebooks"

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def md(text: str):
    return ("markdown", text)


def code(text: str):
    return ("code", text)


# The preset every notebook starts from. 40,960 samples = 32,768 for training (a power of two, so
# every batch size used here divides an epoch exactly) + 8,192 for validation.
PRESET_NOTE = """\
**The preset.** Every run here starts from `WORKSHOP` (`hpclab.presets`, the same as
`RunConfig()`'s defaults, the panel's and the CLI's): MNIST-1D with `num_samples=40960`, i.e.
32,768 training samples (a power of two, so every batch size in these notebooks divides an epoch
exactly) and 8,192 validation samples; a lesson changes only what it varies, with
`WORKSHOP.replace(...)`. The
first notebook that asks for it generates MNIST-1D once and caches it in `data/` (about half a
minute); afterwards it loads in a blink. Each run starts with a short compile (a second or two),
then runs many optimizer steps per TensorFlow call, so Python's overhead hardly shows."""

# =============================================================================================
# 00 welcome
# =============================================================================================
NB00 = [
    md("""\
# 00 · Welcome to hpclab — and a health check

**hpclab** is a lab for *data-parallel* deep learning. You start *N* worker processes
(MPI ranks), each holds a full copy of a small neural network, each trains on its own shard of
the data, and after every step the ranks average their gradients with an **allreduce**
([Horovod](https://horovod.readthedocs.io/)), so all copies stay identical. From this notebook
you steer the ranks; they run as [ipyparallel](https://ipyparallel.readthedocs.io/) MPI
engines in the background.

The data set is **MNIST-1D** (Greydanus 2020): ten classes of short 1-D signals, generated on the
fly — small enough to train in seconds on a laptop, hard enough that batch size and learning
rate visibly matter. The model is the paper's 1-D CNN (5,210 parameters).

This notebook checks that everything works: start two ranks, look at them, train for two
epochs while a live dashboard draws, and read the health signs. It takes about a minute."""),
    code("""\
import pandas as pd

import hpclab
from hpclab import Lab
from hpclab.presets import WORKSHOP
from hpclab.views.live import Dashboard

hpclab.__version__"""),
    md("""\
## Start the lab

`Lab(workers=2)` starts two MPI engines, imports TensorFlow on each and initialises Horovod.
It takes about ten seconds. Everything below talks to these two processes."""),
    code("""\
lab = Lab(workers=2)
lab"""),
    md("""\
`lab.ranks` shows who is who: the Horovod **rank** (0 … N−1), the process id and host of each
engine, how many CPU threads it may use and how many GPUs it sees. On a cluster the hosts
differ; here both ranks share one machine."""),
    code("""\
pd.DataFrame(lab.ranks)"""),
    md("""\
## How the lab works

```
 this notebook's kernel                        the lab's processes (one machine here,
 (Lab, Run, panel, charts)                     many nodes on a cluster)
┌──────────────────────┐   ZeroMQ   ┌───────────────────────────────┐
│ your cells run here  │◀─────────▶│ ipyparallel controller        │
│ writes runs/<id>/    │            │ routes tasks and telemetry    │
└──────────────────────┘            └──────────────┬────────────────┘
                                                   │
                  ┌────────────────────────────────┴───────────────────────────┐
                  ▼                                                            ▼
       ┌─────────────────────┐     MPI allreduce every step     ┌─────────────────────┐
       │ engine = MPI rank 0 │◀────────────────────────────────▶│ engine = MPI rank 1 │
       │ model copy, shard 0 │   (Horovod: sum the gradients,   │ model copy, shard 1 │
       │ of the training set │    divide by N, all get it back) │ of the training set │
       └─────────────────────┘                                  └─────────────────────┘
```

* **Controller and engines.** `Lab` starts an [ipyparallel](https://ipyparallel.readthedocs.io/)
  *controller* and *N engines*: Python processes that wait for work. The engines are started by
  `mpiexec` (by `srun` under Slurm), so they are **MPI ranks**: each knows its rank (0 … N−1),
  the world size N, and its **local rank**, its index among the ranks on its own node.
* **Where each cell runs.** Every cell of this notebook runs in your kernel. `lab.run(cfg)`
  sends the training function to every engine; the training loop runs *there*, in parallel.
  Rank 0 streams telemetry back through the controller; the kernel draws it and records it.
* **Devices.** On a GPU node each rank uses the GPU of its local rank (4 ranks on a 4-GPU node:
  one GPU each; Horovod's recipe). Here there is no GPU: each rank gets its own CPU threads.
* **One step.** Every rank computes the gradient of *its own* batch; Horovod's **allreduce**
  sums the gradients of all ranks and divides by N, inside MPI, and every rank applies that same
  average. The model copies therefore stay identical: the health check below tests exactly
  that."""),
    md(
        """\
## Describe a run

A `RunConfig` holds every knob of one training run. It is checked before any engine starts —
try `RunConfig(precision="fp8")` later and read the message. `derived(workers)` prints the
numbers that follow from it: the **global batch** (samples per optimizer step, over all
ranks), the peak learning rate after scaling, and the steps per epoch.

"""
        + PRESET_NOTE
    ),
    code("""\
cfg = WORKSHOP.replace(epochs=2)
cfg.derived(lab.workers)"""),
    md("""\
## Train, and watch it live

`lab.run(cfg)` returns at once; the ranks train in the background and stream telemetry back.
The dashboard draws throughput (one line per rank, and the sum), loss, accuracy, the learning
rate (the first epoch is a warm-up ramp) and the gradient-noise-scale estimate (notebook 05).
The first run on fresh engines also builds the data pipeline and compiles the training step,
so the first points take a few seconds to appear."""),
    code("""\
run = lab.run(cfg)
dash = Dashboard(title="first run: 2 ranks, batch 64 per rank")
dash.attach(run)
dash"""),
    code("""\
run.wait()
run.epochs"""),
    md("""\
## Health check: read the numbers

Three signs that the lab works — check each against the output below:

1. **status** is `finished` (not `failed` or `diverged`).
2. **val_accuracy** is well above 0.10, the accuracy of guessing one of ten classes. (The
   MNIST-1D paper reports about 0.94 for this CNN after full training; two epochs get part of
   the way.)
3. **weights_digest** has one fingerprint per rank. If they are *equal*, every rank ended with
   bit-identical weights — the allreduce kept the replicas in sync, which is the whole point of
   data parallelism."""),
    code("""\
{key: run.summary[key] for key in ("status", "val_accuracy", "weights_digest", "world_size",
                                    "global_batch", "train_time_s")}"""),
    md("""\
**Throughput.** `samples_per_sec` is the global rate after the warm-up calls, with a ±95 %
band; `rank_samples_per_sec` is each rank's own share. In synchronous training every rank waits
for the others at each allreduce, so the shares come out nearly equal *by construction*: each
rank's rate is the pace of the whole group, and these figures cannot tell you which rank, if
any, is the slow one."""),
    code("""\
run.summary["samples_per_sec"], run.summary["samples_per_sec_ci95"], run.summary["rank_samples_per_sec"]"""),
    md("""\
Every run is recorded on disk (`runs/<run_id>/`: config, live history, epochs, summary) and can
be read back after a kernel restart with `hpclab.load_run(path)`; `hpclab.list_runs()` lists
them."""),
    code("""\
hpclab.list_runs().head(3)"""),
    md("""\
## The control panel

`lab.panel()` puts every knob on one screen: workers, batch, learning-rate rule, optimizer,
precision. The derived numbers update as you type, **Run** starts a run on this lab with a live
dashboard (earlier runs are overlaid, faded), **Stop** asks all ranks to stop after the same
step. Nothing runs until you press **Run**."""),
    code("""\
lab.panel()"""),
    md("""\
## Exercise

Use the panel (or a new `RunConfig`) to run the same two epochs with **batch 512 per worker**
instead of 64. Before you press Run, predict: will the global throughput (samples/s) go up or
down? Will the validation accuracy after two epochs go up or down? Then compare with the run
above.

*Hints:* the panel's derived numbers show how many optimizer steps two epochs now take.
Fewer, larger steps mean less per-step overhead — and fewer updates of the weights. Notebooks
01 and 02 measure both effects properly. When you are done, run the last cell: it stops the
engines."""),
    code("""\
# your experiment here (optional), e.g.
# run2 = lab.run(cfg.replace(batch_per_worker=512)); run2.wait(); run2.summary["val_accuracy"]"""),
    code("""\
lab.stop()"""),
]

# =============================================================================================
# 01 batch size vs accuracy
# =============================================================================================
NB01 = [
    md("""\
# 01 · Batch size vs accuracy: the learning rate must follow the batch

With *N* workers, every optimizer step consumes a **global batch** of *N* × `batch_per_worker`
samples. A larger global batch means fewer steps per epoch — here an epoch is 32,768 samples,
so 256 steps at batch 128 but only 16 steps at batch 2048. If the learning rate stays the same,
the same number of epochs now makes far fewer weight updates.

Three recipes, each at three global batch sizes (128, 512, 2048 on two workers), six epochs,
the learning rate decaying after its peak as in the LARS paper (`lr_schedule="poly"`):

| recipe | peak learning rate at batch B | idea |
|---|---|---|
| **no scaling** | 0.05 at every B | the baseline: what happens if you only change the batch |
| **linear + warm-up** | 0.05 · B / 64, reached by a 1-epoch ramp from 0.05 | Goyal et al. 2017 (arXiv:1706.02677): *k* × the batch, *k* × the LR |
| **LARS** | the same peak LRs and ramp; each layer's step scaled by its trust ratio η · ‖w‖ / ‖g‖, η = 0.01 | You et al. 2017 (arXiv:1708.03888) |

LARS gets exactly linear's learning rates, so any difference between them is the trust ratio's
doing. About three minutes in all on two idle cores."""),
    code("""\
from IPython.display import Markdown

from hpclab import Lab
from hpclab.presets import WORKSHOP
from hpclab.views.comparison import accuracy_vs_batch, compare
from hpclab.views.lessons import findings_markdown
from hpclab.views.lr_window import lr_window_chart"""),
    code("""\
lab = Lab(workers=2)"""),
    md(PRESET_NOTE),
    code("""\
base = WORKSHOP.replace(lr_schedule="poly")

no_scaling = base.replace(lr_scaling="none", warmup_epochs=0)
linear = base.replace(lr_scaling="linear")
lars = linear.replace(optimizer="lars", lars_eta=0.01)

batches = [64, 256, 1024]   # per worker: global batch 128, 512, 2048 on 2 workers"""),
    md("""\
## The sweep

`lab.sweep(config, batch_per_worker=[...])` runs one training run per value, one after another,
and prints a line per run with its global batch and peak learning rate. A run that diverges
(NaN loss) or collapses (its loss stays at chance level, ln 10 ≈ 2.30, past warm-up) does not
stop the sweep: it is a result. Run the notebook again and the sweep reuses the runs already
recorded under `runs/` (delete that folder, or change a setting, to train afresh)."""),
    code("""\
records = (lab.sweep(no_scaling, batch_per_worker=batches)
           + lab.sweep(linear, batch_per_worker=batches)
           + lab.sweep(lars, batch_per_worker=batches))"""),
    code("""\
accuracy_vs_batch(records)"""),
    code("""\
compare(records).table[["label", "global_batch", "peak_lr", "status", "val_accuracy"]]"""),
    md("""\
## What these runs show

The sentences below are computed from the runs above (`hpclab.views.lessons`), so they say what
*your* runs did — including where a rule did not help. Compare them with the chart:"""),
    code("""\
Markdown(findings_markdown(records))"""),
    md("""\
Three things to look for. **No scaling**: if accuracy falls with the batch, the runs are not
unstable, they are *unfinished* — fewer updates at the same learning rate. **Linear + warm-up**:
where it is higher than no-scaling, the larger learning rate bought back the missing steps; at
batch 2048 it asks for LR 1.6. **LARS** at batch 2048: the same LR, a different outcome? And at
batch 128, where plain SGD trains well, is LARS better or worse?"""),
    md("""\
## The learning-rate window

One batch (2048) and six peak learning rates, 0.1 to 6.4, for momentum SGD and for LARS, now
with 12 epochs (192 steps) so each run has room to learn. A large batch trains only inside a
band of learning rates: below it too slowly, above it the loss diverges or collapses. The tag
`lr-window` lets the report draw these runs as a window."""),
    code("""\
big = linear.replace(batch_per_worker=1024, epochs=12, lars_eta=0.01)
window = lab.sweep(
    big.replace(tags=("lr-window",)),
    optimizer=["momentum", "lars"],
    base_lr=[0.003125, 0.0125, 0.025, 0.05, 0.1, 0.2],  # x 2048/64: peak 0.1, 0.4 ... 6.4
)"""),
    code("""\
lr_window_chart(window)"""),
    code("""\
Markdown(findings_markdown(window))"""),
    md("""\
LARS moves each layer by about `lr × η × ‖w‖` per step, whatever the size of its gradient: a
layer whose gradient is huge compared with its weights — the case that blows plain SGD up at a
large LR — takes the same *relative* step as every other layer. That is what widens the band.
It is not a free lunch: η is one more knob, and past `lr × η` of a few percent per step LARS
collapses too. With enough steps and a tuned LR, momentum SGD catches up: Nado et al. 2021 ("A
Large Batch Optimizer Reality Check", arXiv:2102.06356) matched LARS and LAMB on ImageNet and
BERT with well-tuned momentum and Adam. On the lab's reference machine, at batch 2048 with
1,170 steps and a tuned peak LR each, the best momentum run reached 0.982 and the best LARS run
0.980 (LAMB 0.987); docs/lessons.md has those sweeps and the commands to repeat them."""),
    md("""\
## Does warm-up help?

Warm-up is meant to let a large learning rate survive the first steps, while the weights are
random and the gradients large (Goyal et al. 2017, sec. 2.2). Test it rather than believe it:
batch 2048 (12 epochs), two peak learning rates, no warm-up vs 1 and 3 epochs of it."""),
    code("""\
warm = lab.sweep(big, base_lr=[0.0125, 0.025], warmup_epochs=[0, 1, 3])
compare(warm).table[["label", "peak_lr", "status", "val_accuracy"]]"""),
    md("""\
Read the table pairwise (same peak LR, different warm-up). A 3-epoch warm-up spends a quarter of
these 192 steps below the peak: it can cost more than it saves. Whichever way your numbers go,
they are one seed each — the exercise asks you to check with another."""),
    md("""\
## Exercise

1. Rerun the warm-up table with `seed=1`. Which differences survive a new seed?
2. Run LARS at batch 2048 with the paper's trust coefficient, `lars_eta=0.001`, at the same peak
   LRs. Where does its window sit now, and why?
3. Give batch 2048 more steps: the window again with `epochs=24`. Does SGD's band widen?

*Hints:* `lab.sweep(big.replace(optimizer="lars", lars_eta=0.001, tags=("lr-window",)),
base_lr=[...])`, then `lr_window_chart(...)`."""),
    code("""\
# your experiments here, e.g.
# more = lab.sweep(big.replace(seed=1), base_lr=[0.0125, 0.025], warmup_epochs=[0, 1, 3])
# compare(more).table"""),
    code("""\
lab.stop()"""),
]


# =============================================================================================
# 02 hardware vs statistical efficiency
# =============================================================================================
NB02 = [
    md("""\
# 02 · Hardware efficiency vs statistical efficiency

A bigger batch changes two different things, and they pull in opposite directions:

* **Hardware efficiency** — *samples per second*. Every optimizer step pays fixed costs: a
  Python call, kernel launches, an allreduce whose latency does not depend on the batch. A
  bigger batch spreads them over more samples, so samples/s rises — until the arithmetic
  itself is the bottleneck.
* **Statistical efficiency** — *how many steps (or samples) it takes to reach a target
  accuracy*. Up to some batch size, doubling the batch halves the steps needed ("perfect
  scaling"); beyond it, the extra samples per step are partly wasted (Shallue et al. 2018,
  arXiv:1811.03600).

What you pay for on a cluster is **time to target = steps to target × time per step**. This
notebook measures both halves on two workers, about two minutes."""),
    code("""\
import plotly.express as px

from hpclab import Lab
from hpclab.presets import WORKSHOP
from hpclab.views.comparison import compare, steps_to_target_chart"""),
    code("""\
lab = Lab(workers=2)"""),
    md(PRESET_NOTE),
    code("""\
base = WORKSHOP"""),
    md("""\
## Part 1 — hardware efficiency: samples/s vs batch

Short runs (32 steps each) at four batch sizes, 2,048 down to 8 per worker: we only read
their throughput, not their accuracy (the learning rate is left unscaled so no run is cut short
by a blow-up). `samples_per_sec` skips the first calls (compile, warm-up) and averages the
rest. The largest batch goes first: if the first run on fresh engines pays one-time costs,
this order makes them count *against* the trend we are looking for, not for it."""),
    code("""\
speed = base.replace(epochs=8, max_steps=32, lr_scaling="none")
speed_table = compare(lab.sweep(speed, batch_per_worker=[2048, 512, 64, 8])).table
speed_table[["global_batch", "samples_per_sec", "wall_time_s"]]"""),
    code("""\
px.line(speed_table, x="global_batch", y="samples_per_sec", log_x=True, log_y=True, markers=True,
        title="Hardware efficiency: global throughput vs global batch (2 workers)")"""),
    md("""\
**Read the numbers.** Divide the throughput at the largest batch by the one at the smallest:
that factor is pure hardware efficiency, the same model doing the same arithmetic per sample.
Where the line flattens, the fixed per-step costs no longer matter and the cores are busy with
arithmetic. (Time per step = global batch ÷ samples/s: compute it for two rows and see how
little it grows at small batches.) One run's throughput is one measurement: on a shared
machine it moves from run to run. If a single point breaks the trend, measure it again with
`lab.run(speed.replace(batch_per_worker=512)).wait()["samples_per_sec"]` (a sweep would skip
a point it has already recorded).

## Part 2 — statistical efficiency: steps to a target accuracy

Now full runs, 6 epochs each, at global batch 128, 256, 512 and 1,024, with the square-root
learning-rate rule and a 1-epoch warm-up (LR = 0.05 · √(B/64)). Notebook 01 showed that the
linear rule breaks down at large batches; check in the table below that every run here
trained (status `finished`, accuracy far above 0.10)."""),
    code("""\
accurate = base.replace(epochs=6, lr_scaling="sqrt", warmup_epochs=1)
records = lab.sweep(accurate, batch_per_worker=[64, 128, 256, 512])"""),
    code("""\
steps_to_target_chart(records)"""),
    code("""\
compare(records).table[["global_batch", "status", "val_accuracy", "samples_per_sec",
                         "steps_to_target", "time_to_target_s"]]"""),
    md("""\
The target (in the chart's title) is 90 % of the best final validation accuracy among these
runs. Besides the full validation at every epoch end, each run evaluates a fixed held-out subset
(2,048 samples) every 1/40 of its steps (`eval_every`, `eval_samples`), and "steps to target"
is the first of those evaluations at or above the target: exact to 2.5 % of a run, not to a
whole epoch (which would put every point on a 1-to-6-epoch grid).

**Read the numbers.**

* *Left panel, steps:* the dotted line is perfect scaling, 1/B, drawn from the smallest batch.
  Where the measured points sit *on* it, doubling the batch halved the steps. Where they bend
  *above* it, the bigger batch needed more samples than the smaller one — statistical
  efficiency is being lost.
* *Right panel, time:* time to target combines both effects. Which batch reached the target
  soonest? If it is not the largest batch, the loss in statistical efficiency outweighed the
  gain in hardware efficiency there. (Times include the few seconds each run spends compiling
  at its start.)

On a real cluster the same trade-off decides how many GPUs a job can use well: past the
batch size where steps stop falling, more workers (= more batch) buy throughput but not
time-to-accuracy."""),
    md("""\
## Exercise

Is the square-root rule holding the large batches back? Rerun batch 512 and 1,024 (global)
with the linear rule and warm-up, and see whether their steps to target move toward the ideal
line — or whether they stop reaching the target at all.

*Hints:* `more = lab.sweep(accurate.replace(lr_scaling="linear"), batch_per_worker=[256, 512])`,
then `steps_to_target_chart(records + more)` puts both rules on one chart (one line per rule).
Shallue et al. tune the learning rate separately at every batch size before they compare
steps; a fixed rule is a shortcut, and part of what you measure is the rule, not the batch."""),
    code("""\
# your experiment here"""),
    code("""\
lab.stop()"""),
]

# =============================================================================================
# 04 scaling out
# =============================================================================================
NB04 = [
    md("""\
# 04 · Scaling out: strong vs weak scaling, and what eats the gain

Going from 1 to *N* workers can mean two different experiments:

* **Weak scaling** — keep the *per-worker* batch. The global batch grows with *N*; ideally the
  global throughput grows *N*-fold (each worker does the same work as before, in parallel).
* **Strong scaling** — keep the *global* batch and split it. Each worker gets 1/*N* of the
  work per step; ideally a step takes 1/*N* of the time.

In both cases the scaling efficiency is **E(N) = T_N / (N · T_1)**, with T the global
throughput in samples/s; E = 1 is perfect. With 2 workers a step adds the **allreduce** (the
workers exchange and average their gradients), the wait for the slower worker at it, and a
second process competing for the machine. The allreduce costs roughly a fixed latency per step
plus size ÷ bandwidth, so if the arithmetic of a step is tiny, the fixed part can dominate.
This notebook measures E(N); it does not split the lost time into those parts (the time-split
lesson does) — read the questions below as hypotheses to test.

Two models, 1 vs 2 workers, about two minutes (the engines restart twice, to change the
number of workers):

| model | parameters (allreduce size) | arithmetic per sample |
|---|---|---|
| the MNIST-1D CNN | 5,210 (21 kB) | tiny |
| ResNet-20 on 32×32×3 synthetic images | ≈ 0.27 M (1.1 MB) | far more: 2-D convolutions over 32×32 images |"""),
    code("""\
from hpclab import Lab, RunConfig
from hpclab.presets import WORKSHOP
from hpclab.views.comparison import compare, scaling_efficiency"""),
    code("""\
lab = Lab(workers=2)"""),
    md(
        PRESET_NOTE
        + """

We read throughput only, so the runs are short: 128 steps for the CNN, 48 for ResNet-20. The learning rate is left unscaled, so no run is cut short by a
blow-up at a large batch."""
    ),
    code("""\
cnn = WORKSHOP.replace(epochs=16, max_steps=128, lr_scaling="none")
resnet = RunConfig(dataset="synthetic", model="resnet20", num_samples=4096,
                   batch_per_worker=16, max_steps=48, lr_scaling="none")"""),
    md("""\
## The sweeps

`workers=[...]` in a sweep restarts the engines between sizes (the lab's current size goes
first). For the CNN, the per-worker batches 16, 32, 512 and 1,024 on 1 and 2 workers give

* weak-scaling pairs at every per-worker batch (e.g. 1 × 16 vs 2 × 16), and
* strong-scaling pairs at global batch 32 (1 × 32 vs 2 × 16) and 1,024 (1 × 1,024 vs 2 × 512).

ResNet-20 adds one weak-scaling pair at 16 per worker. `scaling_efficiency` finds the pairs in
the records by itself."""),
    code("""\
records = lab.sweep(cnn, batch_per_worker=[16, 32, 512, 1024], workers=[2, 1])
records += lab.sweep(resnet, workers=[1, 2])"""),
    code("""\
scaling_efficiency(records)"""),
    code("""\
compare(records).table[["label", "workers", "global_batch", "samples_per_sec", "wall_time_s"]]"""),
    md("""\
**Read the numbers** (right panel: E(N); solid lines weak scaling, dashed strong scaling).

* *CNN, small batch (16 or 32 per worker).* The time of one step on one worker is its batch ÷
  its samples/s — compute it from the table: a very short step, while the allreduce and the
  wait for the other worker cost about the same whatever the batch. If E(2) is far below 1, the
  second worker spent much of its time communicating and waiting, not computing.
* *CNN, large batch (512 or 1,024 per worker).* 32× the arithmetic per step, the same 21 kB
  allreduce. Is E(2) closer to 1 than at the small batch?
* *ResNet-20.* Its steps are long (divide its batch by its samples/s), dominated by
  convolutions. Compare its E(2) with the CNN's.
* *Strong vs weak.* A strong-scaling pair halves each worker's batch, which pushes it toward
  the small-batch regime; a weak-scaling pair keeps it. Compare the dashed and the solid lines.

**How far to trust these numbers.** Two workers on a 2-core machine use both cores. Anything
else running — the notebook's kernel, a browser, other users — takes CPU from them, and
synchronous training runs at the pace of the *slowest* worker at every step, so a busy
machine pulls E(2) down, sometimes a lot. To see how much, repeat the sweep with a `tags`
value (`cnn.replace(tags=("repeat",))`): a different config, so it trains again instead of
reusing the recorded runs. If the efficiencies move by more than the differences you want to
read, the machine is too busy to tell. On a cluster node the
cores are yours; across nodes the allreduce also crosses the network, whose latency is far
higher than shared memory's — the small-model lesson gets stronger there, not weaker."""),
    md("""\
## Exercise

1. Horovod can compress gradients to float16 for the allreduce (`fp16_allreduce=True`). Does it
   change E(2) for the CNN at 16 per worker? For ResNet-20?
2. `steps_per_call` is how many optimizer steps run in one compiled call (one Python round
   trip); by default (0) the lab sizes calls to last ~0.15 s. Measure the CNN at 16 per worker
   with `steps_per_call=1` and the default, on 1 and 2 workers. Which overhead does it remove —
   the Python call, or the allreduce?

*Hints:* `lab.sweep(cnn.replace(fp16_allreduce=True), batch_per_worker=[16], workers=[1, 2])`,
then `scaling_efficiency(...)` on the new records together with the old. For 1, think about
which part of the allreduce's cost compression can shorten: the latency, or size ÷ bandwidth?
For 2, compare the per-step time at 1 worker (no allreduce at all) with 2 workers."""),
    code("""\
# your experiments here"""),
    code("""\
lab.stop()"""),
]

# =============================================================================================
# 05 critical batch size
# =============================================================================================
NB05 = [
    md("""\
# 05 · The critical batch size and the gradient noise scale

Notebook 02 measured how many steps a run needs to reach a target accuracy, batch size by
batch size. Where the curve bends away from "twice the batch, half the steps", why there? McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training",
arXiv:1812.06162) answer: from the noise in the gradient. A minibatch gradient is the true
gradient *G* plus noise whose size shrinks like 1/B. Their **gradient noise scale**

  B_noise = tr(Σ) / |G|²   (Σ: covariance of per-sample gradients)

is the batch size at which the noise and the signal are about equal. For B ≪ B_noise, doubling
the batch halves the noise and almost halves the steps needed; for B ≫ B_noise the gradient is
already accurate and more samples per step buy little. Their prediction: the **critical
batch** — the knee of the steps-vs-batch curve — is about B_noise.

**Data parallelism measures it for free.** Before the allreduce each worker holds a gradient
from B_small = `batch_per_worker` samples; after it, every worker holds one from B_big = the
global batch. From the two squared norms (appendix A of the paper):

  |G|² ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
  tr Σ ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

hpclab averages numerator and denominator separately over steps and reports the ratio live
(`history["noise_scale"]`, and the final value in `summary["noise_scale"]`). It needs at least
two workers.

This notebook runs one batch sweep (five runs, about two minutes) and puts the two pictures
side by side: the noise-scale estimate, and the measured knee."""),
    code("""\
import pandas as pd

from hpclab import Lab
from hpclab.presets import WORKSHOP
from hpclab.views.comparison import compare, steps_to_target_chart
from hpclab.views.live import figure"""),
    code("""\
lab = Lab(workers=2)"""),
    md(
        PRESET_NOTE
        + """

The runs use the square-root learning-rate rule with a 1-epoch warm-up, six epochs each — the
same recipe as notebook 02, so if you ran 02 first, the sweep reuses its four recorded runs and
only trains the fifth."""
    ),
    code("""\
accurate = WORKSHOP.replace(lr_scaling="sqrt")
records = lab.sweep(accurate, batch_per_worker=[64, 128, 256, 512, 1024])"""),
    md("""\
## The knee: steps to target vs batch

Shallue et al. 2018 (arXiv:1811.03600) find three regimes in every workload they measured:
*perfect scaling* (on the dotted 1/B line), *diminishing returns* (bending away), and
*maximal data parallelism* (flat: more batch, no fewer steps). Steps to target come from the
held-out evaluations every 1/40 of each run (notebook 02), so the curve is measured, not read
off whole epochs."""),
    code("""\
steps_to_target_chart(records)"""),
    md("""\
## The noise scale, live

Every run also estimated B_noise as it trained. The bottom panel below shows the estimate over
the steps of each run (one colour per batch size); the other panels show what the runs were
doing at the time."""),
    code("""\
figure(records, title="Five batch sizes: throughput, loss, accuracy, learning rate, B_noise")"""),
    code("""\
pd.DataFrame([{"global_batch": r.summary["global_batch"], "B_noise (final)": r.summary["noise_scale"],
               "val_accuracy": r.summary["val_accuracy"]} for r in records])"""),
    md("""\
## Read the numbers

1. **Does B_noise change during training?** Follow one run's estimate over its steps. McCandlish
   et al. report that it *grows* as the loss falls — late in training the remaining signal is
   small and harder to see through the noise, so a bigger batch becomes useful. If the
   estimate ends higher than it was mid-run, you are seeing that here. So the critical batch
   is not one number: it is a function of how far training has got.
2. **Where is the knee?** In the steps chart, find the largest batch that still sits close to
   the dotted line, and the first that clearly bends away.
3. **Compare.** Take the B_noise estimates of the runs around the time they reached the target
   (mid-to-late training). Is the knee within a factor of a few of them? The paper's claim is
   an order-of-magnitude one: B_crit ≈ B_noise, not equality. (The *final* estimates in the
   table come from runs that ended at different accuracies — look at that column: by point 1, a
   run that got less far has had less time for its estimate to grow.)
4. **How trustworthy is the estimate?** The estimator itself is checked against a problem whose
   B_noise is known in closed form (softmax regression at zero weights on Gaussian classes,
   `tests/test_noise_scale.py`): two real ranks land within about 1 % of it. On a real network
   the noise is in the data: with two workers B_big is only 2 × B_small, so the
   difference |G_small|² − |G_big|² is a small difference of two noisy numbers — more so when
   the batch is already large compared with B_noise. Compare the estimates of the largest
   batch with those of the smaller ones: if they jump around more, that is why. More workers
   (a larger B_big / B_small) sharpen it.

Keep in mind what this notebook does *not* do: Shallue et al. tune the learning rate anew for
every batch size; here one rule (square root) sets it. Part of any bend you see may be the
rule's fault rather than the batch's — the exercise checks that."""),
    md("""\
## Exercise

1. Is the knee the rule's fault? Rerun the two largest batches with twice the base learning
   rate (`base_lr=0.1`) and see whether their steps to target move back toward the dotted
   line.
2. Does a larger B_big / B_small ratio make the estimate steadier? With two workers the ratio
   is fixed at 2; `lab.restart(workers=1)` cannot estimate it at all. If your machine has more
   cores (or you are on a cluster), repeat a run with `Lab(workers=4)` and compare the
   `noise_scale` curves.

*Hints:* `more = lab.sweep(accurate.replace(base_lr=0.1), batch_per_worker=[512, 1024])`, then
`compare(records + more).table[["global_batch", "peak_lr", "val_accuracy", "steps_to_target"]]`
lists both learning rates with the same target. On a 2-core machine four workers share two
cores: the estimate still works, throughput does not."""),
    code("""\
# your experiments here"""),
    code("""\
lab.stop()"""),
]

# =============================================================================================
# 03 precision
# =============================================================================================
NB03 = [
    md("""\
# 03 · Numeric precision: float32, bfloat16, float16

Most deep-learning arithmetic does not need 32-bit floats. **Mixed precision** computes the
layers in a 16-bit format while the weights, the loss and the optimizer update stay in float32
(Micikevicius et al. 2018, arXiv:1710.03740). Two 16-bit formats matter:

| format | exponent / mantissa bits | range | what it needs |
|---|---|---|---|
| float32 | 8 / 23 | ≈ 1e±38 | — |
| **bfloat16** | 8 / 7 | same as float32 | nothing extra: gradients do not underflow |
| **float16** | 5 / 10 | ≈ 6e−8 … 65504 | **loss scaling**: multiply the loss before backprop so small gradients do not flush to zero, divide the gradients after |

The speed-up is a *hardware* matter: GPU Tensor Cores (float16 since Volta, bfloat16 since
Ampere) and recent CPUs' matrix units (Intel AMX, on Sapphire Rapids and newer) multiply
16-bit matrices several times faster than 32-bit ones. Without such units, 16-bit math is
converted back and forth and is usually *slower*. This notebook measures what *this* machine
does — the numbers depend on its CPU — and whether accuracy survives."""),
    code("""\
from hpclab import Lab, RunConfig
from hpclab.presets import WORKSHOP
from hpclab.views.comparison import compare"""),
    code("""\
lab = Lab(workers=2)"""),
    md(PRESET_NOTE),
    code("""\
base = WORKSHOP.replace(batch_per_worker=256, epochs=4)"""),
    md("""\
## float32 vs mixed bfloat16, same run otherwise

Same data, same seed, same learning-rate schedule — only `precision` differs. And each pair
runs **twice** (`tags` only labels the pass): a measurement you cannot repeat is not one you can
compare. Four runs of a few seconds each, in the order float32, bfloat16, float32, bfloat16."""),
    code("""\
records = lab.sweep(base, tags=[["pass 1"], ["pass 2"]], precision=["float32", "mixed_bfloat16"])
comparison = compare(records)
comparison.table[["label", "precision", "status", "val_accuracy", "samples_per_sec", "wall_time_s"]]"""),
    code("""\
comparison.figure()"""),
    md("""\
**Read the numbers.**

* *Repeatability first.* Compare the two float32 rows. If their accuracies agree to every digit,
  training here is deterministic (same seed, same data order, same arithmetic) — and any
  accuracy difference between the precisions is caused by the precision. Now compare their
  `samples_per_sec`: throughput is *not* deterministic. The gap between two identical runs is
  the noise floor; a difference between precisions smaller than that is not a difference.
* *Accuracy.* bfloat16 keeps only about 3 significant decimal digits per activation, so its
  runs follow a slightly different path. Compare the final validation accuracies and the curves
  of the two precisions — how far apart are they?
* *Speed.* Compare float32 with bfloat16, pass by pass. This model is tiny (5,210 parameters,
  1-D convolutions with 25 channels): much of a step is overhead that 16-bit arithmetic does
  not shrink, plus the casts it adds. Whatever you see here says little about a large model on
  a GPU.

## float16 with loss scaling

`mixed_float16` wraps the optimizer in a dynamic loss scaler (hpclab does this for you). CPUs
have few fast float16 kernels, so on a CPU expect it to be slow; we run only 16 steps — enough
to measure its speed, not its accuracy. Why float16 needs the scaler at all — gradients smaller
than float16's ≈ 6e−8 flush to zero without it — is Micikevicius et al.'s measurement
(arXiv:1710.03740, sec. 3.2), not this notebook's: the lab does not yet count underflowing
gradients. On a GPU with Tensor Cores, mixed float16 with loss scaling is the standard way to
train fast; that claim cannot be checked on this machine either."""),
    code("""\
fp16 = lab.run(base.replace(precision="mixed_float16", max_steps=16))
fp16.wait()
{key: fp16.summary[key] for key in ("status", "precision", "samples_per_sec", "steps")}"""),
    md("""\
Compare this `samples_per_sec` with the float32 runs above (same batch, same model).

**Does this model need the loss scaler?** Turn it off (`loss_scaling=False`) and count: each run
records the share of gradient elements that are exactly zero (`grad_zero_fraction`, sampled
on each rank's own gradient). In float32 the zeros are dead ReLU units; under float16, gradients
too small for its range (below ≈ 6e−8) would add to them."""),
    code("""\
fp16_off = lab.run(base.replace(precision="mixed_float16", max_steps=16, loss_scaling=False))
fp16_off.wait()
f32 = lab.run(base.replace(max_steps=16))  # the same 16 steps in float32
f32.wait()
{run.label: run.summary["grad_zero_fraction"] for run in (f32, fp16, fp16_off)}"""),
    md("""\
If the three shares are about equal, nothing underflowed: this small CNN's gradients, early in
training and at a loss near 1, sit well inside float16's range (on the reference machine: 0.68 %
zeros in all three). Underflow needs tiny gradients — late in training, deep networks, small
losses — which is where Micikevicius et al. measured it. The exercise lets you look later.

## A model whose work is matrix multiplication

16-bit units pay off when the work is large matrix and convolution arithmetic. ResNet-20
(0.27 M parameters, 2-D convolutions) on 32×32×3 synthetic images is such a model. 48
steps of batch 16 per worker are enough to measure throughput
(synthetic data: there is no accuracy to read). Each run still takes a while: ResNet-20 does
far more arithmetic per sample, and compiling it takes longer too."""),
    code("""\
resnet = RunConfig(dataset="synthetic", model="resnet20", num_samples=4096,
                   batch_per_worker=16, max_steps=48)
conv_records = lab.sweep(resnet, precision=["float32", "mixed_bfloat16"])
compare(conv_records).table[["label", "precision", "status", "samples_per_sec", "wall_time_s"]]"""),
    md("""\
**Read the numbers.** Divide the bfloat16 throughput by the float32 one, for the small CNN and
for ResNet-20. If the ResNet-20 ratio is clearly above 1, this CPU has matrix units that work
in bfloat16 (oneDNN uses AMX or AVX-512-BF16 when the CPU has them — on Linux, `lscpu` lists
`amx_bf16` / `avx512_bf16`); if it is near or below 1, it does not, and bfloat16 on this
machine is for studying the numerics, not for speed. On GPUs the same comparison (with
float16 too) is what decides the precision of real training runs."""),
    md("""\
## Exercise

1. Does bfloat16 change how *large* a learning rate survives? Rerun notebook 01's linear
   recipe at batch 2048 (`batch_per_worker=1024, lr_scaling="linear"`) in float32 and in
   `mixed_bfloat16` and compare.
2. Measure float16 on ResNet-20: `lab.run(resnet.replace(precision="mixed_float16", max_steps=8))`.
3. Later in training, gradients shrink. Train `base` in float32 for its 4 epochs, then look at
   `run.history[["step", "loss", "grad_zero_fraction"]]`: does the share of zeros grow as the loss
   falls? (float16 itself is too slow on a CPU for a long run; on a GPU, compare
   `loss_scaling=True` and `False` over a whole run.)

*Hints:* use `lab.sweep(config, precision=[...])` and `compare(...).table` as above. For 2,
expect a long wait per step on a CPU — keep `max_steps` small. If you have a GPU cluster
account, run this notebook there and compare all three precisions: that is where the
differences become large."""),
    code("""\
# your experiments here"""),
    code("""\
lab.stop()"""),
]

NOTEBOOKS = {
    "00_welcome": NB00,
    "01_batch_size_accuracy": NB01,
    "02_hardware_vs_statistical": NB02,
    "03_precision": NB03,
    "04_scaling_out": NB04,
    "05_critical_batch": NB05,
}


# =============================================================================================
# pedagogy: objectives at the top, answers after the exercise, take-aways before the lab stops
# =============================================================================================
OBJECTIVES = {
    "00_welcome": """\
* start a lab of MPI workers from a notebook, and say what runs where: your kernel, the
  controller, the engines (MPI ranks), and what Horovod's allreduce does every step;
* read a `RunConfig`'s derived numbers — global batch, peak learning rate, steps — before a run;
* train while a live dashboard draws, and check a run's health: status, accuracy against
  chance, identical weights on every rank.""",
    "01_batch_size_accuracy": """\
* explain why the same epochs at a larger batch under-train when the learning rate stays put;
* measure what the linear scaling rule with warm-up buys, and the batch where it breaks;
* measure what LARS's layer-wise trust ratio changes: the band of learning rates that train;
* test a claim (warm-up helps) instead of quoting it, and judge one seed's evidence.""",
    "02_hardware_vs_statistical": """\
* measure hardware efficiency (samples per second) against the batch size;
* measure statistical efficiency (optimizer steps to a target accuracy) against the batch size;
* combine them into time to target, and find the batch where more batch stops paying.""",
    "03_precision": """\
* name what float32, bfloat16 and float16 keep and lose, and why float16 needs loss scaling;
* measure a precision's speed against the noise floor of two identical runs;
* check whether accuracy survives, and whether this model's gradients underflow in float16.""",
    "04_scaling_out": """\
* tell weak from strong scaling and compute the scaling efficiency E(N) = T_N / (N · T_1);
* measure how E(2) depends on the work per step (batch, model size);
* judge when a measurement on a shared machine can be trusted.""",
    "05_critical_batch": """\
* read the three regimes of data parallelism off a steps-to-target curve (Shallue et al. 2018);
* explain the gradient noise scale B_noise and how data parallelism measures it for free;
* compare the measured knee with B_noise, and say what limits the estimate.""",
}

TAKEAWAYS = {
    "00_welcome": """\
* The lab is one controller and N engines started by `mpiexec` (or `srun` on a cluster): MPI
  ranks, each with a full model and a shard of the data. Your cells run in the kernel; training
  runs on the engines.
* Global batch = workers × batch per worker; `cfg.derived(workers)` tells you the steps and the
  peak learning rate before anything runs.
* A healthy run: `finished`, accuracy well above 1/10, one weights digest on every rank.""",
    "01_batch_size_accuracy": """\
* The same epochs at a larger batch are fewer updates: without scaling the learning rate, large
  batches under-train.
* Linear scaling with warm-up buys the accuracy back up to a batch where its learning rate is
  too large; there the run diverges or collapses to chance.
* LARS widens the band of learning rates that train at a large batch. Given enough steps and a
  tuned LR, momentum SGD reaches about the same accuracy (Nado et al. 2021).
* One seed is one sample: a difference of a few points is a question, not a result.""",
    "02_hardware_vs_statistical": """\
* Larger batches raise samples per second (hardware efficiency) until the per-step overheads
  are amortised.
* Past some batch, steps to target stop falling as 1/B (statistical efficiency is lost).
* Time to target is the product: the fastest batch is where the two balance, not the largest.""",
    "03_precision": """\
* bfloat16 keeps float32's range with fewer digits; float16 keeps digits but loses range, hence
  loss scaling.
* A speed-up is real only if it exceeds the gap between two identical runs; 16-bit speed needs
  16-bit hardware units.
* Whether gradients underflow is a property of the model and the stage of training: count it.""",
    "04_scaling_out": """\
* E(N) compares N workers with N times one worker; weak scaling keeps the per-worker batch,
  strong scaling splits a fixed global batch.
* Small steps scale worst: per-step costs (the allreduce, the wait for the slowest rank) do not
  shrink with the batch.
* On a shared machine, repeat a measurement before you trust a difference.""",
    "05_critical_batch": """\
* Steps to target fall as 1/B up to a critical batch, then flatten.
* The gradient noise scale B_noise = tr Σ / |G|² predicts that batch to within a factor of a
  few, and grows as training goes on.
* Two workers give the estimator two batch sizes for free; more workers sharpen it.""",
}

ANSWERS = {
    "00_welcome": """\
**Batch 512 per worker (global 1,024) for two epochs.** Throughput goes *up*: 8× fewer, larger
steps spend less time on per-step costs (the Python call, the allreduce), so expect several
times the samples per second of batch 64. Validation accuracy after two epochs goes *down*: two
epochs are now 64 optimizer steps instead of 512, and the linear rule's peak learning rate,
0.05 × 1024/64 = 0.8, is large for this CNN. Both effects are notebooks 01's and 02's subject.""",
    "01_batch_size_accuracy": """\
1. **Another seed.** Differences of a few points between warm-up settings often flip with the
   seed; a collapse at a given peak LR usually repeats. Only the second kind is a finding.
2. **LARS with η = 0.001.** Each layer now moves 10× less per step, so the low end of the band
   barely trains in 192 steps. On the reference machine the band did *not* simply move 10× up:
   it still collapsed from peak 12.8 (docs/lessons.md; the biases, which LARS leaves out of the
   trust ratio, take the raw LR).
3. **More steps.** Every accuracy inside the band rises; the upper edge of the band moves little
   — it is set by stability, not by the number of steps.""",
    "02_hardware_vs_statistical": """\
**The linear rule at global 512 and 1,024** (peak LR 0.4 and 0.8 instead of 0.14 and 0.2).
Expect the 512 run's steps to target to move toward the dotted 1/B line: its larger learning
rate makes each step count for more. At 1,024 the linear peak of 0.8 is close to where momentum
SGD stops training this CNN (notebook 01's window): it may reach the target in fewer steps or
not at all. Either outcome makes the point: steps to target measure the rule *and* the batch.""",
    "03_precision": """\
1. **A large LR in bfloat16.** Expect float32 and bfloat16 to fail at about the same learning
   rates on this model: bfloat16's rounding is small next to the learning rate's effect. A
   difference at the very edge of the window is one seed's.
2. **float16 on ResNet-20, on a CPU.** Much slower than float32: CPUs have few float16 kernels.
   On the reference machine the small CNN ran at about 3,300 samples/s in float16 against about
   66,000 in float32.
3. **Zeros later in training.** In float32 the share of zero gradient elements comes from ReLU
   units that do not fire; it can grow as units die. Under float16 without loss scaling,
   gradients below ≈ 6e−8 would add to it — on a GPU, compare `loss_scaling=True` and `False`
   over a whole run to see the scaler's effect.""",
    "04_scaling_out": """\
1. **fp16_allreduce.** Little change for the CNN: its 21 kB allreduce is bound by latency, not
   by bandwidth, and compression only shortens the size ÷ bandwidth part. For ResNet-20 (1.1 MB)
   it can help a little on a network; within one machine, where ranks talk through shared
   memory, hardly at all. Any difference smaller than a repeat's spread is noise.
2. **steps_per_call=1.** Throughput drops on 1 worker *and* on 2: every step now pays a Python
   round trip. The drop at 1 worker, where there is no allreduce, shows that this overhead is
   the call's, not the allreduce's.""",
    "05_critical_batch": """\
1. **Twice the base learning rate.** If the two largest batches now reach the target in fewer
   steps, part of the bend was the square-root rule giving them too small a learning rate. If
   they do not (or stop reaching it), the bend was the batch's — or the LR is now too large.
2. **More workers.** With 4 workers B_big / B_small = 4: the difference |G_small|² − |G_big|² is
   larger next to its noise, so the curves are steadier. On 2 cores, 4 workers share the cores:
   the estimate still works, throughput does not.""",
}


def pedagogy(name: str, cells: list) -> list:
    """Objectives after the title, then the lesson, answers after the exercise, take-aways last."""
    title, *body, stop = cells
    return [
        title,
        md("## Learning objectives\n\nAfter this notebook you can\n\n" + OBJECTIVES[name]),
        *body,
        md(
            "## Answers\n\n<details>\n<summary>Expected results and answers (open after you "
            "tried)</summary>\n\n" + ANSWERS[name] + "\n\n</details>"
        ),
        md("## Take-aways\n\n" + TAKEAWAYS[name]),
        stop,
    ]


# =============================================================================================
# building
# =============================================================================================


def build() -> dict:
    """name -> nbformat NotebookNode, deterministic (fixed cell ids, no outputs)."""
    out = {}
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook()
        nb.metadata = {
            "kernelspec": dict(KERNELSPEC),
            "language_info": {"name": "python", "pygments_lexer": "ipython3"},
        }
        for i, (kind, text) in enumerate(pedagogy(name, cells)):
            cell = new_markdown_cell(text) if kind == "markdown" else new_code_cell(text)
            cell.id = f"{name[:2]}-{i:02d}"
            nb.cells.append(cell)
        nbformat.validate(nb)
        out[name] = nb
    return out


def dumps(nb) -> str:
    return nbformat.writes(nb, version=4) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if a stored notebook differs from the build",
    )
    args = parser.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    stale = []
    for name, nb in build().items():
        path = OUT / f"{name}.ipynb"
        text = dumps(nb)
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
    for path in stale:
        print(("differs: " if args.check else "wrote: ") + str(path.relative_to(ROOT)))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
