"""Which GPU each rank pins, and the start-time GPU checks (hpclab.core.devices), with fake
device lists for each Slurm binding mode; plus one real lab that expects a GPU on this CPU-only
TensorFlow and must refuse to start, naming the rank and what it sees."""

from __future__ import annotations

import pytest

from hpclab.core import devices as dv
from hpclab.core.errors import ConfigError

SMI = "0, GPU-aaaa, NVIDIA A100-SXM4-40GB\n1, GPU-bbbb, NVIDIA A100-SXM4-40GB\n2, GPU-cccc, NVIDIA A100-SXM4-40GB\n"


@pytest.mark.parametrize(
    ("local_rank", "local_size", "n_visible", "env", "index", "how"),
    [
        (0, 2, 0, {}, None, "none"),  # CPU-only TensorFlow, or no GPU given
        (1, 4, 4, {}, 1, "local_rank"),  # --gpus-per-node=4 --gpu-bind=none
        (3, 4, 4, {"SLURM_GPU_BIND": "none"}, 3, "local_rank"),
        (2, 4, 1, {"SLURM_GPUS_PER_TASK": "1"}, 0, "per_task"),  # --gpus-per-task=1
        (1, 2, 1, {"SLURM_GPU_BIND": "single:1"}, 0, "per_task"),
        (0, 1, 1, {}, 0, "per_task"),  # one rank on a one-GPU node
        (3, 4, 2, {}, 1, "shared"),  # 4 ranks, 2 GPUs: ranks 1 and 3 share GPU 1
        (1, 2, 1, {}, 0, "shared"),  # two ranks see the same single GPU
    ],
)
def test_pick_gpu_over_binding_modes(local_rank, local_size, n_visible, env, index, how):
    assert dv.pick_gpu(local_rank, local_size, n_visible, env) == dv.GpuChoice(index, how)


def test_slurm_localid_is_the_local_rank_under_srun():
    assert dv.local_rank_of(0, {"SLURM_LOCALID": "3"}) == 3
    assert dv.local_rank_of(2, {}) == 2


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("2,3", ["2", "3"]),
        ("0,-1,1", ["0"]),
        ("GPU-aaaa", ["GPU-aaaa"]),
    ],
)
def test_cuda_visible_devices(value, ids):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert dv.visible_devices(env) == ids


