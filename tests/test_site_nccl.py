"""The site's NCCL and its network plugin, found in fake folder trees (scripts/site_nccl.py).

Each tree is laid out as a site's ``module load nccl`` leaves it (``include/nccl.h``,
``lib/libnccl.so -> libnccl.so.2 -> libnccl.so.2.18.5``) or as the pip wheel does; the libraries
are empty files. The build's use of it (scripts/gpu_toolkit.py plan) and the wheel-cache key
(scripts/horovod_cache.py) are checked here too. Milliseconds; nothing compiled.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # install-time tooling lives beside setup.sh

import gpu_toolkit as gt  # noqa: E402
import horovod_cache as _build  # noqa: E402
import site_nccl as sn  # noqa: E402
from test_build_cache import make_env  # noqa: E402


def header(major: int, minor: int, patch: int) -> str:
    return (
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        '#define NCCL_SUFFIX ""\n'
        f"#define NCCL_VERSION_CODE {major * 10000 + minor * 100 + patch}\n"
    )


def site_tree(root: Path, version=(2, 18, 5), sub="lib", plain=True) -> Path:
    """A site NCCL: include/nccl.h and lib/libnccl.so[.2[.x.y.z]]."""
    (root / "include").mkdir(parents=True)
    (root / "include/nccl.h").write_text(header(*version))
    lib = root / sub
    lib.mkdir()
    full = lib / f"libnccl.so.{'.'.join(map(str, version))}"
    full.write_bytes(b"\x7fELF")
    (lib / "libnccl.so.2").symlink_to(full.name)
    if plain:
        (lib / "libnccl.so").symlink_to("libnccl.so.2")
    (lib / "libnccl_static.a").write_bytes(b"!<arch>")
    return root


def pip_tree(site: Path) -> Path:
    (site / "nvidia/nccl/include").mkdir(parents=True)
    (site / "nvidia/nccl/lib").mkdir(parents=True)
    (site / "nvidia/nccl/include/nccl.h").write_text(header(2, 16, 5))
    (site / "nvidia/nccl/lib/libnccl.so.2").write_bytes(b"\x7fELF")
    return site


# -- finding the NCCL --------------------------------------------------------------------------


def test_nccl_version_from_its_header():
    assert sn.parse_nccl_header(header(2, 16, 5)) == "2.16.5"
    assert gt.parse_nccl_header(header(2, 21, 5)) == "2.21.5"  # the build's name for it
    with pytest.raises(sn.NcclError, match="NCCL_MINOR"):
        sn.parse_nccl_header("#define NCCL_MAJOR 2\n")


def test_pip_nccl_gets_a_private_unversioned_link(tmp_path):
    site = pip_tree(tmp_path / "site")
    found = sn.find_nccl({}, str(site), str(tmp_path / "gpu"))
    assert found.version == "2.16.5" and found.source == sn.PIP_SOURCE and not found.site
    assert found.include.endswith("nvidia/nccl/include")
    link = Path(found.lib_dir) / "libnccl.so"
    assert link.resolve() == (site / "nvidia/nccl/lib/libnccl.so.2").resolve()
    sn.find_nccl({}, str(site), str(tmp_path / "gpu"))  # again: the links are replaced
    with pytest.raises(sn.NcclError, match="nvidia-nccl-cu12"):
        sn.find_nccl({}, str(tmp_path / "empty"), str(tmp_path / "gpu"))


@pytest.mark.parametrize("var", ["HPCLAB_NCCL_HOME", "NCCL_HOME", "NCCL_ROOT"])
def test_a_modules_nccl_home_wins_over_pip(tmp_path, var):
    home = site_tree(tmp_path / "nccl-2.18.5")
    site = pip_tree(tmp_path / "site")
    found = sn.find_nccl({var: str(home)}, str(site), str(tmp_path / "gpu"))
    assert found.source == var and found.site and found.version == "2.18.5"
    assert found.include == str(home / "include")
    assert found.lib_dir == str(home / "lib")  # it has libnccl.so: used as it is
    assert found.lib == str((home / "lib/libnccl.so.2.18.5").resolve())


def test_hpclab_nccl_home_comes_before_nccl_home(tmp_path):
    mine = site_tree(tmp_path / "mine", version=(2, 21, 5))
    module = site_tree(tmp_path / "module")
    env = {"NCCL_HOME": str(module), "HPCLAB_NCCL_HOME": str(mine)}
    assert sn.find_nccl(env, str(tmp_path), str(tmp_path / "gpu")).version == "2.21.5"


def test_lib64_without_an_unversioned_name_gets_a_private_link(tmp_path):
    home = site_tree(tmp_path / "nccl", sub="lib64", plain=False)
    found = sn.find_nccl({"NCCL_HOME": str(home)}, str(tmp_path), str(tmp_path / "gpu"))
    assert found.lib_dir == str(tmp_path / "gpu/nccl-lib")
    assert (Path(found.lib_dir) / "libnccl.so").resolve().name == "libnccl.so.2.18.5"


def test_a_home_without_the_header_or_library_is_named(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(sn.NcclError) as err:
        sn.find_nccl({"NCCL_HOME": str(bare)}, str(tmp_path), str(tmp_path / "gpu"))
    assert f"NCCL_HOME={str(bare)!r} has no include/nccl.h" in str(err.value)
    (bare / "include").mkdir()
    (bare / "include/nccl.h").write_text(header(2, 18, 5))
    with pytest.raises(sn.NcclError, match="no lib/ or lib64/ with libnccl.so"):
        sn.find_nccl({"NCCL_HOME": str(bare)}, str(tmp_path), str(tmp_path / "gpu"))


def test_a_header_of_another_version_than_the_library_is_refused(tmp_path):
    home = site_tree(tmp_path / "nccl", version=(2, 18, 5))
    (home / "include/nccl.h").write_text(header(2, 19, 3))
    with pytest.raises(sn.NcclError) as err:
        sn.find_nccl({"NCCL_HOME": str(home)}, str(tmp_path), str(tmp_path / "gpu"))
    assert "nccl.h says NCCL 2.19.3 but the library is libnccl.so.2.18.5" in str(err.value)


# -- into the build and its cache key ----------------------------------------------------------


def test_the_build_plan_exports_the_site_nccl(tmp_path, monkeypatch):
    home = site_tree(tmp_path / "nccl")
    cuda = gt.CudaCandidate("HPCLAB_CUDA_HOME", "/opt/cuda-12.4/bin/nvcc", "12.4")
    monkeypatch.setattr(gt, "find_cuda", lambda tf, env: cuda)
    monkeypatch.setattr(gt, "cuda_home_of", lambda nvcc: "/opt/cuda-12.4")
    env = {"NCCL_HOME": str(home)}
    out = gt.plan(str(tmp_path / "site"), str(tmp_path / "gpu"), "2.15.1", env)
    assert out["HOROVOD_NCCL_INCLUDE"] == str(home / "include")
    assert out["HOROVOD_NCCL_LIB"] == str(home / "lib")
    assert out["HPCLAB_NCCL_VERSION"] == "2.18.5"
    assert out["HPCLAB_NCCL_SOURCE"] == f"NCCL_HOME: {home}"
    assert out["HPCLAB_NCCL_SITE_LIB"].endswith("libnccl.so.2.18.5")
    assert out["HPCLAB_NCCL_RPATH"] == str((home / "lib").resolve())
    pip = gt.plan(str(pip_tree(tmp_path / "site")), str(tmp_path / "gpu"), "2.15.1", {})
    assert pip["HPCLAB_NCCL_SITE_LIB"] == "" and pip["HPCLAB_NCCL_RPATH"] == ""


def test_the_cache_key_names_a_site_nccl_and_blocks_reuse_across_sites():
    base = {"gpu_operations": "NCCL", "cuda": "12.4", "nccl": "2.18.5", "cuda_cc": "80,90"}
    pip = make_env(**base)
    site_a = make_env(**base, nccl_lib="/sw/nccl/2.18.5/lib/libnccl.so.2.18.5")
    site_b = make_env(**base, nccl_lib="/opt/other/lib/libnccl.so.2.18.5")
    keys = {_build.wheel_cache_key(e) for e in (pip, site_a, site_b)}
    assert len(keys) == 3
    assert "-nccl2.18.5-site" in _build.wheel_cache_key(site_a)
    assert "-site" not in _build.wheel_cache_key(pip)
    ok, why = _build.wheel_matches(_build.make_meta(site_a, "h.whl", 1.0), site_b)
    assert not ok and "site NCCL library" in why
    env = {
        "HPCLAB_GPU_OPS": "NCCL",
        "HPCLAB_CUDA_VERSION": "12.4",
        "HPCLAB_NCCL_VERSION": "2.18.5",
        "HPCLAB_NCCL_SITE_LIB": site_a.nccl_lib,
    }
    assert _build.gpu_toolkit(env)["nccl_lib"] == site_a.nccl_lib


def test_older_gpu_metadata_without_a_site_nccl_still_fits_a_pip_nccl_build():
    base = {"gpu_operations": "NCCL", "cuda": "12.2", "nccl": "2.16.5", "cuda_cc": "80"}
    meta = _build.make_meta(make_env(**base), "h.whl", 1.0)
    meta["env"].pop("nccl_lib")
    assert _build.wheel_matches(meta, make_env(**base))[0]


def test_blackwell_in_the_cc_list_needs_cuda_12_8():
    with pytest.raises(gt.GpuBuildError) as err:
        gt.parse_cc_list("90,100", "12.2")
    assert "'100', a Blackwell GPU, which CUDA 12.2's nvcc does not know" in str(err.value)
    assert gt.parse_cc_list("90,100,120", "12.8") == (90, 100, 120)
    assert gt.parse_cc_list("121", "12.9") == (121,)


# -- the network plugin ------------------------------------------------------------------------


def plugin(folder: Path, name: str = "libnccl-net.so") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"\x7fELF")
    return path


def test_aws_ofi_nccl_on_the_library_path_is_named(tmp_path):
    path = plugin(tmp_path / "aws-ofi-nccl/1.9.1/lib")
    env = {"LD_LIBRARY_PATH": f"/nonexistent{os.pathsep}{path.parent}"}
    assert sn.plugin_files(env) == [(str(path), "LD_LIBRARY_PATH")]
    sentence = sn.plugin_sentence(env)
    assert sentence.startswith(
        f"NCCL network plugin found: {path} (on LD_LIBRARY_PATH): aws-ofi-nccl"
    )
    assert "HPE Slingshot" in sentence and "'Loaded net plugin'" in sentence


def test_nccl_net_plugin_picks_a_named_plugin_or_says_it_is_missing(tmp_path):
    ofi = plugin(tmp_path / "lib", "libnccl-net-ofi.so")
    plugin(tmp_path / "lib", "libnccl-net-sharp.so")
    env = {"LD_LIBRARY_PATH": str(tmp_path / "lib"), "NCCL_NET_PLUGIN": "ofi"}
    sentence = sn.plugin_sentence(env)
    assert f"NCCL_NET_PLUGIN=ofi picks {ofi}" in sentence
    assert "nccl-rdma-sharp-plugins" in sentence
    missing = sn.plugin_sentence({"NCCL_NET_PLUGIN": "gib", "LD_LIBRARY_PATH": ""})
    assert missing.startswith("NCCL_NET_PLUGIN='gib' names a plugin that is not on LD_LIBRARY_PATH")


def test_a_plugin_given_by_path_and_one_turned_off(tmp_path):
    path = plugin(tmp_path / "opt", "libnccl-net-custom.so")
    env = {"NCCL_NET_PLUGIN": str(path)}
    assert sn.plugin_files(env) == [(str(path), "NCCL_NET_PLUGIN")]
    assert "a NCCL network plugin" in sn.plugin_sentence(env)
    off = {"NCCL_NET_PLUGIN": "none", "LD_LIBRARY_PATH": str(path.parent)}
    assert "NCCL_NET_PLUGIN=none turns it off" in sn.plugin_sentence(off)


def test_no_plugin_no_sentence(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib/libnccl.so.2").write_bytes(b"")  # NCCL itself is not a plugin
    assert sn.plugin_sentence({"LD_LIBRARY_PATH": str(tmp_path / "lib")}) is None
    assert sn.plugin_sentence({}) is None
