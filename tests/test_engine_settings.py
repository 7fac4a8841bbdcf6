"""hpclab.core.engine_settings.EngineSettings: what Horovod reads at hvd.init(), owned by the Lab
(fast: pure, no engines). The rule that decides when a run needs fresh engines
(`EngineSettings.for_run`), the environment the engines get, the checks, and how an old record
whose config still held `hvd_cycle_time_ms`/`hvd_fusion_mb` reads today."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from fakes import write_run

from hpclab.core.config import RunConfig
from hpclab.core.engine_settings import (
    GROUPS_ENV,
    EngineSettings,
)
from hpclab.core.errors import ConfigError
from hpclab.records.index import find_finished
from hpclab.records.store import load_run, settle_engine_settings
from hpclab.views.charts.facts import run_facts

FRESH = EngineSettings()


def test_a_hybrid_run_registers_the_groups_it_needs_and_later_runs_keep_them():
    """A hybrid run of 2 groups of 2 needs process sets; later runs keep them (and a
    timeline) rather than restart; one group, or groups of one rank, need none (the global
    set; no gradient allreduce)."""
    hybrid = RunConfig(update="hybrid", groups=2)
    assert FRESH.for_run(hybrid, 4) == EngineSettings(groups=2)
    kept = EngineSettings(timeline=True, groups=2)
    assert kept.for_run(RunConfig(), 4) == kept
    assert FRESH.for_run(hybrid, 2) == FRESH  # 2 groups of 1: local SGD
    assert FRESH.for_run(hybrid.replace(groups=1), 4) == FRESH
    assert EngineSettings(groups=2).for_run(RunConfig(update="hybrid", groups=4), 8).groups == 4


def test_a_timeline_run_turns_the_timeline_on_and_it_stays_on():
    on = FRESH.for_run(RunConfig(timeline_steps=5), 4)
    assert on == FRESH.replace(timeline=True)
    assert on.for_run(RunConfig(), 4) == on


def test_a_run_never_changes_cycle_time_or_fusion():
    lab = EngineSettings(cycle_time_ms=2.0, fusion_mb=0.0)
    assert lab.for_run(RunConfig(update="hybrid", groups=2, timeline_steps=3), 4) == lab.replace(
        timeline=True, groups=2
    )


def test_groups_that_no_longer_divide_the_workers_are_dropped():
    assert EngineSettings(groups=2).for_workers(3) == FRESH
    assert EngineSettings(groups=2).for_workers(6) == EngineSettings(groups=2)


def test_the_engine_environment():
    assert FRESH.env() == {
        "HOROVOD_CYCLE_TIME": "0.1",
        "HOROVOD_FUSION_THRESHOLD": str(64 * 2**20),
        GROUPS_ENV: "1",  # (set even for one group: a stray value must not leak in)
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
    }
    env = EngineSettings(
        cycle_time_ms=2.0, fusion_mb=0.0, timeline=True, groups=2, stall_s=30.4
    ).env()
    assert env == {
        "HOROVOD_CYCLE_TIME": "2",
        "HOROVOD_FUSION_THRESHOLD": "0",
        GROUPS_ENV: "2",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
        "HOROVOD_TIMELINE": "DYNAMIC",
    }


BAD = [
    ("cycle_time_ms", 0, "> 0"),
    ("cycle_time_ms", 1001, "<= 1000"),
    ("cycle_time_ms", math.nan, "finite"),
    ("cycle_time_ms", True, "finite"),
    ("fusion_mb", -1, ">= 0"),
    ("fusion_mb", "64", "finite"),
    ("timeline", 1, "True or False"),
    ("groups", 0, "integer from 1"),
    ("groups", 2.0, "integer from 1"),
    ("stall_s", 0.5, "from 1 to 86400"),
    ("stall_s", math.inf, "finite"),
]


@pytest.mark.parametrize("name,value,words", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_settings_name_field_value_and_rule(name, value, words):
    with pytest.raises(ConfigError) as info:
        EngineSettings(**{name: value})
    msg = str(info.value)
    assert f"EngineSettings.{name}" in msg and repr(value) in msg and words in msg


def test_replace_to_dict_and_from_dict():
    s = EngineSettings(cycle_time_ms=1.0, groups=2)
    assert EngineSettings.from_dict(s.to_dict()) == s
    assert s.to_dict() == {
        "cycle_time_ms": 1.0, "fusion_mb": 64.0, "timeline": False, "groups": 2, "stall_s": 120.0
    }  # fmt: skip
    with pytest.raises(ConfigError, match="no field 'cycle'"):
        s.replace(cycle=1.0)
    with pytest.raises(ConfigError, match="fusion_mb=-2"):
        s.replace(fusion_mb=-2)
    assert "cycle time 1 ms" in s.describe() and "2 synchronous groups" in s.describe()


def _old_record(root, **engine):
    """A record as hpclab wrote it while the two settings were RunConfig fields."""
    path = write_run(root, workers=2, samples_per_sec=5000.0)
    meta = json.loads((path / "config.json").read_text())
    meta["config"].update({"hvd_cycle_time_ms": 1.0, "hvd_fusion_mb": 0.0, **engine})
    (path / "config.json").write_text(json.dumps(meta))
    return path, meta


def test_an_old_record_with_the_settings_in_its_config_loads(tmp_path):
    path, meta = _old_record(tmp_path)
    record = load_run(path)
    assert "hvd_cycle_time_ms" not in record.config and "hvd_fusion_mb" not in record.config
    assert record.meta["lab"]["engine_settings"] == {"cycle_time_ms": 1.0, "fusion_mb": 0.0}
    assert RunConfig.from_dict(record.config).batch_per_worker == 64  # a RunConfig again
    assert record.label.endswith("×2")
    facts = run_facts(path)
    assert facts.engine_settings == {"cycle_time_ms": 1.0, "fusion_mb": 0.0}
    assert facts.config == record.config
    # the same rule for any run-like object whose config is such a dict
    duck = SimpleNamespace(config=dict(meta["config"]), workers=2, history=[], epochs=[])
    assert run_facts(duck).engine_settings == {"cycle_time_ms": 1.0, "fusion_mb": 0.0}
    assert "hvd_cycle_time_ms" not in run_facts(duck).config
    assert settle_engine_settings(meta) is not meta and "hvd_fusion_mb" in meta["config"]


def test_a_sweep_reuses_a_record_only_under_the_same_throughput_settings(tmp_path):
    path, meta = _old_record(tmp_path)
    config = {k: v for k, v in meta["config"].items() if not k.startswith("hvd_")}
    assert find_finished(tmp_path, config, 2) == path
    assert (
        find_finished(tmp_path, config, 2, EngineSettings(cycle_time_ms=1.0, fusion_mb=0)) == path
    )
    assert find_finished(tmp_path, config, 2, EngineSettings()) is None
    new = write_run(tmp_path / "new", workers=2, lab={"engine_settings": FRESH.to_dict()})
    config = json.loads((new / "config.json").read_text())["config"]
    assert find_finished(tmp_path / "new", config, 2, EngineSettings(groups=2)) == new


# -- the command line: lab options of `hpclab run` and `hpclab sweep` -------------------------


def test_the_cli_takes_the_settings_as_lab_options():
    from hpclab.tools import cli, cli_run

    args = cli.build_parser().parse_args(
        ["run", "--hvd-cycle-time-ms", "2", "--hvd-fusion-mb", "0"]
    )
    assert cli_run._engine_settings(args, groups=2) == EngineSettings(2.0, 0.0, groups=2)  # hybrid
    sweep = cli.build_parser().parse_args(["sweep", "--batch-per-worker", "32,64"])
    assert cli_run._engine_settings(sweep) == FRESH


def test_a_bad_setting_on_the_command_line_is_one_sentence_and_exit_2(capsys):
    from hpclab.tools import cli

    assert cli.main(["run", "--hvd-cycle-time-ms", "0", "--workers", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "cycle_time_ms=0.0" in err and "> 0" in err
