"""The engines role for a container release on localhost: the image archive checked against the verified manifest
(model_verify, stamps), loaded with `podman load -i` only when `podman image exists <id>` says it is absent, the
loaded id checked, a pinning name added, the record written and the fact engines_image set; a second run changes
nothing; check mode loads nothing; a tampered archive, an image the manifest does not list, and a load that gives
another id are refused. podman is a stand-in with its own store under tmp_path: nothing of this machine changes."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl import bundle
from support.ansible_run import ansible_env, run_playbook
from support.image_archives import oci_archive

pytestmark = pytest.mark.role

PLAYBOOK = """
- name: engines role test
  hosts: localhost
  gather_facts: false
  roles:
    - role: engines
  post_tasks:
    - name: the fact the serving stage reads
      ansible.builtin.copy:
        content: "{{ engines_image | default({}) | to_json }}"
        dest: "{{ result_file }}"
        mode: "0600"
      when: not ansible_check_mode
"""
# Podman's store as a JSON file: {id: [names]}; `load` adds the id in LOAD_ID (default: the archive's, as podman).
PODMAN = """#!{python}
import json, os, sys
store, log = {store!r}, {log!r}
images = json.load(open(store)) if os.path.exists(store) else {{}}
args = sys.argv[1:]
open(log, "a").write(" ".join(args) + "\\n")
def save():
    json.dump(images, open(store, "w"))
if args[:2] == ["image", "exists"]:
    sys.exit(0 if args[2] in images else 1)
if args[:2] == ["image", "inspect"]:
    ref = args[-1].removeprefix("sha256:")
    found = ref if ref in images else next((i for i, n in images.items() if ref in n), None)
    if found is None:
        sys.exit(125)
    print(json.dumps(images[found]) if ".RepoTags" in args[3] else found)
    sys.exit(0)
if args[0] == "load":
    loaded = open({load_id!r}).read().strip()
    images.setdefault(loaded, []); save()
    print("Loaded image: sha256:" + loaded)
    sys.exit(0)
if args[0] == "tag":
    images[args[1]].append(args[2]); save()
    sys.exit(0)
sys.exit(2)
"""


class Node:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bundle = tmp / "bundle"
        archive, self.image_id = oci_archive(tmp / "src.tar", "engine")
        (self.bundle / "images").mkdir(parents=True)
        (self.bundle / "images/sglang-0.5.6.tar").write_bytes(archive.read_bytes())
        oci_archive(self.bundle / "images/other.tar", "other")
        bundle.write_manifest(self.bundle, "t", fields={
            "images/sglang-0.5.6.tar": {"variant": "910b", "cann": "8.5.0", "engine_release": "sglang-0.5.6"},
            "images/other.tar": {"variant": "a3", "cann": "8.5.0", "engine_release": "sglang-0.5.6"}})
        self.store, self.log, self.load_id = tmp / "store.json", tmp / "podman.log", tmp / "load-id"
        self.load_id.write_text(self.image_id)
        self.podman = tmp / "podman"
        self.podman.write_text(PODMAN.format(python=sys.executable, store=str(self.store), log=str(self.log),
                                             load_id=str(self.load_id)))
        self.podman.chmod(0o755)
        self.result = tmp / "result.json"
        (tmp / "play.yml").write_text(PLAYBOOK)
        (tmp / "inventory.ini").write_text(
            f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")

    def play(self, *extra: str, image: str = "sglang-0.5.6") -> subprocess.CompletedProcess:
        extra_vars = {
            "atlas_bundle_manifest_sha256": hashlib.sha256((self.bundle / "manifest.json").read_bytes()).hexdigest(),
            "atlas_bundle_dir": str(self.bundle),
            "engines_name": "sglang", "engines_version": "0.5.6",
            "serving_runtime_resolved": {"runtime": "container", "image": image, "entrypoint": ["python3"]},
            "engines_container_packages": [],  # the OS package task is the site mirror's: not on this machine
            "engines_podman": str(self.podman),
            "engines_root": str(self.tmp / "engines"),
            "atlas_stamp_dir": str(self.tmp / "stamps"),
            "result_file": str(self.result),
        }
        return run_playbook(self.tmp / "inventory.ini", self.tmp / "play.yml", "-e", json.dumps(extra_vars), *extra,
                            cwd=self.tmp, env=ansible_env(self.tmp, nocolor=True))

    def store_ids(self) -> dict:
        return json.loads(self.store.read_text()) if self.store.exists() else {}

    def podman_calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def recap(result: subprocess.CompletedProcess) -> dict[str, int]:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    match = re.search(r"localhost\s*:\s*(.*)", result.stdout.split("PLAY RECAP")[-1])
    assert match, result.stdout
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


@pytest.fixture()
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.mark.slow
def test_check_mode_then_load_then_nothing(node: Node) -> None:
    check = recap(node.play("--check"))
    assert check["changed"] >= 1 and node.store_ids() == {}
    assert not any(c.startswith("load") for c in node.podman_calls()), "check mode loads nothing"
    assert "would load image sglang-0.5.6" in node.play("--check", "-v").stdout

    first = recap(node.play())
    assert first["changed"] >= 2
    assert node.store_ids() == {node.image_id: [f"localhost/atlas-serving/sglang-0.5.6:{node.image_id[:12]}"]}
    assert sum(c.startswith("load -i") for c in node.podman_calls()) == 1
    fact = json.loads(node.result.read_text())
    assert fact["image_id"] == node.image_id and fact["engine_release"] == "sglang-0.5.6" and fact["variant"] == "910b"
    record = json.loads((node.tmp / "engines/images/sglang-0.5.6.json").read_text())
    assert record["image_id"] == node.image_id and record["cann"] == "8.5.0"
    assert (node.tmp / "stamps/image-sglang-0.5.6.json").is_file()

    second = recap(node.play())
    assert second["changed"] == 0, "a converged node changes nothing"
    assert sum(c.startswith("load -i") for c in node.podman_calls()) == 1, "loaded once"


def test_a_tampered_archive_is_refused_before_podman_sees_it(node: Node) -> None:
    path = node.bundle / "images/sglang-0.5.6.tar"
    data = bytearray(path.read_bytes())
    data[-3000] ^= 1
    path.write_bytes(bytes(data))
    run = node.play()
    assert run.returncode != 0 and "sglang-0.5.6.tar" in run.stdout and "sha256" in run.stdout
    assert not any(c.startswith("load") for c in node.podman_calls())


def test_an_image_the_manifest_does_not_list_is_named(node: Node) -> None:
    run = node.play(image="vllm")
    assert run.returncode != 0 and "vllm.tar: not listed in" in run.stdout


def test_a_load_that_gives_another_id_is_refused_naming_both(node: Node) -> None:
    node.load_id.write_text("ab" * 32)
    run = node.play()
    assert run.returncode != 0
    assert f"podman loaded {'ab' * 32}" in run.stdout and f"not image {node.image_id}" in run.stdout
    assert not (node.tmp / "engines/images/sglang-0.5.6.json").exists()


def test_a_venv_release_takes_the_wheelhouse_path_and_no_image(node: Node) -> None:
    run = node.play("-e", json.dumps({"serving_runtime_resolved": {"runtime": "venv", "image": None,
                                                                   "entrypoint": []}}))
    # this bundle has no wheelhouse: the venv path's first check refuses it; podman is never run
    assert run.returncode != 0 and "TASK [engines : Engines | verify | every wheel matches the manifest" in run.stdout
    assert "TASK [engines : Engines | image | in Podman's store" not in run.stdout
    assert node.podman_calls() == []
