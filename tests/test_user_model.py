"""Your own model (issue 30, item 1): ``model="package.module:function"``, checked before any
engine starts where it can be, imported and built on every real rank, its errors one sentence
naming the rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpclab import RunConfig
from hpclab.core.catalog import check_user_model
from hpclab.core.errors import ConfigError

HERE = Path(__file__).resolve().parent


def test_your_own_model_is_a_knob_value_and_bad_names_are_one_sentence():
    assert RunConfig(model="user_models:tiny_dense").model == "user_models:tiny_dense"
    assert RunConfig(model="pkg.sub.mod:build", dataset="cifar10").model == "pkg.sub.mod:build"
    with pytest.raises(ConfigError, match=r"'package.module:function'.*you passed model='a b'"):
        RunConfig(model="a b")
    with pytest.raises(ConfigError, match="module 'no_such_module_here' cannot be imported"):
        check_user_model("no_such_module_here:build")
    check_user_model("cnn1d")  # the catalogue's: nothing to find


def test_the_command_line_takes_your_own_model(tmp_path):
    from hpclab.tools.cli import build_parser
    from hpclab.tools.cli_fields import field_values

    args = build_parser().parse_args(["run", "--model", "user_models:tiny_dense"])
    assert field_values(args)["model"] == "user_models:tiny_dense"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--model", "not a model"])


@pytest.mark.mpi
@pytest.mark.slow
def test_your_own_model_trains_on_real_ranks_and_a_wrong_one_names_the_rank(tmp_path, monkeypatch):
    from hpclab import Lab

    # the engines inherit the client's environment: your module's folder on PYTHONPATH
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(HERE))
    cfg = RunConfig(model="user_models:tiny_dense", epochs=2, num_samples=4000)
    with Lab(workers=2, runs_dir=tmp_path / "runs", verbose=False) as lab:
        run = lab.run(cfg)
        summary = run.wait(timeout=300)
        assert run.status == "finished", run.error
        assert len(set(summary["weights_digest"])) == 1  # one model, broadcast and kept equal
        assert summary["val_accuracy"] > 0.2, summary["val_accuracy"]  # chance is 0.10
        wrong = lab.run(cfg.replace(model="user_models:wrong_output"))
        wrong.wait(timeout=300, check=False)
    assert wrong.status == "failed"
    assert "rank 0 raised ValueError: model 'user_models:wrong_output' emits shape" in wrong.error
