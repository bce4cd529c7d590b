"""A fake Atlas node root for the driver role: the HDK installers (the doubles), their bundle, and the node state."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from atlaslab import config, npu
from atlaslab.doubles.hdk_run import build_hdk_packages
from support.ansible_run import ansible_env

DRIVER, FIRMWARE = "25.5.0", "7.8.0.2.212"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
LAB = {
    "lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24",
    "driver_version": "24.1.rc1", "firmware_version": "7.1.0.6.220",
    "nodes": [{"name": "n1", "npu": {"model": "910B4", "count": 4, "hbm_mb": 32768}}],
}
PLAYBOOK = """
- name: driver role test
  hosts: localhost
  gather_facts: false
  roles:
    - role: driver
"""


def make_bundle(root: Path, driver: str, firmware: str) -> Path:
    files = []
    for path in build_hdk_packages(root / "hdk", driver, firmware):
        data = path.read_bytes()
        files.append({"path": path.relative_to(root).as_posix(), "size": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(), "md5": hashlib.md5(data).hexdigest()})
    (root / "manifest.json").write_text(json.dumps({"format": 1, "name": "test", "files": files}))
    return root


class FakeNode:
    def __init__(self, tmp: Path, bundle: Path, *, installed: bool = True):
        self.tmp, self.bundle, self.root = tmp, bundle, tmp / "node"
        cfg = config.parse(LAB, tmp / "lab.yml")
        npu.install(self.root, cfg, cfg.nodes[0])
        self.sysroot = tmp / "sysroot"
        if installed:
            # what the installation being upgraded recorded (the driver installer reads its path and account here)
            (self.sysroot / "etc").mkdir(parents=True)
            (self.sysroot / "etc/ascend_install.info").write_text(
                f"UserName=root\nUserGroup=root\nDriver_Install_Type=full\n"
                f"Driver_Install_Path_Param={self.root / 'usr/local/Ascend'}\nDriver_Install_For_All=yes\n")
        else:
            for kind in ("driver", "firmware"):
                (self.root / f"usr/local/Ascend/{kind}/version.info").unlink()
            state = json.loads((self.root / npu.STATE_REL).read_text())
            (self.root / npu.STATE_REL).write_text(json.dumps(state | {"driver_loaded": False}))
        (tmp / "play.yml").write_text(PLAYBOOK)
        (tmp / "inventory.ini").write_text(
            f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
        self.env = ansible_env(tmp, path=self.root / "usr/local/bin", NPU_SMI_STATE=str(self.root / npu.STATE_REL),
                               ATLAS_LAB_ASCEND=str(self.root / "usr/local/Ascend"),
                               ATLAS_LAB_DRIVER=str(self.root / npu.LAB_DRIVER_REL),
                               ATLAS_HDK_SYSROOT=str(self.sysroot))

    def play(self, *extra: str, path: Path | None = None, **overrides) -> subprocess.CompletedProcess:
        extra_vars = {"driver_version": DRIVER, "driver_firmware_version": FIRMWARE,
                      "driver_bundle_dir": str(self.bundle), "driver_install_path": str(self.root / "usr/local/Ascend"),
                      "driver_work_dir": str(self.tmp / "work"),
                      "driver_user": "root", "driver_group": "root", "driver_manage_user": False,
                      "driver_allow_reboot": False} | overrides
        extra_vars = {key: value for key, value in extra_vars.items() if value is not None}  # None: the default
        # what preflight's signature check (roles/bundle_trust) sets: the verified manifest's sha256
        manifest = Path(extra_vars["driver_bundle_dir"]) / "manifest.json"
        extra_vars.setdefault("atlas_bundle_manifest_sha256", hashlib.sha256(manifest.read_bytes()).hexdigest())
        cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(self.tmp / "inventory.ini"), str(self.tmp / "play.yml"),
               "-e", json.dumps(extra_vars), *extra]
        env = self.env | ({"PATH": f"{path}:{self.env['PATH']}"} if path else {})
        return subprocess.run(cmd, cwd=self.tmp, env=env, capture_output=True, text=True, timeout=300)

    def boot(self) -> None:
        """What the node's atlas-lab-npu-boot unit does at boot: run what is installed."""
        subprocess.run([str(self.root / npu.LAB_DRIVER_REL), "load"], env=self.env, check=True)

    def installed(self, kind: str) -> str:
        return (self.root / f"usr/local/Ascend/{kind}/version.info").read_text().splitlines()[0].split("=", 1)[1]

    def running(self) -> tuple[str, str]:
        state = json.loads((self.root / npu.STATE_REL).read_text())
        return state["driver_version"], state["firmware_version"]

    def installer_log(self) -> str:
        """Huawei's installers' log, the driver's and the firmware's lines alike."""
        log = self.sysroot / "var/log/ascend_seclog/ascend_install.log"
        return log.read_text() if log.exists() else ""

    def installer_params(self, kind: str) -> list[str]:
        """The arguments each run of the ``kind`` installer was given, from the log (InputParams)."""
        tag = f"[{kind.capitalize()}] "
        return [line.split("InputParams: ", 1)[1] for line in self.installer_log().splitlines()
                if line.startswith(tag) and "InputParams: " in line]

    def hook(self, rel: Path, text: str = "") -> None:
        """A lab hook of the installer doubles (atlaslab.doubles.hdk_run), on this node."""
        (self.sysroot / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.sysroot / rel).write_text(text)

    def loaded(self) -> bool:
        return json.loads((self.root / npu.STATE_REL).read_text()).get("driver_loaded", True)