def test_identity_is_the_nodes_gpu_not_tensorflows_index():
    rows = dv.parse_smi(SMI)
    # Slurm bound this task to GPU 2: TensorFlow lists it as its GPU 0
    ident = dv.gpu_identity(dv.GpuChoice(0, "per_task"), {"CUDA_VISIBLE_DEVICES": "2"}, rows)
    assert ident == {"index": "2", "uuid": "GPU-cccc", "name": "NVIDIA A100-SXM4-40GB"}
    by_uuid = dv.gpu_identity(
        dv.GpuChoice(0, "per_task"), {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, rows
    )
    assert by_uuid["index"] == "1"
    no_smi = dv.gpu_identity(dv.GpuChoice(1, "local_rank"), {}, [], tf_name="NVIDIA H100")
    assert no_smi == {"index": "1", "uuid": "", "name": "NVIDIA H100"}
    assert dv.gpu_identity(dv.GpuChoice(None, "none"), {}, rows) == {}


def rank(r, host="n1", gpu=None, nccl=True, **more):
    return {
        "rank": r,
        "host": host,
        "gpus": 1 if gpu else 0,
        "gpu": gpu or {},
        "horovod_nccl": nccl,
        **more,
    }


def test_a_rank_without_gpu_fails_when_gpus_are_expected_naming_it():
    idents = [rank(0, gpu={"index": "0", "uuid": "GPU-a"}), rank(1, node="gpu07", tf_cuda=False)]
    errors, _ = dv.check_gpus(idents, expected=True)
    assert len(errors) == 1
    assert "rank 1 on gpu07" in errors[0] and "sees 0" in errors[0] and "CUDA: False" in errors[0]
    assert dv.check_gpus(idents, expected=False) == ([], [])


def test_two_ranks_on_one_gpu_refused_under_nccl_warned_otherwise():
    same = {"index": "0", "uuid": "GPU-a"}
    idents = [rank(0, gpu=same), rank(1, gpu=same), rank(2, host="n2", gpu=same)]
    errors, warnings = dv.check_gpus(idents, expected=True)
    assert len(errors) == 1 and "ranks [0, 1] on n1 share GPU GPU-a" in errors[0]
    assert "Duplicate GPU" in errors[0] and not warnings
    plain = [dict(i, horovod_nccl=False) for i in idents]
    errors, warnings = dv.check_gpus(plain, expected=True)
    assert not errors and "share GPU" in warnings[0]


def test_distinct_gpus_pass():
    idents = [
        rank(0, gpu={"index": "0", "uuid": "GPU-a"}),
        rank(1, gpu={"index": "1", "uuid": "GPU-b"}),
    ]
    assert dv.check_gpus(idents, expected=True) == ([], [])


@pytest.mark.parametrize("bad", [-1, 65, 1.5, "2", True])
def test_lab_gpus_argument_is_checked(bad):
    with pytest.raises(ConfigError, match="Lab.gpus"):
        dv.check_gpus_arg(bad)


@pytest.mark.mpi
def test_a_lab_that_expects_gpus_refuses_to_start_on_cpu_only_tensorflow(tmp_path):
    from hpclab.cluster.lab import Lab
    from hpclab.core.errors import LabError

    with pytest.raises(LabError) as err:
        Lab(workers=1, gpus=1, runs_dir=tmp_path / "runs", verbose=False)
    text = str(err.value)
    assert "rank 0 on" in text and "sees 0" in text and "TensorFlow built with CUDA: False" in text


# -- GPU memory: growth, or the HPCLAB_GPU_MEMORY_MIB cap ------------------------------------------


def test_gpu_memory_limit_from_the_engines_environment():
    assert dv.gpu_memory_limit({}) is None
    assert dv.gpu_memory_limit({"HPCLAB_GPU_MEMORY_MIB": " 20000 "}) == 20000
    for bad in ("20GB", "-5", "100"):
        with pytest.raises(ConfigError, match=r"HPCLAB_GPU_MEMORY_MIB=.* must be a whole number"):
            dv.gpu_memory_limit({"HPCLAB_GPU_MEMORY_MIB": bad})


class _FakeConfig:
    """The part of tf.config pin_gpu uses, recording the calls."""

    def __init__(self, n):
        self.calls = []
        self.devices = [f"/physical_device:GPU:{i}" for i in range(n)]
        self.experimental = self
        self.LogicalDeviceConfiguration = lambda memory_limit: ("logical", memory_limit)

    def list_physical_devices(self, kind):
        return self.devices

    def set_memory_growth(self, dev, on):
        self.calls.append(("growth", dev, on))

    def set_logical_device_configuration(self, dev, configs):
        self.calls.append(("limit", dev, configs))

    def set_visible_devices(self, dev, kind):
        self.calls.append(("visible", dev))

    def get_device_details(self, dev):
        return {"device_name": "NVIDIA H100 80GB HBM3"}


class _FakeTf:
    def __init__(self, n):
        self.config = _FakeConfig(n)
        self.test = type("T", (), {"is_built_with_cuda": staticmethod(lambda: True)})


class _FakeHvd:
    local_rank = staticmethod(lambda: 0)
    local_size = staticmethod(lambda: 1)
    nccl_built = staticmethod(lambda: 21605)


@pytest.mark.parametrize(
    ("env", "memory", "call"),
    [({}, "growth", "growth"), ({"HPCLAB_GPU_MEMORY_MIB": "20000"}, "limit 20000 MiB", "limit")],
)
def test_pin_gpu_turns_growth_on_or_caps_the_memory(monkeypatch, env, memory, call):
    from hpclab.rank import gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HPCLAB_GPU_MEMORY_MIB", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(gpu, "_smi_rows", lambda: [])
    tf = _FakeTf(1)
    got = gpu.pin_gpu(tf, _FakeHvd)
    assert got["gpu_memory"] == memory and got["gpu"]["name"] == "NVIDIA H100 80GB HBM3"
    kinds = [c[0] for c in tf.config.calls]
    assert kinds == [call, "visible"]  # before any op; never growth and a cap together
    if call == "limit":
        assert tf.config.calls[0][2] == [("logical", 20000)]
    cpu = gpu.pin_gpu(_FakeTf(0), _FakeHvd)
    assert cpu["gpu"] == {} and cpu["gpu_memory"] == ""
