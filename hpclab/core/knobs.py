"""The knob table: every knob of a training run, declared once.

A row says everything the lab knows about one knob: its name, kind, default, the values it may
take (bounds, or choices from :mod:`hpclab.core.catalog`), a one-line help, the short label the
panel shows, and the section it belongs to. Everything else is generated from these rows:

* :class:`hpclab.core.config.RunConfig`'s fields (type, default, ``metadata["help"]``);
* the single-field checks (:meth:`Knob.check`, run by every RunConfig; the rules between
  fields live in :mod:`hpclab.core.config_rules`);
* the command-line options, one argument group per section (:mod:`hpclab.tools.cli_fields`);
* the panel's controls: bounds, choices, label, tooltip (:mod:`hpclab.views.panel.controls`);
* the knobs reference, docs/knobs.md (``scripts/knobs_doc.py``).

A new knob is one row here, plus the code that acts on it (on the ranks, a feature file).

Sections are a property of each knob, not nested objects: a config stays flat
(``RunConfig(batch_per_worker=128)``, ``cfg.lr_schedule``) because notebooks, the records on
disk and the command line all name knobs that way, and a knob that moves to another section
must not break any of them. :func:`by_section` and ``RunConfig.section(name)`` read a section.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hpclab.core.catalog import (
    AUGMENTS,
    DATASETS,
    FLOAT32_BITS,
    GENERATED_VALIDATION_FRACTION,
    GRAD_ALLREDUCES,
    INPUTS,
    LR_SCALINGS,
    LR_SCHEDULES,
    MAX_AUGMENT_COST,
    MAX_STEPS_PER_CALL,
    MAX_WORKERS,
    MIN_PUBLISH_EVERY_S,
    MODELS,
    OPTIMIZERS,
    PRECISIONS,
    SDC_TARGETS,
    SHARDS,
    SHUFFLES,
    STAGINGS,
    UPDATES,
    VALIDATIONS,
    is_user_model,
)
from hpclab.core.devices import TIME_SYNCS
from hpclab.core.errors import ConfigError
from hpclab.core.filedata import is_file_dataset

#: What a knob's value is, and the Python type of the RunConfig field that holds it.
KINDS = {
    "int": int,
    "float": float,
    "bool": bool,
    "choice": str,  # one name from `choices`
    "text": str,  # free text of at most `hi` characters
    "shape": tuple,  # three integers, each from `lo` to `hi`
    "tags": tuple,  # strings
}


def fail(name: str, value: Any, allowed: str) -> None:
    """The one sentence every refused knob value gets: the field, the value, what is allowed."""
    raise ConfigError(f"RunConfig.{name} must be {allowed}; you passed {name}={value!r}.")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Knob:
    """One row of the table. Bounds are inclusive unless ``lo_open`` (then the value must be
    > ``lo``); ``off`` is a value outside the bounds that switches the feature off."""

    name: str
    kind: str  # a key of KINDS
    default: Any
    help: str  # one line: `hpclab run --help`, the panel's tooltip, docs/knobs.md
    label: str  # short: the panel's caption
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    off: float | None = None
    choices: tuple[str, ...] = ()
    # a choice that also takes values outside ``choices``: (a test of the value, its words)
    or_else: tuple[Any, str] | None = None
    step: float = 1  # the panel's increment
    noun: str = ""  # what a number is, in the error ("a factor"); default: an integer / a number
    section: str = ""  # set by `_section`

    @property
    def type(self) -> type:
        return KINDS[self.kind]

    @property
    def option(self) -> str:
        """The command-line option (``--batch-per-worker``)."""
        return "--" + self.name.replace("_", "-")

    def allowed(self) -> str:
        """What the knob accepts, in the words of its error."""
        if self.kind == "choice":
            more = f", or {self.or_else[1]}" if self.or_else else ""
            return "one of " + ", ".join(repr(c) for c in self.choices) + more
        if self.kind == "bool":
            return "True or False"
        if self.kind == "text":
            return f"a string of at most {self.hi} characters"
        if self.kind == "tags":
            return "a list of strings"
        if self.kind == "shape":
            return f"three integers (height, width, channels), each {self.lo}..{self.hi}"
        if self.kind == "int":
            noun = self.noun or "an integer"
            span = f">= {self.lo}" if self.hi is None else f"from {self.lo} to {self.hi}"
        else:
            noun = self.noun or "a finite number"
            span = f"{'>' if self.lo_open else '>='} {self.lo:g}"
            span += "" if self.hi is None else f" and <= {self.hi:g}"
        off = "" if self.off is None else f"{self.off:g} (off) or "
        return f"{off}{noun} {span}"

    def admits(self, value: Any) -> bool:
        """Whether ``value`` is one this knob may take (on its own: see config_rules for the
        rules between knobs)."""
        if self.kind == "choice":
            if self.or_else and self.or_else[0](value):
                return True
            return isinstance(value, str) and value in self.choices
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "text":
            return isinstance(value, str) and len(value) <= self.hi
        if self.kind == "tags":
            return isinstance(value, tuple) and all(isinstance(t, str) for t in value)
        if self.kind == "shape":
            return (
                isinstance(value, tuple)
                and len(value) == 3
                and all(is_int(s) and self.lo <= s <= self.hi for s in value)
            )
        if not (is_int(value) if self.kind == "int" else is_number(value)):
            return False
        if self.off is not None and value == self.off:
            return True
        above = value > self.lo if self.lo_open else value >= self.lo
        return above and (self.hi is None or value <= self.hi)

    def check(self, value: Any) -> None:
        """A ConfigError naming the knob, the value and what is allowed, unless admitted."""
        if not self.admits(value):
            fail(self.name, value, self.allowed())


def _section(name: str, *rows: Knob) -> tuple[Knob, ...]:
    return tuple(dataclasses.replace(row, section=name) for row in rows)


_HELD_OUT = f"{GENERATED_VALIDATION_FRACTION:.0%} held out for validation"

#: Sections in the order the CLI, the docs and RunConfig list them: name -> what they hold.
SECTIONS = {
    "data": "what the run learns from",
    "model and optimizer": "the network and its update rule",
    "batch and learning rate": "batch size, epochs, and how the learning rate follows the batch",
    "numerics and communication": "compute precision and how gradients cross ranks",
    "engine loop": "how a rank drives its steps",
    "where the time goes": "who validates, how data is dealt, what is timed (hpclab.core.pop)",
    "straggler": "lesson injection: one rank slowed on purpose",
    "batch skew": "lesson injection: uneven batch shares (load imbalance)",
    "input augmentation": "work on the input, in the step or once before training",
    "beyond synchronous SGD": "model averaging and staleness (hpclab.rank.features.averaging)",
    "silent data corruption": "lesson injection: one bit flipped (hpclab.rank.features.sdc)",
    "loss spikes and rollback": "the detector that catches a corrupted step, and the way back",
    "telemetry and evaluation": "what the run measures while it trains",
    "run identity": "seed, name and tags",
}

# One row per knob, kept as a table (one glance per knob), not formatted one argument a line.
# fmt: off
KNOBS: tuple[Knob, ...] = (
    *_section(
        "data",
        Knob("dataset", "choice", "mnist1d", "the data: generated (mnist1d, blobs, synthetic), "
             "staged in data/, or your own folder of files with a dataset.json", "dataset",
             choices=DATASETS, or_else=(is_file_dataset, "a folder path holding a dataset.json "
             "(your own files)")),
        Knob("num_samples", "int", 40960, f"mnist1d/blobs/synthetic: samples generated "
             f"({_HELD_OUT})", "num samples", lo=100, hi=10_000_000, step=1000),
        Knob("image_shape", "shape", (32, 32, 3), "synthetic: H, W, C of the random images",
             "image shape", lo=1, hi=1024),
        Knob("synthetic_classes", "int", 10, "synthetic: label classes (1000 = ImageNet's head)",
             "classes", lo=2, hi=100_000),
        Knob("input", "choice", "auto", "file dataset: resident (read whole), stream (tf.data "
             "from the files) or auto (resident when it fits)", "input", choices=INPUTS),
        Knob("stage", "choice", "shared", "file dataset: read where it lies (shared), copy it "
             "to node-local storage first (local), or pack its files into one there (pack, "
             "FanStore's idea: one open instead of one per file)", "staging", choices=STAGINGS),
        Knob("stream_buffer", "int", 4096, "stream: records in each rank's shuffle buffer",
             "shuffle buffer", lo=1, hi=10_000_000, step=1024),
    ),
    *_section(
        "model and optimizer",
        Knob("model", "choice", "cnn1d", "the network; it must accept the dataset's input "
             "(1-D or images); or your own: 'package.module:function'", "model",
             choices=MODELS, or_else=(is_user_model, "'package.module:function' (your own "
             "Keras model: a function of (input_shape, num_classes))")),
        Knob("optimizer", "choice", "momentum", "the update rule (lars and lamb for large "
             "batches)", "optimizer", choices=OPTIMIZERS),
        Knob("momentum", "float", 0.9, "momentum / lars / lamb(beta1) / adam(beta1)",
             "momentum", lo=0.0, hi=0.999999, step=0.05),
        Knob("weight_decay", "float", 0.0, "L2 coefficient (decoupled for lamb, in-gradient "
             "for lars)", "weight decay", lo=0.0, hi=1.0, step=1e-4),
        Knob("lars_eta", "float", 0.001, "LARS trust coefficient (You et al. 2017)",
             "LARS trust η", lo=0.0, lo_open=True, hi=10.0, step=0.0005),
        Knob("grad_clip_norm", "float", 0.0, "clip the averaged gradient to this global norm "
             "(0 = off; Pascanu et al. 2013)", "clip grad norm", lo=0.0, lo_open=True, off=0.0,
             hi=1e6, step=0.5),
    ),
    *_section(
        "batch and learning rate",
        Knob("batch_per_worker", "int", 64, "samples per rank per step; global batch = this x "
             "workers", "batch per worker", lo=1, hi=65536),
        Knob("epochs", "float", 6, "passes over the training set (fractions allowed)",
             "epochs", lo=0.0, lo_open=True, hi=10_000),
        Knob("base_lr", "float", 0.05, "learning rate that works at `base_batch`", "base LR",
             lo=0.0, lo_open=True, hi=100.0, step=0.01),
        Knob("base_batch", "int", 64, "the global batch `base_lr` was tuned for", "base batch",
             lo=1, hi=10_000_000),
        Knob("lr_scaling", "choice", "linear", "how the peak LR follows the global batch",
             "LR scaling", choices=LR_SCALINGS),
        Knob("warmup_epochs", "float", 1.0, "linear ramp up to the peak LR from peak x "
             "base_batch / global batch (Goyal et al.)", "warm-up epochs", lo=0.0, hi=10_000,
             step=0.5),
        Knob("lr_schedule", "choice", "constant", "what follows warm-up: constant, cosine or "
             "poly (LARS)", "after warm-up", choices=LR_SCHEDULES),
    ),
    *_section(
        "numerics and communication",
        Knob("precision", "choice", "float32", "the compute dtype (mixed_* keep float32 "
             "weights)", "precision", choices=PRECISIONS),
        Knob("loss_scaling", "bool", True, "mixed_float16: dynamic loss scaling (off: see what "
             "underflows)", "loss scaling"),
        Knob("fp16_allreduce", "bool", False, "Horovod: compress gradients to float16 for the "
             "allreduce", "float16 allreduce"),
        Knob("grad_allreduce", "choice", "grouped", "grouped (one fused op) or per_tensor "
             "(overlaps backprop)", "allreduce", choices=GRAD_ALLREDUCES),
        # a measuring device (hpclab.studies.scaling_ablation): the replicas drift apart
        Knob("skip_allreduce", "bool", False, "measuring only: skip the gradient allreduce "
             "(replicas drift apart; weight digests differ)", "skip the allreduce"),
    ),
    *_section(
        "engine loop",
        Knob("steps_per_call", "int", 0, "optimizer steps per compiled call (0 = auto, ~0.15 s "
             "a call)", "steps per call", lo=0, hi=MAX_STEPS_PER_CALL),
        Knob("xla", "bool", False, "XLA-compile forward and backward (pays off on GPUs; see "
             "docs)", "XLA"),
        Knob("max_steps", "int", 0, "stop after this many steps (0 = run all epochs)",
             "max steps", lo=0),
        Knob("checkpoint_every", "int", 0, "rank 0 saves the training state every this many "
             "steps and at a stop, to resume from (0 = off)", "checkpoint every", lo=0,
             hi=10_000_000, step=100),
        Knob("checkpoint_minutes", "float", 0.0, "rank 0 also saves the training state after "
             "the call that ends this many minutes after the last save (0 = off)",
             "checkpoint minutes", lo=0.0, hi=100_000.0, step=5),
        Knob("checkpoint_keep", "int", 2, "checkpoints kept in the run folder (the newest, and "
             "older ones to fall back to if it is damaged)", "checkpoints kept", lo=1, hi=1000),
    ),
    *_section(
        "where the time goes",
        Knob("validation", "choice", "sharded", "held-out evaluation: sharded over ranks, or "
             "rank0 alone (the others wait)", "validation", choices=VALIDATIONS),
        Knob("shards", "choice", "iid", "rank shards: iid, or by_label (sorted by class first: "
             "non-iid)", "shards", choices=SHARDS),
        Knob("shuffle", "choice", "local", "each epoch: local (own shard) or global (all data "
             "dealt anew)", "shuffle", choices=SHUFFLES),
        Knob("timeline_steps", "int", 0, "record Horovod's timeline over this many steps after "
             "the first call (0 = off)", "timeline steps", lo=0, hi=100_000, step=50),
        Knob("time_split", "bool", True, "time each step's parts in the graph "
             "(hpclab.core.pop; on with a straggler)", "time the parts"),
        Knob("stamp_pairs", "bool", False, "make bench: every other call runs untimed, pairing "
             "adjacent calls to measure the split's cost", "pair untimed calls"),
        Knob("time_sync", "choice", "auto", "the split's clock: auto (a device sync at each "
             "split point on a GPU, host clock on CPU), device (always), host (never; on a GPU "
             "the parts then time dispatch)", "split clock", choices=TIME_SYNCS),
    ),
    *_section(
        "straggler",
        Knob("straggler_rank", "int", -1, "the rank slowed on purpose (-1 = none)",
             "straggler rank", lo=-1, hi=MAX_WORKERS - 1),
        Knob("straggler_slowdown", "float", 0.0, "straggler: % of its speed lost (30: its "
             "compute takes 1/0.7 = 1.43x as long)", "its speed lost %", lo=0.0, hi=95.0,
             step=5),
        Knob("straggler_ms", "float", 0.0, "straggler: extra milliseconds of compute every "
             "step", "its extra ms", lo=0.0, hi=10_000.0),
    ),
    *_section(
        "batch skew",
        Knob("batch_skew", "float", 0.0, "rank 0's batch this % larger, the others' smaller "
             "(same total)", "rank 0's batch +%", lo=0.0, hi=90.0, step=10),
    ),
    *_section(
        "input augmentation",
        Knob("augment", "choice", "none", "input augmentation: none, online (every batch, in "
             "the step) or offline (once)", "augment", choices=AUGMENTS),
        Knob("augment_cost", "int", 1, "augmentation work: noise passes per batch (same "
             "statistics)", "augment cost", lo=1, hi=MAX_AUGMENT_COST, step=10),
    ),
    *_section(
        "beyond synchronous SGD",
        Knob("update", "choice", "sync", "sync (average gradients), local_sgd (average "
             "models), hybrid (sync groups, models averaged across them) or crossbow (SMA)",
             "update", choices=UPDATES),
        Knob("average_every", "int", 1, "local_sgd, hybrid: steps between model averages (H; "
             "1 = sync SGD)", "average every H", lo=1, hi=100_000),
        Knob("groups", "int", 1, "hybrid: synchronous groups of consecutive ranks (divides "
             "workers)", "hybrid: groups", lo=1, hi=MAX_WORKERS),
        Knob("staleness", "int", 0, "apply the averaged gradient of this many steps ago "
             "(asynchrony)", "stale by steps", lo=0, hi=64),
    ),
    *_section(
        "silent data corruption",
        Knob("sdc_target", "choice", "none", "flip one bit of: none, weights, gradients or "
             "activations", "flip", choices=SDC_TARGETS),
        Knob("sdc_layer", "int", 0, "SDC: which layer with weights (0 = the first conv/dense "
             "layer)", "flip: layer", lo=0, hi=10_000),
        Knob("sdc_bit", "int", 30, "SDC: the float32 bit flipped (31 sign, 30-23 exponent, "
             "22-0 mantissa)", "flip: bit", lo=0, hi=FLOAT32_BITS - 1),
        Knob("sdc_rank", "int", 0, "SDC: the rank whose tensor is hit", "flip: rank", lo=0,
             hi=MAX_WORKERS - 1),
        Knob("sdc_step", "int", 10, "SDC: the optimizer step hit (0-based; weights flip just "
             "before it)", "flip: step", lo=0, hi=10_000_000, step=10),
    ),
    *_section(
        "loss spikes and rollback",
        # a factor <= 1 would fire on every step above its own running mean
        Knob("spike_factor", "float", 0.0, "loss-spike detector: fire when a step's loss > this "
             "x its running mean (0 = off)", "spike factor", off=0.0, lo=1.0, lo_open=True,
             hi=1e6, step=0.5, noun="a factor"),
        Knob("rollback", "bool", False, "on a loss spike, every rank restores its last good "
             "state", "roll back on a spike"),
    ),
    *_section(
        "telemetry and evaluation",
        # faster than MIN_PUBLISH_EVERY_S every call would publish: a flood
        Knob("publish_every_s", "float", 0.5, "live telemetry cadence in seconds (0 = "
             "telemetry off)", "publish every s", off=0.0, lo=MIN_PUBLISH_EVERY_S, hi=3600,
             step=0.5, noun="a number of seconds"),
        Knob("noise_scale", "bool", True, "estimate the gradient noise scale (McCandlish et "
             "al. 2018)", "noise scale"),
        Knob("eval_every", "int", 0, "steps between evaluations on the held-out subset (0 = "
             "auto: 40)", "evaluate every", lo=0, hi=10_000_000),
        Knob("eval_samples", "int", 2048, "held-out samples evaluated every eval_every steps "
             "(0 = off)", "eval samples", lo=0, hi=10_000_000),
    ),
    *_section(
        "run identity",
        Knob("seed", "int", 0, "data generation, shuffling and weight init", "seed", lo=0,
             hi=2**31 - 1),
        Knob("name", "text", "", "optional label shown in legends and run listings", "name",
             hi=120),
        Knob("tags", "tags", (), "free-form labels (e.g. the sweep a run belongs to)", "tags"),
    ),
)
# fmt: on

#: The table by knob name.
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    """The row of knob ``name`` (a ConfigError naming the known knobs if there is none)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ConfigError(
            f"There is no knob {name!r}; known knobs: {', '.join(sorted(BY_NAME))}."
        ) from None


def by_section(rows: Iterable[Knob] = KNOBS) -> dict[str, tuple[Knob, ...]]:
    """The rows grouped by section, sections in SECTIONS order, rows in table order."""
    grouped = {s: tuple(k for k in rows if k.section == s) for s in SECTIONS}
    return {s: group for s, group in grouped.items() if group}


__all__ = ["KINDS", "SECTIONS", "KNOBS", "BY_NAME", "Knob", "knob", "by_section", "fail"]
