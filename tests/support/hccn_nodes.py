"""Fake nodes with hccn_tool's double installed, for the NPU network tests."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from atlaslab import config, npu
from atlaslab.doubles import hccn_tool

DOUBLE = Path(hccn_tool.__file__).resolve()


class FakeNodes:
    """Nodes as the lab installs them (atlaslab.npu.install), each with an ``hccn_tool`` wrapper that points
    the double at that node's state file and the shared fabric directory."""

    def __init__(self, tmp: Path, count: int = 2, nodes: int = 2):
        self.tmp, self.fabric = tmp, tmp / "fabric"
        self.fabric.mkdir()
        self.cfg = lab_cfg(tmp, count, nodes)
        self.roots = {}
        for spec in self.cfg.nodes:
            root = tmp / spec.name
            npu.install(root, self.cfg, spec)
            npu.update_network_file(root, self.fabric)
            wrapper = root / "hccn_tool"
            wrapper.write_text(f"#!/bin/sh\nHCCN_TOOL_STATE={root / npu.HCCN_STATE_REL} "
                               f"HCCN_TOOL_FABRIC={self.fabric} exec {sys.executable} {DOUBLE} \"$@\"\n")
            wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
            self.roots[spec.name] = root

    def tool(self, node: str) -> str:
        return str(self.roots[node] / "hccn_tool")

    def run(self, node: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.tool(node), *args], capture_output=True, text=True, timeout=30)

    def runner(self, node: str):
        def run(argv):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            return proc.returncode, proc.stdout, proc.stderr
        return run

    def state(self, node: str) -> dict:
        return json.loads((self.roots[node] / npu.HCCN_STATE_REL).read_text())

    def fault(self, node: str, **changes) -> dict:
        return npu.update_network_file(self.roots[node], self.fabric, **changes)


def lab_cfg(tmp: Path, count: int = 2, nodes: int = 2) -> config.LabConfig:
    spec = {"lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24",
            "driver_version": "24.1.rc1", "firmware_version": "7.1.0.6.220",
            "nodes": [{"name": f"n{i + 1}", "npu": {"model": "910B3", "count": count, "hbm_mb": 65536}}
                      for i in range(nodes)]}
    return config.parse(spec, tmp / "lab.yml")
