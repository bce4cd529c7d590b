"""The rollout's check before a unit is drained (playbooks/rollout/tasks/platform_check.yml), on localhost against a
fake node (the driver and firmware the lab's NPU layer reports): what the release moves there, and the refusals
that leave the node untouched: a driver the release's CANN does not run on, a point of no return not accepted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.driver_nodes import DRIVER, FIRMWARE, FakeNode

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = f"""
- name: rollout platform check test
  hosts: localhost
  gather_facts: false
  vars:
    rollout_compat_extra_tables: []
  roles:
    - role: layout
  tasks:
    - name: the check
      ansible.builtin.include_tasks: {REPO}/playbooks/rollout/tasks/platform_check.yml
    - name: what it found
      ansible.builtin.copy:
        content: "{{{{ rollout_platform | to_json }}}}"
        dest: "{{{{ result_file }}}}"
        mode: "0600"
"""

pytestmark = [pytest.mark.role, pytest.mark.skipif(os.geteuid() != 0, reason="the fake node's installers run as root")]


@pytest.fixture()
def node(tmp_path: Path, bundle: Path) -> FakeNode:  # noqa: F811
    fake = FakeNode(tmp_path, bundle)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    return fake


def check(node: FakeNode, **change) -> tuple[object, dict | None]:
    result = node.tmp / "result.json"
    result.unlink(missing_ok=True)
    run = node.play(**({"result_file": str(result), "atlas_release_id": "r2", "cann_version": "8.5.0",
                        "rollout_previous_record": {"release_id": "r1", "cann": "8.5.0", "runtime": "venv"}}
                       | change))
    return run, (json.loads(result.read_text()) if result.exists() else None)


def test_a_release_that_moves_the_platform_is_named_and_may_go_ahead(node: FakeNode) -> None:
    # driver 24.1.rc1 -> 25.5.0: CANN 8.5.0 runs on 25.0.X to 25.5.X, before and after
    run, found = check(node, rollout_previous_record={"release_id": "r1", "cann": "8.5.0", "runtime": "venv"})
    assert run.returncode == 0, run.stdout[-3000:]
    assert found["hdk"] == ["firmware", "driver"] and found["stop"] and found["moves"]
    assert found["cann"] and found["driver_after"] == DRIVER
    assert node.installed("driver") == "24.1.rc1", "the check changes nothing"


def test_nothing_moves_on_a_node_at_the_release_levels(node: FakeNode) -> None:
    run, found = check(node, driver_version="24.1.rc1", driver_firmware_version="7.1.0.6.220",
                       serving_runtime="container")
    assert run.returncode == 0, run.stdout[-3000:]
    assert found == {"hdk": [], "cann": False, "cann_removes": [], "stop": False, "moves": False,
                     "driver_after": "24.1.rc1"}


def test_a_driver_the_release_cann_does_not_run_on_is_refused(node: FakeNode) -> None:
    run, _ = check(node, cann_version="9.1.0", driver_version="25.5.0",
                   rollout_previous_record={"release_id": "r1", "cann": "9.1.0"})
    assert run.returncode == 0  # 25.5.0 is in 9.1.0's window (25.2.X to 26.1.0)
    run, found = check(node, cann_version="8.5.0", driver_version="26.0.RC1")
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and found is None
    assert "driver 26.0.RC1 is outside the drivers CANN 8.5.0 runs on (25.0.X to 25.5.X" in out
    assert "Nothing was touched" in out and node.installed("driver") == "24.1.rc1"


def test_a_point_of_no_return_needs_acceptance(node: FakeNode) -> None:
    """The previous release runs CANN 8.3.RC2, for which no source gives a driver window: once the driver moves, a
    rollback may not run."""
    previous = {"release_id": "r1", "cann": "8.3.RC2", "runtime": "venv"}
    run, _ = check(node, rollout_previous_record=previous)
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and "point of no return not accepted" in out
    assert "no source in the compatibility table says driver 25.5.0 runs CANN 8.3.RC2" in out
    assert "--accept-no-rollback" in out and node.installed("driver") == "24.1.rc1"
    run, found = check(node, rollout_previous_record=previous, rollout_accept_no_rollback=True)
    assert run.returncode == 0 and found["stop"]
    assert (node.installed("driver"), node.installed("firmware")) == ("24.1.rc1", "7.1.0.6.220")
    assert FIRMWARE != "7.1.0.6.220"
