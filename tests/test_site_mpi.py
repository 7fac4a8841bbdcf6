"""The srun plugin follows the site's MPI (hpclab.cluster.site_mpi), the world check names the
plugin that would work and refuses a thread level Horovod cannot use (hpclab.cluster.world)."""

from __future__ import annotations

import json

import pytest

from hpclab.cluster import site_mpi, slurm
from hpclab.cluster.launch import plan_launch
from hpclab.cluster.profiles import BUILTIN, parse
from hpclab.cluster.site_mpi import default_srun_mpi, family, flavour_of, flavour_of_soname
from hpclab.cluster.world import check_world

ALLOC = {"SLURM_JOB_ID": "42", "SLURM_JOB_CPUS_PER_NODE": "8", "SLURM_JOB_NUM_NODES": "1"}
# First lines of MPI_Get_library_version, as the ranks report them (rank/engine.py)
MPICH = "MPICH Version: 5.0.2"
OPENMPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
CRAY = "MPI VERSION : CRAY MPICH version 8.1.28.15 (ANL base 3.4a2)"
INTEL = "Intel(R) MPI Library 2021.10 for Linux* OS"


@pytest.mark.parametrize(
    ("flavour", "site", "plugin"),
    [
        ("mpich", "", "pmi2"),
        ("mpich", "none", "pmi2"),  # Slurm's default MpiDefault never decides
        ("mpich", "pmix", "pmi2"),  # another family: the MPI's own plugin
        ("intelmpi", "", "pmi2"),
        ("openmpi", "", "pmix"),
        ("openmpi", "pmi2", "pmix"),
        ("openmpi", "pmix_v4", "pmix_v4"),  # the site's PMIx version wins within the family
        ("cray-mpich", "", "cray_shasta"),
        ("cray-mpich", "cray_shasta", "cray_shasta"),
        ("", "pmix_v5", "pmix_v5"),  # unknown MPI: the site's default
        ("", "none", "pmi2"),
        ("", "", "pmi2"),
    ],
)
def test_the_default_plugin_follows_the_mpi_then_the_sites_family(flavour, site, plugin):
    chosen, why = default_srun_mpi(flavour, site)
    assert chosen == plugin and why


def test_why_names_the_mpi_and_a_site_default_it_overrides():
    assert "Open MPI" in default_srun_mpi("openmpi", "pmi2")[1]
    assert "MpiDefault=pmi2 is not for it" in default_srun_mpi("openmpi", "pmi2")[1]
    assert "set slurm.srun_mpi" in default_srun_mpi("", "")[1]


def test_flavours_from_library_versions_and_sonames():
    assert [flavour_of(t) for t in (MPICH, OPENMPI, CRAY, INTEL, "")] == [
        "mpich",
        "openmpi",
        "cray-mpich",
        "intelmpi",
        "",
    ]
    assert flavour_of_soname("libmpi.so.40") == "openmpi"
    assert flavour_of_soname("libmpi.so.12") == "mpich"
    assert flavour_of_soname("libmpi_cray.so.12") == "cray-mpich"
    assert flavour_of_soname("libmpi_gnu_123.so.12") == "cray-mpich"
    assert flavour_of_soname("libfoo.so") == ""
    assert family("pmix_v4") == family("pmix") == "pmix" and family("cray_shasta") == "cray_shasta"


def test_horovod_flavour_reads_the_build_record_setup_writes(tmp_path):
    record = {"env": {"mpi": {"flavour": "openmpi"}}}
    (tmp_path / site_mpi.INSTALLED_MARKER).write_text(json.dumps(record))
    assert site_mpi.horovod_flavour(str(tmp_path)) == "openmpi"
    assert site_mpi.horovod_flavour(str(tmp_path / "none")) == ""  # no record, no Horovod


def test_scontrol_show_config_is_read_by_key():
    text = "Configuration data as of 2026-11-26T15:00:00\nMinJobAge               = 300 sec\n"
    text += "MpiDefault              = pmix_v4\nMpiParams               = ports=12000-12999\n"
    assert slurm.config_value(text, "MpiDefault") == "pmix_v4"
    assert slurm.config_value(text, "MpiParams") == "ports=12000-12999"
    assert slurm.config_value(text, "Nothing") == ""


def plan(profile, **kw):
    return plan_launch(profile, 2, 1, 0, ALLOC, cluster_id="c1", state_root="/s", **kw)


def test_auto_profiles_plan_the_mpis_plugin_and_say_why():
    p = plan(BUILTIN["slurm-allocation"], mpi_flavour="openmpi", site_mpi_default="none")
    assert "--mpi=pmix" in p.launch_args and p.srun_mpi == "pmix"
    assert any(n.startswith("srun --mpi=pmix: ") and "Open MPI" in n for n in p.notes)
    cray = plan(BUILTIN["slurm-allocation"], mpi_flavour="cray-mpich")
    assert "--mpi=cray_shasta" in cray.launch_args
    named = parse('[slurm]\nsrun_mpi = "pmi2"\n', source="site.toml")
    kept = plan(named, mpi_flavour="openmpi")  # a profile's own plugin is never second-guessed
    assert "--mpi=pmi2" in kept.launch_args and not any("srun --mpi" in n for n in kept.notes)
    assert BUILTIN["local"].slurm.srun_mpi == "auto"


