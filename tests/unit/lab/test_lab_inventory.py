"""Generated inventory/lab/hosts.yml: structure, strict host keys, no passwords, safe removal."""

from __future__ import annotations

from pathlib import Path

import yaml

from atlaslab import config, inventory

GOOD = {
    "lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24",
    "driver_version": "24.1.rc1", "firmware_version": "7.1.0.6.220",
    "nodes": [
        {"name": "n1", "groups": ["east", "canary"], "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536}},
        {"name": "n2", "groups": ["east"], "npu": {"model": "910B4", "count": 4, "hbm_mb": 32768}},
        {"name": "n3", "npu": {"model": "910B4", "count": 4, "hbm_mb": 32768}},
    ],
}
KEY = Path("/var/lib/atlas-lab/ssh/id_ed25519")
KNOWN = Path("/var/lib/atlas-lab/ssh/known_hosts")


def rendered(tmp_path: Path) -> dict:
    cfg = config.parse(GOOD, tmp_path / "lab.yml")
    return yaml.safe_load(inventory.render(cfg, KEY, KNOWN))


def test_every_node_in_atlas_nodes_with_connection_vars(tmp_path: Path) -> None:
    hosts = rendered(tmp_path)["all"]["children"]["atlas_nodes"]["hosts"]
    assert list(hosts) == ["n1", "n2", "n3"]
    n2 = hosts["n2"]
    assert n2["ansible_host"] == "10.77.0.12"
    assert n2["ansible_user"] == "root"
    assert n2["ansible_ssh_private_key_file"] == str(KEY)
    assert n2["ansible_ssh_common_args"] == f"-o UserKnownHostsFile={KNOWN} -o StrictHostKeyChecking=yes"
    assert n2["atlas_hardware"] == {"npu_model": "910B4", "npu_count": 4, "hbm_mb": 32768}


def test_lab_groups_become_inventory_groups(tmp_path: Path) -> None:
    children = rendered(tmp_path)["all"]["children"]
    assert set(children) == {"atlas_nodes", "east", "canary"}
    assert list(children["east"]["hosts"]) == ["n1", "n2"]
    assert list(children["canary"]["hosts"]) == ["n1"]


def test_no_password_anywhere(tmp_path: Path) -> None:
    text = inventory.render(config.parse(GOOD, tmp_path / "lab.yml"), KEY, KNOWN)
    assert "pass" not in text.lower()
    assert "StrictHostKeyChecking=no" not in text


def test_write_then_remove_only_generated_files(tmp_path: Path) -> None:
    cfg = config.parse(GOOD, tmp_path / "lab.yml")
    target = inventory.write(cfg, KEY, KNOWN)
    assert target == tmp_path / "hosts.yml" and target.is_file()
    assert inventory.remove(target) and not target.exists()
    target.write_text("all:\n  hosts: {}\n")  # hand-written: not ours, keep it
    assert not inventory.remove(target) and target.exists()
    assert not inventory.remove(tmp_path / "absent.yml")
