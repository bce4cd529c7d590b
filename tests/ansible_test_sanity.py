"""``ansible-test sanity`` on the atlas.serving collection, from this virtual environment, no containers.

Run by ``make lint``: ``python tests/ansible_test_sanity.py [ansible-test sanity options]``, e.g.
``--test validate-modules``. Exit status: ansible-test's.

ansible-test (ansible-core's test tool) runs each sanity test in a virtual environment of its own and
installs that test's pinned requirements (pylint, pycodestyle, voluptuous, ...) there. Three things it
expects that an air-gapped build machine does not give it are set up under a HOME of its own,
``.venv/ansible-test/`` (nothing outside the checkout is written):

- ``get-pip.py``: ansible-test bootstraps pip in each environment with a script it downloads from
  ci-files.testing.ansible.com unless ``~/.ansible/test/cache/get_pip_<version>.py`` exists
  (``ansible_test/_util/target/setup/requirements.py``, ``bootstrap()``). A stand-in goes there: it
  bootstraps the pip that Python ships (``ensurepip``) and installs the requested pip with it.
- pip's settings: ansible-test runs pip with a filtered environment (``common_environment()`` in
  ``ansible_test/_internal/util.py`` keeps HOME, PATH and a few others), so ``PIP_*`` variables do not
  reach it, and with that HOME the user's ``~/.config/pip/pip.conf`` is not read either. The settings this
  machine's pip uses (``pip config list``: its files and its ``PIP_*`` variables) are written to that
  HOME's ``.config/pip/pip.conf``, so the environments reach the package index this pip reaches.
- The nodes' Pythons: ``compile`` and ``import`` run on every Python a node may run the modules with,
  ``preflight_min_python`` (``roles/preflight/defaults/main.yml``) up to the newest ansible-test supports.
  ansible-test looks each ``pythonX.Y`` up on PATH; links to the interpreters found (PATH, then pyenv's
  versions) go first on PATH. A version with no interpreter on this machine is named and left out.

The environments stay under that HOME: the first run installs their requirements, later runs reuse them.
ansible-test writes its reports to the collection's ``tests/output/``; they are removed afterwards (the
results are in its output). The collection has no ignore file (``tests/sanity/ignore-X.Y.txt``): every
test passes as the code is. An entry there would need its reason beside it, and Galaxy's certification
allows only a few kinds (ansible-lint's ``sanity`` rule, which ``make lint`` runs, refuses the others).
"""

from __future__ import annotations

import ast
import contextlib
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = ROOT / "collections" / "ansible_collections" / "atlas" / "serving"
HOME = ROOT / ".venv" / "ansible-test"
PREFLIGHT_DEFAULTS = ROOT / "roles" / "preflight" / "defaults" / "main.yml"

# Written to ~/.ansible/test/cache/get_pip_<version>.py. It runs in each fresh environment, on any
# Python ansible-test supports: ``get-pip.py [pip options] pip==X [--no-setuptools] [--no-wheel]``.
GET_PIP = '''\
"""Stand-in for get-pip.py (written by tests/ansible_test_sanity.py): the pip Python ships (ensurepip),
then ``pip install`` of the arguments; setuptools removed when --no-setuptools asks for none."""
import subprocess
import sys

args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
if "--no-setuptools" in sys.argv[1:]:
    subprocess.check_call([sys.executable, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check",
                           "setuptools"])
'''


def pip_conf(listing: str) -> str:
    """``pip config list`` output (``section.name='value'`` lines; ``:env:.name`` from a ``PIP_*``
    variable) -> a pip.conf with the same effect: a variable wins over the files for every command, so
    its value goes to ``[global]`` and the same name leaves the other sections."""
    sections: dict[str, dict[str, str]] = {}
    from_env: dict[str, str] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.partition(".")
        if not (sep and dot and name):
            continue
        value = ast.literal_eval(value)
        if section == ":env:":
            from_env[name] = value
        else:
            sections.setdefault(section, {})[name] = value
    for name, value in from_env.items():
        for options in sections.values():
            options.pop(name, None)
        sections.setdefault("global", {})[name] = value
    return "".join(f"[{section}]\n" + "".join(f"{name} = {value}\n" for name, value in options.items()) + "\n"
                   for section, options in sections.items() if options)


