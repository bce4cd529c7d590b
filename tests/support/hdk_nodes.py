"""A fake node root with Huawei's HDK installers (the doubles): build, install, run, read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atlaslab.doubles import lab_driver
from atlaslab.doubles.hdk_run import build_hdk_packages


def make_node(tmp_path: Path) -> dict:
    """A fake node: an Ascend root with driver 24.1.rc1 / firmware 7.1.0.6.220 installed (recorded in
    /etc/ascend_install.info, as the vendor's installer leaves it) and running."""
    ascend = tmp_path / "Ascend"
    for kind, version in (("driver", "24.1.rc1"), ("firmware", "7.1.0.6.220")):
        (ascend / kind).mkdir(parents=True)
        (ascend / kind / "version.info").write_text(f"Version={version}\n")
    (tmp_path / "sys/etc").mkdir(parents=True)
    (tmp_path / "sys/etc/ascend_install.info").write_text(
        f"UserName=root\nUserGroup=root\nDriver_Install_Path_Param={ascend}\nDriver_Install_For_All=yes\n")
    state = tmp_path / "npu.json"
    state.write_text(json.dumps({"driver_loaded": True, "driver_version": "24.1.rc1",
                                 "firmware_version": "7.1.0.6.220", "devices": []}))
    helper = tmp_path / "atlas-lab-driver"
    helper.write_text(f"#!/bin/sh\nexec {sys.executable} {lab_driver.__file__} \"$@\"\n")
    helper.chmod(0o755)
    env = {**os.environ, "ATLAS_HDK_SYSROOT": str(tmp_path / "sys"), "ATLAS_LAB_DRIVER": str(helper),
           "NPU_SMI_STATE": str(state), "ATLAS_LAB_ASCEND": str(ascend), "TMPDIR": str(tmp_path),
           # no npu-smi: the hot reset cannot tell who holds the NPUs, so it is not done
           "ATLAS_LAB_NPU_SMI": str(tmp_path / "no-npu-smi")}
    pkgs = build_hdk_packages(tmp_path / "hdk", "25.5.0", "7.8.0.2.212")
    return {"ascend": ascend, "state": state, "env": env, "driver": pkgs[0], "firmware": pkgs[1], "helper": helper,
            "sysroot": tmp_path / "sys"}


def raw(node: dict, pkg: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(node[pkg]), *args], env=node["env"], capture_output=True, text=True,
                          timeout=60)


def run(node: dict, pkg: str, op: str) -> subprocess.CompletedProcess:
    """What the driver role runs (roles/driver/vars/main.yml): the path and account only with --full."""
    extra = ([f"--install-path={node['ascend']}", "--install-for-all", "--install-username=root",
              "--install-usergroup=root"] if pkg == "driver" and op == "--full" else
             ["--install-for-all"] if pkg == "driver" else [])
    return raw(node, pkg, op, "--nox11", "--quiet", *extra)


def running(node: dict) -> tuple[str, str]:
    state = json.loads(node["state"].read_text())
    return state["driver_version"] if state["driver_loaded"] else "none", state["firmware_version"]


def installed(node: dict, kind: str) -> str:
    return (node["ascend"] / kind / "version.info").read_text().splitlines()[0].split("=", 1)[1]


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="Huawei's HDK installers run as root")


def bare(node: dict) -> None:
    """Nothing installed, nothing recorded, no driver loaded: a new server."""
    for kind in ("driver", "firmware"):
        (node["ascend"] / kind / "version.info").unlink()
    (node["sysroot"] / "etc/ascend_install.info").unlink()
    node["state"].write_text(json.dumps({"driver_loaded": False, "driver_version": "",
                                         "firmware_version": "7.1.0.6.220"}))
