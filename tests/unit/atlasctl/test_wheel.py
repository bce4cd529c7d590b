"""The atlasctl wheel works with no checkout: built here, installed into a fresh virtual environment
and run from a directory outside the repository, it finds the suite it carries through
importlib.resources, and it holds no lab code, test double or benchmark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from atlasctl.bundle_sources import atlasctl_wheel, collection_tarball

ROOT = Path(__file__).resolve().parents[3]
PROFILE = "vllm-ascend-0.11.0-mistral-7b-8x64g"
# What left the product package for atlas-lab (tools/atlas-lab): its modules must not come back.
LAB_MODULES = ("atlaslab", "atlasctl/lab", "atlasctl/labkit", "rollout_bench", "verify_bench", "bench_accuracy")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built the way `make wheel` and the bundle's controller kit build it (from a fresh copy)."""
    return atlasctl_wheel(ROOT, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv with the wheel installed; the wheel's dependencies (ansible-core, jinja2, ...) are
    this environment's, on the path as a plain directory: its .pth files, the checkout's editable
    atlasctl and atlas-lab among them, are not processed."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-q",
                    "--disable-pip-version-check", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    return root


def _run(venv: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ATLAS_SUITE_DIR", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_wheel_holds_the_suite_and_no_lab_code(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if any(m in n for m in LAB_MODULES)] == []
    for wanted in ("atlasctl/suite/site.yml", "atlasctl/suite/ansible.cfg",
                   "atlasctl/suite/roles/layout/defaults/main.yml", "atlasctl/suite/playbooks/rollout.yml",
                   "atlasctl/suite/templates/", "atlasctl/suite/requirements-controller.txt",
                   "atlasctl/suite/collections/ansible_collections/atlas/serving/galaxy.yml"):
        assert any(n.startswith(wanted) for n in names), wanted
    assert not [n for n in names if n.startswith("atlasctl/suite/inventory/lab")], "the lab inventory ships"


def test_installed_atlasctl_runs_its_own_suite_outside_the_checkout(venv, tmp_path):
    where = _run(venv, "python", "-c", "import atlasctl, atlasctl.paths as p; print(atlasctl.__file__);"
                                      " print(p.suite_root()); print(p.checkout_root())", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    module, suite, checkout = where.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(suite).is_relative_to(venv), where.stdout
    assert checkout == "None"
    # the collection's code, imported by name from the wheel's copy (its atlas_serving_collection.pth)
    found = _run(venv, "python", "-c", "from ansible_collections.atlas.serving.plugins.module_utils import checksums;"
                                       " print(checksums.__file__)", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(Path(suite) / "collections"), found.stdout
    lab = _run(venv, "python", "-c", "import atlaslab", cwd=tmp_path)
    assert lab.returncode != 0 and "No module named 'atlaslab'" in lab.stderr
    rendered = _run(venv, "atlasctl", "config", "render", PROFILE, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert "/opt/atlas/engines/vllm-ascend-0.11.0/bin/vllm" in rendered.stdout
    lint = _run(venv, "atlasctl", "config", "lint", PROFILE, cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert not (tmp_path / "artifacts").exists(), "an installed atlasctl writes into the working directory"


def test_a_suite_dir_without_site_yml_is_a_clear_error(venv, tmp_path):
    env_run = subprocess.run([str(venv / "bin" / "atlasctl"), "config", "render", PROFILE], cwd=tmp_path,
                             env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                                  "ATLAS_SUITE_DIR": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert env_run.returncode != 0 and "Traceback" not in env_run.stderr
    assert f"{tmp_path}: no site.yml there (ATLAS_SUITE_DIR)" in env_run.stderr


def _controller_pins() -> dict[str, str]:
    lines = (ROOT / "requirements-controller.txt").read_text(encoding="utf-8").splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_the_execution_environment_installs_this_wheel_and_collection(tmp_path, wheel):
    """ansible-builder's create step (no container runtime) on execution-environment.yml, given what
    `make wheel` writes to dist/: the files it names exist, the pins are the controller's."""
    ee = yaml.safe_load((ROOT / "execution-environment.yml").read_text(encoding="utf-8"))
    pins = _controller_pins()
    assert ee["dependencies"]["ansible_core"]["package_pip"] == f"ansible-core=={pins['ansible-core']}"
    assert ee["dependencies"]["ansible_runner"]["package_pip"] == f"ansible-runner=={pins['ansible-runner']}"
    work = tmp_path / "ee"
    (work / "dist").mkdir(parents=True)
    shutil.copy2(wheel, work / "dist" / wheel.name)
    tarball = collection_tarball(ROOT, work / "dist")
    for name in ("execution-environment.yml", "requirements-controller.txt"):
        shutil.copy2(ROOT / name, work / name)
    builder = Path(sys.executable).parent / "ansible-builder"
    run = subprocess.run([str(builder), "create", "-f", "execution-environment.yml", "--context", "context",
                          "--output-filename", "Containerfile"],
                         cwd=work, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    containerfile = (work / "context" / "Containerfile").read_text(encoding="utf-8")
    assert f"pip install --no-deps /build/atlas/{wheel.name}" in containerfile
    assert (work / "context" / "_build" / "atlas" / tarball.name).is_file()
    assert (work / "context" / "_build" / "atlas" / wheel.name).is_file()
    python = (work / "context" / "_build" / "requirements.txt").read_text(encoding="utf-8")
    assert all(f"{name}=={version}" in python for name, version in pins.items()), python