def runs(python: str) -> bool:
    """Whether ``python`` starts (a pyenv shim for a version that is not selected does not)."""
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=60, check=False).returncode == 0
    except OSError:
        return False


def find_python(version: str, path: str | None = None, pyenv_root: str | None = None) -> str | None:
    """An interpreter of ``version`` (``3.9``): ``python3.9`` on PATH that starts, else pyenv's newest."""
    found = shutil.which(f"python{version}", path=path)
    if found and runs(found):
        return found
    root = pyenv_root or os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")),
                        key=lambda p: [int(n) for n in Path(p).parents[1].name.split(".") if n.isdigit()])
    return next((p for p in reversed(candidates) if runs(p)), None)


def node_pythons(floor: str, supported: tuple[str, ...]) -> list[str]:
    """The versions ansible-test supports from ``floor`` (the lowest a node may run) up."""
    def key(version: str) -> tuple[int, ...]:
        return tuple(int(n) for n in version.split("."))
    return [v for v in supported if key(v) >= key(floor)]


def prepare(home: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """The private HOME (pip.conf, the get-pip stand-in, bin/ links): the environment to run ansible-test
    in, the ``--target-python`` versions and the versions left out."""
    from ansible_test._util.target.common.constants import CONTROLLER_PYTHON_VERSIONS, REMOTE_ONLY_PYTHON_VERSIONS

    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    pip_version = _bootstrap_pip_version()
    (cache / f"get_pip_{pip_version.replace('.', '_')}.py").write_text(GET_PIP)

    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    (home / ".config" / "pip").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "pip" / "pip.conf").write_text(pip_conf(listing))

    floor = str(yaml.safe_load(PREFLIGHT_DEFAULTS.read_text())["preflight_min_python"])
    controller = f"{sys.version_info.major}.{sys.version_info.minor}"
    bin_dir = home / "bin"
    shutil.rmtree(bin_dir, ignore_errors=True)
    bin_dir.mkdir()
    targets, missing = [], []
    for version in node_pythons(floor, REMOTE_ONLY_PYTHON_VERSIONS + CONTROLLER_PYTHON_VERSIONS):
        python = sys.executable if version == controller else find_python(version)
        if python is None:
            missing.append(version)
            continue
        (bin_dir / f"python{version}").symlink_to(python)
        targets.append(version)
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return env, targets, missing


def _bootstrap_pip_version() -> str:
    """The pip ansible-test bootstraps each environment with (its get_pip_<version>.py cache name)."""
    from ansible_test._internal.python_requirements import get_venv_packages

    class Python:  # get_venv_packages() reads only .version
        version = f"{sys.version_info.major}.{sys.version_info.minor}"

    return get_venv_packages(Python())["pip"]


def command(targets: list[str], extra: list[str]) -> list[str]:
    controller = f"{sys.version_info.major}.{sys.version_info.minor}"
    argv = [str(Path(sys.executable).parent / "ansible-test"), "sanity", "--color", "no",
            "--controller", f"origin:python={controller}@{sys.executable}"]
    for version in targets:
        argv += ["--target-python", version]
    return argv + extra


def main(argv: list[str]) -> int:
    env, targets, missing = prepare(HOME)
    if missing:
        print(f"ansible-test sanity: no Python {', '.join(missing)} on this machine: compile and import not run "
              f"on {'it' if len(missing) == 1 else 'them'}", flush=True)
    try:
        return subprocess.run(command(targets, argv), cwd=COLLECTION, env=env, check=False).returncode
    finally:
        shutil.rmtree(COLLECTION / "tests" / "output", ignore_errors=True)
        with contextlib.suppress(OSError):
            (COLLECTION / "tests").rmdir()  # when it held only the reports


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
