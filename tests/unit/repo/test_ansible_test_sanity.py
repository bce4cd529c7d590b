"""tests/ansible_test_sanity.py: what it prepares so that `ansible-test sanity` runs here (make lint runs it).

- pip.conf: a pip run with a filtered environment (as ansible-test runs it) and that HOME sees the
  settings this pip sees, PIP_* variables included;
- the get-pip stand-in bootstraps pip in an environment without one, and removes setuptools when asked;
- the node Pythons: a pyenv shim that does not start is passed over, pyenv's newest version is taken.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("ansible_test_sanity", ROOT / "tests" / "ansible_test_sanity.py")
sanity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sanity)


def test_pip_conf_keeps_the_files_and_lets_a_variable_win():
    listing = ("global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
               "global.find-links='/opt/old'\n"
               "install.find-links='/opt/install-only'\n"
               "install.no-compile='1'\n"
               ":env:.find-links='/opt/wheels'\n"
               ":env:.default-timeout='180'\n"
               "not a setting\n")
    conf = configparser.ConfigParser()
    conf.read_string(sanity.pip_conf(listing))
    assert dict(conf["global"]) == {"extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
                                    "find-links": "/opt/wheels", "default-timeout": "180"}
    assert dict(conf["install"]) == {"no-compile": "1"}


def test_a_filtered_environment_sees_what_this_pip_sees(tmp_path):
    """The conf written from `pip config list` (a PIP_* variable here) is what pip reads with only HOME and
    PATH set, as ansible-test runs it."""
    env = {**os.environ, "PIP_INDEX_URL": "file:///srv/mirror/simple", "PIP_RETRIES": "7"}
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], env=env, capture_output=True,
                             text=True, check=True).stdout
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(sanity.pip_conf(listing))
    seen = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=True).stdout
    assert "global.index-url='file:///srv/mirror/simple'" in seen and "global.retries='7'" in seen, seen


def test_the_get_pip_stand_in_bootstraps_pip_without_setuptools(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    script = tmp_path / "get_pip.py"
    script.write_text(sanity.GET_PIP)
    # ansible-test passes pip options, the pinned pip and these two flags; no index here: the bundled pip
    run = subprocess.run([str(python), str(script), "--disable-pip-version-check", "--no-index", "pip",
                          "--no-setuptools", "--no-wheel"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0
    assert subprocess.run([str(python), "-c", "import setuptools"], capture_output=True,
                          check=False).returncode != 0


def _exe(path: Path, code: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {code}\n")
    path.chmod(0o755)
    return path


def test_a_shim_that_does_not_start_is_passed_over_for_pyenvs_newest(tmp_path):
    shims = tmp_path / "shims"
    _exe(shims / "python3.9", 127)  # pyenv's shim for a version that is not selected
    root = tmp_path / "pyenv"
    _exe(root / "versions" / "3.9.2" / "bin" / "python3.9", 0)
    newest = _exe(root / "versions" / "3.9.18" / "bin" / "python3.9", 0)
    _exe(root / "versions" / "3.10.1" / "bin" / "python3.10", 0)
    assert sanity.find_python("3.9", path=str(shims), pyenv_root=str(root)) == str(newest)
    assert sanity.find_python("3.12", path=str(shims), pyenv_root=str(root)) is None
    on_path = _exe(tmp_path / "bin" / "python3.9", 0)
    assert sanity.find_python("3.9", path=str(on_path.parent), pyenv_root=str(root)) == str(on_path)


def test_the_node_pythons_start_at_the_preflight_floor():
    supported = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
    assert sanity.node_pythons("3.9", supported) == ["3.9", "3.10", "3.11", "3.12", "3.13"]
    assert sanity.node_pythons("3.10", supported)[0] == "3.10"
