"""Nothing but the rollout takes a serving node down: preflight (roles/preflight, tasks_from outage) refuses a run
that would change a serving node (its driver, firmware, CANN, or the release its engine runs), naming each node
and the rollout command; the driver role refuses before any installer; a drained node, a stopped engine or a bare
node passes; atlas_allow_outage accepts it, loudly. On localhost against the fake node of test_driver_role, with a
`systemctl` stand-in saying whether the engine is active and this host as its own branch gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.driver_nodes import FakeNode
from support.playbooks import ok, recap

PREFLIGHT_PLAY = """
- name: outage guard test
  hosts: all
  gather_facts: false
  tasks:
    - name: the guard
      ansible.builtin.include_role:
        name: preflight
        tasks_from: outage
"""
DRIVER_PLAY = """
- name: driver role test
  hosts: all
  gather_facts: false
  roles:
    - role: driver
"""

pytestmark = [pytest.mark.role, pytest.mark.skipif(os.geteuid() != 0, reason="the fake node's installers run as root")]


class Node(FakeNode):
    """The fake node in branch `east`, this host its own gateway, its engine active or not, its record r1."""

    def __init__(self, tmp: Path, bundle: Path, *, active: bool, drained: bool | None = None):  # noqa: F811
        super().__init__(tmp, bundle)
        host = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
        gateway = "\n[gateway]\nlocalhost gateway_branch=east\n" if drained is not None else ""
        (tmp / "inventory.ini").write_text(f"[branch_east]\nlocalhost {host}\n[atlas_nodes:children]\nbranch_east\n"
                                           f"{gateway}")
        if drained is not None:
            backends = tmp / "backends/east"
            backends.mkdir(parents=True)
            (backends / "localhost.conf").write_text(
                f"server 127.0.0.1:8000 max_fails=1 fail_timeout=10s{' down' if drained else ''};\n")
        self.bindir = tmp / "bin"
        self.bindir.mkdir()
        systemctl = self.bindir / "systemctl"
        systemctl.write_text(f"#!/bin/sh\necho {'active' if active else 'inactive'}\n")
        systemctl.chmod(0o755)
        config = tmp / "serving"
        config.mkdir()
        (config / "atlas-serving.json").write_text(json.dumps({"release_id": "r1", "port": 8000}))
        self.common = {"serving_config_dir": str(config), "gateway_backend_dir": str(tmp / "backends")}

    def run(self, play: str, **overrides) -> subprocess.CompletedProcess:
        (self.tmp / "play.yml").write_text(play)
        return self.play(path=self.bindir, **(self.common | overrides))


def test_a_converged_serving_node_passes_and_reads_nothing_more(tmp_path: Path, bundle: Path) -> None:  # noqa: F811
    node = Node(tmp_path, bundle, active=True, drained=False)
    run = node.run(PREFLIGHT_PLAY, atlas_release_id="r1", driver_version="24.1.rc1",
                   driver_firmware_version="7.1.0.6.220")
    assert ok(run)["changed"] == 0
    assert "Gateway | state | read the branch's backends" not in run.stdout


def test_a_run_that_would_restart_a_serving_engine_is_refused_at_preflight(tmp_path: Path, bundle: Path) -> None:  # noqa: F811
    node = Node(tmp_path, bundle, active=True, drained=False)
    run = node.run(PREFLIGHT_PLAY, atlas_release_id="r2", driver_version="", driver_firmware_version="")
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and "Refused: this run would take serving nodes down." in out
    assert "localhost would switch its engine from release r1 to r2 (a restart)" in out
    assert f"atlasctl rollout -i {tmp_path / 'inventory.ini'} --release r2" in out and "atlasctl drain" in out
    allowed = node.run(PREFLIGHT_PLAY, atlas_release_id="r2", driver_version="", driver_firmware_version="",
                       atlas_allow_outage=True)
    assert allowed.returncode == 0 and "!!! localhost SERVES and this run will switch its engine" in allowed.stdout


def test_a_drained_node_or_a_stopped_engine_passes(tmp_path: Path, bundle: Path) -> None:  # noqa: F811
    drained = Node(tmp_path / "a", bundle, active=True, drained=True)
    assert ok(drained.run(PREFLIGHT_PLAY, atlas_release_id="r2"))["failed"] == 0
    stopped = Node(tmp_path / "b", bundle, active=False, drained=False)
    assert ok(stopped.run(PREFLIGHT_PLAY, atlas_release_id="r2"))["failed"] == 0


def test_the_driver_role_never_changes_a_serving_node(tmp_path: Path, bundle: Path) -> None:  # noqa: F811
    """No gateway in the inventory: an active engine is taken as serving."""
    node = Node(tmp_path, bundle, active=True)
    run = node.run(DRIVER_PLAY)
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and recap(run)["changed"] == 0
    assert ("localhost serves (no gateway in the inventory, atlas-serving active), and this run would upgrade "
            "firmware 7.8.0.2.212, upgrade driver 25.5.0: refused, nothing was changed") in out
    assert (node.installed("driver"), node.installed("firmware")) == ("24.1.rc1", "7.1.0.6.220")


def test_a_node_that_serves_nothing_is_rebooted_by_the_driver_stage(tmp_path: Path, bundle: Path) -> None:  # noqa: F811
    """A bare node (its engine not running): the driver runs at once (hot reset), the firmware needs the reboot,
    which the stage does itself by default (ansible.builtin.reboot refuses a local connection: its refusal shows
    it was tried)."""
    node = Node(tmp_path, bundle, active=False)
    run = node.run(DRIVER_PLAY, driver_allow_reboot=None)  # the role's default
    out = " ".join(run.stdout.split())
    assert "installed but not running until the node reboots" not in out  # not refused for want of permission
    assert "with local connection would reboot the control node" in out  # it was tried (not here)
    assert node.running()[0] == "25.5.0"
