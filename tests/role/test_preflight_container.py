"""Preflight for a container release, on localhost and read-only: the image the release names is in the verified
manifest; what its podman run mounts exists on the node; the image's variant fits the node's chip (npu-smi: 910B3
-> 910b, Ascend910 (Atlas A3) -> a3) and its release the profile's; the engine runs on the image's CANN and the
image's CANN fits the driver (the compatibility table, the same check as a venv release's). Each refusal names
the image, the node, the values and the fix. The compatibility gate judges a container host by its image, not by
its cann_version. npu-smi is a stand-in printing a table of the named chips."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl import bundle
from support.ansible_run import ansible_env, run_playbook
from support.image_archives import oci_archive

pytestmark = pytest.mark.role

PLAYBOOK = """
- name: preflight container test
  hosts: localhost
  gather_facts: false
  tasks:
    - name: NPU facts from the stand-in npu-smi
      atlas.serving.npu_facts:
        npu_smi_path: "{{ fake_npu_smi }}"
    - name: profile
      ansible.builtin.include_role: {name: preflight, tasks_from: profile.yml}
    - name: gate
      ansible.builtin.include_role: {name: preflight, tasks_from: compat.yml}
    - name: container
      ansible.builtin.include_role: {name: preflight, tasks_from: container.yml}
      when: serving_runtime_resolved.runtime == 'container'
"""
ROW = """| {i}     {name:<20}| OK            | 90.0        40                0    / 0             |
| 0                         | 0000:C{i}:00.0  | 0           0    / 0          3318 / 65536         |
+===========================+===============+====================================================+
"""
NPU_SMI = """#!/bin/sh
if [ "$2" = "-t" ]; then printf 'NPU ID : 0\\nProduct Name : stand-in\\n'; exit 0; fi
cat <<'EOF'
+------------------------------------------------------------------------------------------------+
| npu-smi 25.5.0                   Version: 25.5.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
{rows}EOF
"""
PATHS = ["/usr/local/Ascend/driver", "/usr/local/bin/npu-smi", "/usr/local/dcmi", "/etc/ascend_install.info",
         "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]


class Node:
    def __init__(self, tmp: Path, chip: str = "910B3", **image):
        self.tmp = tmp
        self.bundle = tmp / "bundle"
        (self.bundle / "images").mkdir(parents=True)
        oci_archive(self.bundle / "images/sglang.tar", "s")
        fields = {"variant": "910b", "cann": "8.5.0", "engine_release": "sglang-0.5.6"} | image
        bundle.write_manifest(self.bundle, "t", fields={"images/sglang.tar": fields})
        self.npu_smi = tmp / "npu-smi"
        self.npu_smi.write_text(NPU_SMI.format(rows="".join(ROW.format(i=i, name=chip) for i in range(8))))
        self.npu_smi.chmod(0o755)
        (tmp / "play.yml").write_text(PLAYBOOK)
        (tmp / "inventory.ini").write_text(
            f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")

    def play(self, **change) -> subprocess.CompletedProcess:
        extra = {
            "fake_npu_smi": str(self.npu_smi), "atlas_bundle_dir": str(self.bundle),
            "atlas_bundle_manifest_sha256": hashlib.sha256((self.bundle / "manifest.json").read_bytes()).hexdigest(),
            "serving_profile": "sglang-0.5.6-mistral-7b-8x64g", "engines_name": "sglang", "engines_version": "0.5.6",
            "serving_runtime": "container", "serving_image": "sglang",
            "serving_image_entrypoint": ["python3"], "driver_version": "25.5.0",
            "atlas_hardware": {"npu_model": "910B3", "npu_count": 8, "hbm_mb": 65536},
            "__preflight_node": {"exist": dict.fromkeys(PATHS, True)},
        } | change
        run = run_playbook(self.tmp / "inventory.ini", self.tmp / "play.yml", "-e", json.dumps(extra), cwd=self.tmp,
                           env=ansible_env(self.tmp, nocolor=True))
        run.stdout = " ".join(run.stdout.split())
        return run


def test_an_image_that_fits_passes(tmp_path):
    run = Node(tmp_path).play()
    assert run.returncode == 0, run.stdout[-3000:]
    assert "image sglang (CANN 8.5.0) fits driver 25.5.0" in run.stdout


@pytest.mark.parametrize("chip, image, change, says", [
    ("910B3", {"variant": "a3"}, {},
     "image sglang is built for a3 (its CANN kernels), but localhost's NPUs are 910B3, which need an image of "
     "variant 910b"),
    ("Ascend910", {}, {"atlas_hardware": {"npu_model": "Ascend910", "npu_count": 8, "hbm_mb": 65536}},
     "image sglang is built for 910b (its CANN kernels), but localhost's NPUs are Ascend910, which need an image "
     "of variant a3"),
    ("910B3", {"engine_release": "vllm-ascend-0.11.0"}, {},
     "image sglang runs vllm-ascend-0.11.0, but localhost's serving profile is for sglang-0.5.6"),
    ("910B3", {"cann": "8.3.RC2"}, {},
     "image sglang carries CANN 8.3.RC2: sglang 0.5.6 needs CANN 8.5.0"),
    ("910B3", {}, {"driver_version": "24.1.0"},
     "image sglang carries CANN 8.5.0, and driver 24.1.0 is outside the drivers CANN 8.5.0 runs on (25.0.X to "
     "25.5.X, released with 25.5.0"),
    ("910B3", {}, {"__preflight_node": {"exist": dict(dict.fromkeys(PATHS, True), **{"/usr/local/dcmi": False})}},
     "a container release of image sglang mounts or passes /usr/local/dcmi, which this node does not have"),
    ("910B3", {}, {"serving_image": "vllm"}, "lists no image 'vllm' (images/vllm.tar); the bundle's images: sglang"),
])
def test_a_mismatch_is_refused_before_anything_changes(tmp_path, chip, image, change, says):
    run = Node(tmp_path, chip, **image).play(**change)
    assert run.returncode != 0 and says in run.stdout, run.stdout[-3000:]


def test_the_driver_refusal_can_be_lowered_to_a_warning(tmp_path):
    run = Node(tmp_path).play(driver_version="24.1.0", preflight_image_driver_policy="warn")
    assert run.returncode == 0 and "WARNING image sglang: driver 24.1.0 is outside the drivers CANN 8.5.0" in run.stdout


def test_the_gate_judges_a_container_host_by_its_image_not_its_cann_version(tmp_path):
    node = Node(tmp_path)
    venv = node.play(serving_runtime="venv", cann_version="8.3.RC2")
    assert venv.returncode != 0 and "Impossible release plan" in venv.stdout
    container = node.play(cann_version="8.3.RC2")
    assert container.returncode == 0, container.stdout[-3000:]
