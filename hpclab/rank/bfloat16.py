"""Whether this CPU runs bfloat16: a tiny bfloat16 convolution and matmul, run once in a child.

TensorFlow 2.15 on x86 sends convolutions and matmuls to oneDNN (v3.2), whose bfloat16 kernels
need AVX-512 (AVX512_CORE: AVX512BW/VL/DQ; native bfloat16 from AVX512_BF16). Below it, e.g. on
an AVX2 laptop or under ``ONEDNN_MAX_CPU_ISA=AVX2``, oneDNN "could not create a primitive
descriptor": an eager convolution raises, but a matmul inside a ``tf.function`` aborts or
segfaults the whole process (measured here on TensorFlow 2.15.1). ``TF_ENABLE_ONEDNN_OPTS=0``
sends the ops to Eigen, which runs bfloat16 on any x86 CPU (oneDNN's ISA dispatch: oneDNN docs,
"CPU Dispatcher Control"; TensorFlow's oneDNN switch: TensorFlow 2.9 release notes).

:func:`check` is what a rank runs before its first step: an eager convolution only, which raises
rather than crashes. :func:`probe` is what ``hpclab doctor`` and the tests run: the whole check
(convolution, then a matmul and the backward pass inside a ``tf.function``) in a child process,
``python -m hpclab.rank.bfloat16``, which prints one JSON line (``onednn``: TensorFlow's oneDNN
ops on; ``ok``; ``error``), while ``ONEDNN_VERBOSE`` names the ISA oneDNN dispatches to.
:func:`sentence` is the one sentence both show.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Seconds the child may take: its TensorFlow import takes a few seconds on a quiet machine, and
#: up to about two minutes was measured on a 2-core machine loaded by other test runs.
PROBE_TIMEOUT_S = 300.0
_CACHE: dict = {}  # per process: (env key) -> probe result; a rank's environment does not change


def _cpuinfo_value(key: str, cpuinfo: str | None) -> str:
    """The first non-empty ``key`` line's value in /proc/cpuinfo (``cpuinfo``: its text), or ""."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key and value.strip():
            return " ".join(value.split())
    return ""


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo (``cpuinfo``: its text), or "" if unknown."""
    return _cpuinfo_value("model name", cpuinfo)


def onednn_isa(verbose_output: str) -> str:
    """The ISA oneDNN dispatches to, from its ``ONEDNN_VERBOSE`` info line ("" if absent)."""
    for line in verbose_output.splitlines():
        if line.startswith("onednn_verbose,info,cpu,isa:"):
            return line.split("isa:", 1)[1].strip()
    return ""


def cpu_isa(cpuinfo: str | None = None) -> str:
    """The widest vector ISA /proc/cpuinfo's flags show, as oneDNN's bfloat16 cares about it."""
    flags = set(_cpuinfo_value("flags", cpuinfo).split())
    if {"avx512bw", "avx512_bf16"} <= flags:
        return "AVX-512 with bfloat16"
    if {"avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else ("no AVX2" if flags else "")


def onednn_reason(message: str) -> str:
    """oneDNN's own words from a TensorFlow op error ("could not create a primitive ...")."""
    text = " ".join(message.split())
    if "message:" in text:
        text = text.split("message:", 1)[1]
    return text.split(", in file", 1)[0].strip()


def sentence(rank: int | None, host: str, result: dict, env: dict | None = None) -> str:
    """One sentence: which rank, which CPU, why bfloat16 fails there and the two ways out.

    ``result`` holds ``cpu`` (model name), ``cpu_isa`` (:func:`cpu_isa`), ``isa`` (what oneDNN
    says it dispatches to, "" if unknown) and ``error`` (oneDNN's reason)."""
    env = os.environ if env is None else env
    who = f"rank {rank} on {host}" if rank is not None else f"this machine ({host})"
    cpu = ", ".join(x for x in (result.get("cpu"), result.get("cpu_isa")) if x) or "unknown"
    on = f"on its CPU ({cpu})"
    if env.get("ONEDNN_MAX_CPU_ISA"):
        on += f" capped at ONEDNN_MAX_CPU_ISA={env['ONEDNN_MAX_CPU_ISA']}"
    if result.get("isa"):
        on += f", where it dispatches to {result['isa']}"
    return (
        f"precision='mixed_bfloat16' cannot run on {who}: oneDNN cannot build bfloat16 "
        f"convolutions or matmuls {on}, as they need AVX-512 "
        f"({result.get('error') or 'the bfloat16 probe failed'}); use precision='float32', or "
        "set TF_ENABLE_ONEDNN_OPTS=0 in the engines' environment to run bfloat16 through "
        "Eigen, much slower than float32."
    )


