"""hpclab.core.presets: the named starting points the notebooks, the panel, the CLI and the demo share."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpclab import RunConfig
from hpclab.core.errors import ConfigError
from hpclab.core.presets import CLUSTER_GPU, PRESETS, QUICK, WORKSHOP, preset, workshop_seed
from hpclab.tools import cli, cli_fields
from hpclab.views.panel.panel import Panel


def test_the_workshop_preset_is_runconfigs_defaults_with_a_power_of_two_epoch():
    assert WORKSHOP == RunConfig(seed=workshop_seed())  # HPCLAB_SEED shifts the seed only
    assert WORKSHOP.train_size() == 32768 == 2**15  # every notebook batch divides an epoch
    for per_worker in (16, 32, 64, 128, 256, 512, 1024):
        assert WORKSHOP.train_size() % (2 * per_worker) == 0


def test_hpclab_seed_shifts_every_presets_seed_and_nothing_else():
    assert workshop_seed({}) == 0 == RunConfig().seed and workshop_seed({"HPCLAB_SEED": " 3 "}) == 3
    with pytest.raises(ConfigError, match=r"HPCLAB_SEED must be a whole number >= 0 .*'-1'\."):
        workshop_seed({"HPCLAB_SEED": "-1"})
    code = (
        "from hpclab.core.presets import PRESETS, WORKSHOP; from hpclab import RunConfig; "
        "assert WORKSHOP == RunConfig(seed=7), WORKSHOP; "
        "print(sorted({p.seed for p in PRESETS.values()}))"
    )
    env = {**os.environ, "HPCLAB_SEED": "7"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[7]", out.stderr[-2000:]


def test_notebooks_write_extra_seeds_relative_to_the_presets():
    """A literal ``seed=1`` would not move with HPCLAB_SEED: extra seeds are ``base.seed + k``."""
    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                found = re.findall(r"seed\s*=\s*\d", "".join(cell["source"]))
                assert not found, f"{path.name}: {found} (write seed=base.seed + k)"


def test_quick_is_the_same_problem_smaller():
    assert QUICK.replace(num_samples=WORKSHOP.num_samples, epochs=WORKSHOP.epochs) == WORKSHOP
    assert QUICK.train_size() == 8192 and QUICK.for_workers(2).total_steps == 2 * 8192 // 128


def test_cluster_gpu_is_horovods_synthetic_resnet50_benchmark():
    c = CLUSTER_GPU
    assert (c.dataset, c.model, c.image_shape, c.synthetic_classes) == (
        "synthetic", "resnet50", (224, 224, 3), 1000
    )  # fmt: skip
    assert (c.batch_per_worker, c.precision, c.xla) == (64, "mixed_float16", True)


def test_names_and_the_error_for_an_unknown_one():
    assert preset("Quick") is QUICK and preset(" workshop ") is WORKSHOP
    assert preset(QUICK) is QUICK
    assert set(PRESETS) == {"workshop", "quick", "cluster_gpu"}
    with pytest.raises(ConfigError, match=r"preset must be one of 'workshop', 'quick', "
                       r"'cluster_gpu'; you passed 'huge'\."):  # fmt: skip
        preset("huge")


def test_cli_preset_then_options_override_it():
    args = cli.build_parser().parse_args(["run", "--preset", "quick", "--epochs", "3"])
    cfg = cli_fields.base_config(args, **cli_fields.field_values(args))
    assert cfg == QUICK.replace(epochs=3)
    plain = cli.build_parser().parse_args(["run"])
    assert cli_fields.base_config(plain, **cli_fields.field_values(plain)) == WORKSHOP


def test_cli_unknown_preset_is_one_sentence_and_exit_2(tmp_path, capsys):
    code = cli.main(["run", "--preset", "huge", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "preset must be one of" in err and "Traceback" not in err


def test_panel_knobs_start_from_the_preset():
    quick = Panel(None, workers=2, preset="quick")
    assert quick.base == QUICK and quick.widgets["epochs"].value == QUICK.epochs
    assert Panel(None, workers=2).base == WORKSHOP
