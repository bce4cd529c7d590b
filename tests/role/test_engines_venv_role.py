"""The engines role for a venv release on localhost, with Debian 12's own Python and pip as on a node: the wheelhouse
(the lab's metadata-only vllm wheel among its wheels) installed with pip's hash checking from the verified manifest,
the hash-pinned requirements kept in the environment, a second run changing nothing; a wheel swapped in the bundle
after model_verify checked it is refused by pip itself, and nothing of it is installed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl.bundle import write_manifest
from atlaslab.doubles.wheelhouse import VLLM_SHIM, MetadataShim, build_metadata_wheel
from support.ansible_run import ansible_env, run_playbook
from support.playbooks import ok

SYSTEM_PYTHON = Path("/usr/bin/python3")
WHEELSET = "tiny-1.0"
ENGINE = MetadataShim("tiny-engine", "1.0", "the engine")
PLAYBOOK = """
- name: engines role test
  hosts: localhost
  gather_facts: false
  roles:
    - role: engines
"""

pytestmark = [pytest.mark.role, pytest.mark.skipif(
    os.geteuid() != 0 or subprocess.run([str(SYSTEM_PYTHON), "-c", "import ensurepip"]).returncode != 0,
    reason="the engine environments are root's, made with the system Python's venv (python3-venv)")]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundle")
    house = root / "wheels" / WHEELSET
    build_metadata_wheel(house, VLLM_SHIM)
    build_metadata_wheel(house, ENGINE)
    (house / "requirements.lock").write_text("tiny-engine==1.0\nvllm==0.32.0+cpu\n")
    write_manifest(root, "test")
    return root


class Node:
    def __init__(self, tmp: Path, bundle: Path):
        self.tmp, self.bundle = tmp, bundle
        self.venv = tmp / "engines" / WHEELSET
        (tmp / "play.yml").write_text(PLAYBOOK)
        (tmp / "inventory.ini").write_text(
            f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")

    def play(self, *extra: str, python: Path = SYSTEM_PYTHON) -> subprocess.CompletedProcess:
        extra_vars = {
            # what the signature check (roles/bundle_trust) sets: the verified manifest's sha256
            "atlas_bundle_manifest_sha256": hashlib.sha256((self.bundle / "manifest.json").read_bytes()).hexdigest(),
            "engines_name": "tiny", "engines_version": "1.0", "engines_bundle_dir": str(self.bundle),
            "engines_root": str(self.tmp / "engines"), "engines_stamp_dir": str(self.tmp / "stamps"),
            "engines_python": str(python), "engines_import_check": "json",
        }
        return run_playbook(self.tmp / "inventory.ini", self.tmp / "play.yml", "-e", json.dumps(extra_vars), *extra,
                            cwd=self.tmp, env=ansible_env(self.tmp), timeout=600)

    def installed(self) -> dict[str, str]:
        code = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.metadata['Summary']" \
               " for d in m.distributions() if d.metadata['Name'] in ('vllm', 'tiny-engine')}))"
        out = subprocess.run([str(self.venv / "bin/python"), "-c", code], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)


@pytest.fixture()
def node(tmp_path: Path, bundle: Path) -> Node:
    return Node(tmp_path, bundle)


def test_wheels_install_with_the_manifests_hashes_and_a_second_run_changes_nothing(node: Node, bundle: Path) -> None:
    check = ok(node.play("--check"))
    assert check["failed"] == 0 and not node.venv.exists()
    ok(node.play())
    assert node.installed() == {"vllm": VLLM_SHIM.summary, "tiny-engine": "the engine"}
    house = bundle / "wheels" / WHEELSET
    digest = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in house.glob("*.whl")}
    assert (node.venv / ".atlas-requirements.txt").read_text().splitlines() == [
        f"tiny-engine==1.0 --hash=sha256:{digest['tiny_engine-1.0-py3-none-any.whl']}",
        f"vllm==0.32.0+cpu --hash=sha256:{digest['vllm-0.32.0+cpu-py3-none-any.whl']}",
    ]
    assert ok(node.play())["changed"] == 0


def test_a_wheel_swapped_after_its_check_is_refused_by_pip(node: Node, bundle: Path, tmp_path: Path) -> None:
    """The account that can write the bundle swaps a wheel after model_verify read it, while the environment is
    made: same name and version, other bytes. pip reads the swapped wheel, and its hash checking refuses it."""
    copy = tmp_path / "bundle"
    subprocess.run(["cp", "-a", str(bundle), str(copy)], check=True)
    node.bundle = copy
    swapper = tmp_path / "python3"
    swapper.write_text(f"""#!/bin/sh
{SYSTEM_PYTHON} "$@" || exit $?
{sys.executable} -c 'from atlaslab.doubles.wheelhouse import MetadataShim, build_metadata_wheel as b; \
b(__import__("pathlib").Path("{copy / "wheels" / WHEELSET}"), MetadataShim("tiny-engine", "1.0", "swapped"))'
""")
    swapper.chmod(0o755)
    run = node.play(python=swapper)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in out, out[-3000:]
    assert "swapped" not in node.installed().values()
    assert not (node.venv / ".atlas-installed").exists()