def describe(result: dict) -> str:
    """:func:`probe`'s finding in a few words, or :func:`sentence` where bfloat16 fails."""
    if result["ok"] is None:
        return f"unknown: {result['error']}"
    if result["ok"]:
        how = "through oneDNN" if result.get("onednn") else "through Eigen (oneDNN off)"
        return f"runs {how}" + (f" on {result['isa']}" if result.get("isa") else "")
    return "no: " + sentence(None, os.uname().nodename, result)


def check(tf, rank: int, host: str | None = None) -> None:
    """In a rank, before its first step: an eager bfloat16 convolution, which raises (never
    crashes) where oneDNN lacks bfloat16; raise :class:`hpclab.core.errors.LabError` with
    :func:`sentence` then. oneDNN gates its bfloat16 convolutions and matmuls on the same ISA
    (AVX512_CORE), so the convolution answers for the matmul too, which would crash the rank."""
    from hpclab.core.errors import LabError

    x = tf.ones((1, 4, 4, 2), tf.bfloat16)
    try:
        tf.nn.conv2d(x, tf.ones((3, 3, 2, 2), tf.bfloat16), 1, "SAME").numpy()
    except tf.errors.OpError as exc:
        found = {"cpu": cpu_model(), "cpu_isa": cpu_isa(), "error": onednn_reason(exc.message)}
        raise LabError(sentence(rank, host or os.uname().nodename, found)) from None


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"the probe was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the probe was killed by signal {-code}"
    return f"the probe exited with code {code}"


def probe(timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Run the child under this process's environment: ``ok`` (None: the child timed out),
    ``isa``, ``onednn``, ``error``, ``cpu``, ``cpu_isa`` and ``seconds``. Cached per process and environment (the knobs oneDNN reads)."""
    key = tuple(os.environ.get(k) for k in ("ONEDNN_MAX_CPU_ISA", "TF_ENABLE_ONEDNN_OPTS"))
    if key in _CACHE:
        return _CACHE[key]
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hpclab.rank.bfloat16"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        out, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired:
        out, code = "", None
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    found = json.loads(lines[-1]) if lines else {}
    result = {"ok": False, "isa": onednn_isa(out), "onednn": None, "error": "", **found}
    if code != 0 and code is not None and not result["error"]:
        result["error"] = _describe_exit(code)
    result.update(ok=bool(result["ok"]) and code == 0, cpu=cpu_model(), cpu_isa=cpu_isa())
    if code is None:  # unknown, not a failure: ok is None
        result.update(ok=None, error=f"the probe took over {timeout:g} s")
    result["seconds"] = time.perf_counter() - t0
    _CACHE[key] = result
    return result


def _child() -> dict:
    """In the child: a float32 convolution (oneDNN then names its ISA), then bfloat16 ones, the
    way a training step runs them (inside a tf.function, forward and backward)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    from tensorflow.python.util import _pywrap_util_port

    found: dict = {"ok": False, "onednn": bool(_pywrap_util_port.IsMklEnabled())}
    x, w = tf.ones((1, 4, 4, 2)), tf.ones((3, 3, 2, 2))
    tf.nn.conv2d(x, w, 1, "SAME").numpy()
    print("", flush=True)  # oneDNN's info line goes out before a bfloat16 op can kill us
    try:
        tf.nn.conv2d(tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16), 1, "SAME").numpy()
    except tf.errors.OpError as exc:
        found["error"] = onednn_reason(exc.message)
        return found
    print(json.dumps({**found, "error": "bfloat16 matmul in a tf.function crashed"}), flush=True)

    @tf.function
    def step(a, b):
        with tf.GradientTape() as tape:
            tape.watch(b)
            y = tf.reduce_sum(tf.nn.conv2d(a, b, 1, "SAME")) + tf.reduce_sum(
                tf.matmul(tf.reshape(a, (4, 8)), tf.reshape(a, (8, 4)))
            )
        return tape.gradient(y, b)

    step(tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16)).numpy()
    return {**found, "ok": True}


if __name__ == "__main__":
    print(json.dumps(_child()), flush=True)
