"""The pinned stack stays consistent: requirements/base.in, requirements/lock.txt, environment.yml.

Fast: reads text files only (no TensorFlow, no MPI). The allowed versions come from
docs/DESIGN: Horovod 0.28.1 needs TensorFlow 2.15 (Keras 2); TF 2.15 needs numpy<2, protobuf<5.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TF_VERSION = "2.15.1"
TF_NAMES = ("tensorflow-cpu", "tensorflow")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"requirements/lock.txt line {line!r} is not an exact `name==version` pin"
        pins[_norm(name)] = version.strip()
    return pins


def _environment() -> tuple[dict[str, str], dict[str, str]]:
    """(conda pins, pip pins) of environment.yml as {normalised name: version spec}."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep.get("pip", []):
                req = Requirement(line)
                pip[_norm(req.name)] = str(req.specifier)
        else:
            match = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", dep.strip())
            assert match, f"cannot parse environment.yml dependency {dep!r}"
            conda[_norm(match.group(1))] = match.group(2).strip()
    return conda, pip


def satisfies(version: str, spec: str) -> bool:
    """Whether `version` meets a conda (``=1.2``, ``=1.2.3=build``) or PEP 440 (``==1.2.3``) spec."""
    spec = spec.strip()
    if not spec:
        return True
    if spec.startswith("=") and not spec.startswith("=="):
        wanted = spec[1:].split("=", 1)[0].rstrip(".*")  # conda `=X.Y` means X.Y.*
        return version == wanted or version.startswith(wanted + ".")
    return Version(version) in SpecifierSet(spec)


def test_satisfies_understands_conda_and_pip_specs():
    assert satisfies("5.0.2", "=5.0")
    assert not satisfies("5.1.0", "=5.0")
    assert satisfies("5.0.2", "=5")  # conda: `=5` means 5.*
    assert satisfies("1.26.4", "=1.26.4")
    assert satisfies("2.15.1", "==2.15.1")
    assert not satisfies("2.16.0", "==2.15.1")
    assert satisfies("4.25.9", "<5")


def test_lock_is_exact_and_has_no_project_or_horovod():
    pins = _lock()
    assert len(pins) > 50, "requirements/lock.txt looks truncated"
    assert "horovod" not in pins, "Horovod is built by scripts/setup.sh; it must not be in the lock"
    assert "hpclab" not in pins


def test_every_base_in_requirement_is_locked_and_satisfied():
    pins = _lock()
    for raw in (ROOT / "requirements" / "base.in").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        name = _norm(req.name)
        assert name in pins, f"{req.name} is in base.in but not in lock.txt; run `make lock`"
        assert Version(pins[name]) in req.specifier, (
            f"lock.txt pins {req.name}=={pins[name]}, which base.in's {req} excludes; run `make lock`"
        )


def test_tensorflow_numpy_protobuf_pins_are_the_allowed_ones():
    pins = _lock()
    conda, pip = _environment()
    env_pins = {**conda, **pip}

    tf_locked = [pins[n] for n in TF_NAMES if n in pins]
    assert tf_locked == [TF_VERSION], (
        f"lock.txt must pin one TensorFlow {TF_VERSION}, it has {tf_locked}"
    )
    assert pins["keras"].startswith("2.15."), "TensorFlow 2.15 pairs with Keras 2.15 (no Keras 3)"
    assert Version(pins["numpy"]) < Version("2"), "TensorFlow 2.15 fails to import with numpy 2"
    assert Version("3.20.3") <= Version(pins["protobuf"]) < Version("5"), "TF 2.15 needs protobuf<5"

    tf_env = {n: env_pins[n] for n in TF_NAMES if n in env_pins}
    assert tf_env, "environment.yml installs no TensorFlow"
    for name, spec in tf_env.items():
        assert spec in (f"=={TF_VERSION}", f"={TF_VERSION}"), (
            f"environment.yml pins {name}{spec}, expected {TF_VERSION}"
        )
    assert env_pins.get("numpy") in (f"={pins['numpy']}", f"=={pins['numpy']}"), (
        f"environment.yml must pin numpy to the lock's {pins['numpy']}, it has {env_pins.get('numpy')!r}"
    )
    assert "protobuf" in env_pins and satisfies(pins["protobuf"], env_pins["protobuf"])
    assert not satisfies("5.0.0", env_pins["protobuf"]), "environment.yml must keep protobuf<5"


def test_environment_yml_agrees_with_lock():
    pins = _lock()
    conda, pip = _environment()
    shared = 0
    for source, deps in (("conda", conda), ("pip", pip)):
        for name, spec in deps.items():
            if name not in pins:
                continue
            shared += 1
            assert satisfies(pins[name], spec), (
                f"environment.yml ({source}) pins {name}{spec} but lock.txt has {name}=={pins[name]}"
            )
    assert shared >= 15, (
        f"only {shared} packages appear in both files; is environment.yml parsed right?"
    )


def test_environment_yml_says_it_is_an_untested_template_with_commands():
    """No conda channel is reachable from the project's machines, so the file cannot be run
    here; it must say so and give the commands (issue 26, item 7)."""
    text = (ROOT / "environment.yml").read_text()
    assert text.startswith("# TEMPLATE, NOT RUN:")
    for command in ("conda env create -f environment.yml", "pip install --no-build-isolation"):
        assert command in text


def test_python_is_311_everywhere():
    conda, _ = _environment()
    assert conda.get("python") == "=3.11"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # 3.12 is the second stack's (HPCLAB_STACK=py312, requirements/lock-py312.txt); this file and
    # requirements/lock.txt are the default stack's, which stays on 3.11.
    assert project["requires-python"] == ">=3.11,<3.13"


@pytest.mark.parametrize("tool", ["cmake"])
def test_build_tools_stay_below_cmake_4(tool):
    pins = _lock()
    conda, _ = _environment()
    assert Version(pins[tool]) < Version("4"), "CMake 4 rejects Horovod's bundled gloo"
    assert satisfies(pins[tool], conda[tool]) and not conda[tool].startswith("=4")
