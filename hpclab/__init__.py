"""hpclab: an interactive lab for data-parallel deep learning at scale.

Start N MPI engines, train a Keras model under Horovod on them, watch throughput and accuracy
live, and record, compare and sweep runs. Importing hpclab does not import TensorFlow: only the
engines do.
"""

from hpclab.config import ConfigError, RunConfig
from hpclab.runs import RunRecord, list_runs, load_run

__version__ = "0.1.0"


def __getattr__(name):  # lazy: ipyparallel/plotly load only when used
    if name in ("Lab", "LabError", "find_mpiexec"):
        from hpclab import cluster
        return getattr(cluster, name)
    if name in ("Run", "RunFailed"):
        from hpclab import run
        return getattr(run, name)
    if name == "compare":
        from hpclab.comparison import compare
        return compare
    if name == "write_report":
        from hpclab.report import write_report
        return write_report
    raise AttributeError(f"module 'hpclab' has no attribute {name!r}")


__all__ = ["RunConfig", "ConfigError", "RunRecord", "list_runs", "load_run", "Lab", "LabError",
           "Run", "RunFailed", "compare", "write_report"]