def test_plan_facts_asks_nothing_for_a_named_plugin_or_a_local_launch():
    assert site_mpi.plan_facts("pmi2", local=False) == {}
    assert site_mpi.plan_facts("auto", local=True) == {}


def ident(rank, size, library=MPICH, **kw):
    return {"rank": rank, "size": size, "cpus": 2, "mpi_library": library, **kw}


def test_singletons_under_the_wrong_plugin_name_the_one_that_works():
    errors, _ = check_world([ident(0, 1, OPENMPI), ident(0, 1, OPENMPI)], 2, 1, "srun", "pmi2")
    assert len(errors) == 1
    assert "srun --mpi=pmi2 does not start Open MPI" in errors[0]
    assert 'slurm.srun_mpi = "pmix"' in errors[0]
    errors, _ = check_world([ident(0, 1), ident(0, 1)], 2, 1, "sbatch", "pmix_v4")
    assert 'slurm.srun_mpi = "pmi2"' in errors[0]  # MPICH under PMIx
    errors, _ = check_world([ident(0, 1, OPENMPI)] * 2, 2, 1, "srun", "pmix")
    assert "is the plugin Open MPI needs" in errors[0] and "libpmix" in errors[0]


def test_a_thread_level_below_multiple_is_refused_unless_horovod_is_told():
    low = [ident(0, 2, mpi_thread="serialized"), ident(1, 2, mpi_thread="serialized")]
    errors, _ = check_world(low, 2, 1, "srun", "cray_shasta")
    assert len(errors) == 1 and "'serialized'" in errors[0]
    assert "MPICH_MAX_THREAD_SAFETY" in errors[0] and "HOROVOD_MPI_THREADS_DISABLE" in errors[0]
    disabled = {"HOROVOD_MPI_THREADS_DISABLE": "1"}
    assert check_world(low, 2, 1, "srun", "cray_shasta", disabled) == ([], [])
    good = [ident(0, 2, mpi_thread="multiple"), ident(1, 2, mpi_thread="multiple")]
    assert check_world(good, 2, 1, "srun", "pmi2") == ([], [])


@pytest.mark.mpi
def test_every_rank_records_its_mpi_library_and_thread_level(lab):
    """The shared lab's ranks (real MPICH engines): mpi4py asked for MPI_THREAD_MULTIPLE."""
    for rank in lab.ranks:
        assert flavour_of(rank["mpi_library"]) == "mpich"
        assert rank["mpi_thread"] == "multiple"


@pytest.mark.mpi
@pytest.mark.own_lab
def test_a_real_world_below_thread_multiple_stops_the_start_with_the_sentence(tmp_path):
    """Real engines whose mpi4py asks MPICH for MPI_THREAD_SERIALIZED (MPI4PY_RC_THREAD_LEVEL,
    mpi4py's rc variable): MPICH grants exactly that, and the lab stops before any training."""
    from hpclab import Lab
    from hpclab.core.errors import LabError

    toml = tmp_path / "serialized.toml"
    toml.write_text(
        '[launch]\nmode = "mpiexec"\n'
        '[environment]\nvars = { MPI4PY_RC_THREAD_LEVEL = "serialized" }\n'
    )
    with pytest.raises(LabError, match="thread level 'serialized', but Horovod needs"):
        Lab(workers=2, profile=str(toml), runs_dir=tmp_path / "runs", verbose=False)


def test_open_mpi_aborting_at_init_under_the_wrong_plugin_is_named():
    """What Debian's Open MPI 4.1.4 printed under `srun --mpi=pmi2` (tests/slurm/test_openmpi.py
    runs it for real); the launcher's output is all the lab has of engines that never started."""
    said = (
        'The application appears to have been direct launched using "srun",\n'
        "but OMPI was not built with SLURM's PMI support and therefore cannot\n"
        "execute. There are several options for building PMI support under\n"
    )
    sentence = site_mpi.init_failure(said, "pmi2")
    assert "srun --mpi=pmi2" in sentence and 'slurm.srun_mpi = "pmix"' in sentence
    assert site_mpi.init_failure("engine registered", "pmi2") == ""


def test_open_mpis_bindings_are_not_taken_for_its_library():
    """ldd of Horovod's ops built against Debian's Open MPI 4.1.4 lists libmpi_cxx first."""
    from hpclab.tools.linkage import parse_ldd_libmpi

    ldd = (
        "\tlibmpi_cxx.so.40 => /lib/x86_64-linux-gnu/libmpi_cxx.so.40 (0x1)\n"
        "\tlibmpi.so.40 => /lib/x86_64-linux-gnu/libmpi.so.40 (0x2)\n"
    )
    assert parse_ldd_libmpi(ldd) == ("libmpi.so.40", "/lib/x86_64-linux-gnu/libmpi.so.40")
    cray = "\tlibmpi_gnu_123.so.12 => /opt/cray/pe/lib64/libmpi_gnu_123.so.12 (0x3)\n"
    assert parse_ldd_libmpi(cray)[0] == "libmpi_gnu_123.so.12"
    assert flavour_of_soname(parse_ldd_libmpi(ldd)[0]) == "openmpi"
