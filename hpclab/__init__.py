"""hpclab: an interactive lab for data-parallel deep learning at scale.

Start N MPI engines, train a Keras model under Horovod on them, watch throughput and accuracy
live, and record, compare and sweep runs. Importing hpclab does not import TensorFlow: only the
engines do (everything that runs on a rank lives in :mod:`hpclab.rank`).
"""

import importlib.util as _importlib_util
import os as _os

# Keras 2 in every process of the lab: where tf_keras is installed (the py312 stack, TensorFlow
# >= 2.16), tf.keras must be tf_keras, not Keras 3 (Horovod 0.28.1 cannot drive Keras 3). Set
# before anything can import TensorFlow; processes started from here (mpiexec engines, sbatch
# jobs) inherit it, and engines import hpclab before TensorFlow anyway. Not set where tf_keras is
# absent: TensorFlow 2.15 then refuses tf.keras ("Keras cannot be imported"). See rank/keras2.py.
if "TF_USE_LEGACY_KERAS" not in _os.environ and _importlib_util.find_spec("tf_keras"):
    _os.environ["TF_USE_LEGACY_KERAS"] = "1"

from hpclab.core.config import RunConfig
from hpclab.core.engine_settings import EngineSettings
from hpclab.core.errors import ConfigError, HpclabError, LabError, RunFailed
from hpclab.records.index import list_runs
from hpclab.records.store import RunRecord, load_run

__version__ = "0.1.0"

_LAZY = {  # name -> module: ipyparallel and plotly load only when used
    "Lab": "hpclab.cluster.lab",
    "Run": "hpclab.cluster.run",
    "find_mpiexec": "hpclab.cluster.host",
    "compare": "hpclab.views.charts.comparison",
    "write_report": "hpclab.views.charts.report",
    "plan": "hpclab.studies.planner",
    "plan_panel": "hpclab.tools.plan_panel",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpclab' has no attribute {name!r}")


__all__ = [
    "RunConfig",
    "EngineSettings",
    "ConfigError",
    "HpclabError",
    "LabError",
    "RunFailed",
    "RunRecord",
    "list_runs",
    "load_run",
    "Lab",
    "Run",
    "find_mpiexec",
    "compare",
    "write_report",
    "plan",
    "plan_panel",
]
