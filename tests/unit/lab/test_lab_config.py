"""lab.yml parsing: the address plan and validation errors that name the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from atlasctl.errors import UsageError
from atlaslab import config, paths

REPO_LAB_YML = paths.repo_root() / "inventory" / "lab" / "lab.yml"
GOOD = {
    "lab_name": "atlas",
    "bridge": "atlasbr0",
    "subnet": "10.77.0.0/24",
    "driver_version": "24.1.rc1",
    "firmware_version": "7.1.0.6.220",
    "nodes": [
        {"name": "n1", "groups": ["east", "canary"], "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536}},
        {"name": "n2", "groups": ["east"], "npu": {"model": "910B4", "count": 4, "hbm_mb": 32768}},
        {"name": "n3", "npu": {"model": "910B4", "count": 4, "hbm_mb": 32768}},
    ],
}
PATH = Path("/x/lab.yml")


def parse(data: dict) -> config.LabConfig:
    return config.parse(data, PATH)


def mutated(where: list, value: object) -> dict:
    data = copy.deepcopy(GOOD)
    target = data
    for key in where[:-1]:
        target = target[key]
    if value is KeyError:
        del target[where[-1]]
    else:
        target[where[-1]] = value
    return data


def test_address_plan_controller_dot1_nodes_from_dot11_in_order() -> None:
    cfg = parse(GOOD)
    assert cfg.controller_ip == "10.77.0.1"
    assert [n.ip for n in cfg.nodes] == ["10.77.0.11", "10.77.0.12", "10.77.0.13"]
    assert [n.netns for n in cfg.nodes] == ["atlas-n1", "atlas-n2", "atlas-n3"]
    assert len({n.veth_host for n in cfg.nodes}) == 3
    assert all(len(n.veth_host) <= 15 for n in cfg.nodes)


def test_groups_collect_members_in_order() -> None:
    assert parse(GOOD).groups == {"east": ["n1", "n2"], "canary": ["n1"]}


def test_inventory_path_is_next_to_lab_yml() -> None:
    assert parse(GOOD).inventory_path == Path("/x/hosts.yml")


def test_repository_lab_yml_is_valid() -> None:
    cfg = config.load(REPO_LAB_YML)
    assert len(cfg.nodes) >= 2
    assert cfg.subnet == "10.77.0.0/24" and cfg.bridge == "atlasbr0"


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        (["nodes", 1, "npu", "count"], 0, "nodes[1].npu.count"),
        (["nodes", 1, "npu", "count"], "8", "nodes[1].npu.count"),
        (["nodes", 0, "npu", "model"], "H100", "nodes[0].npu.model"),
        (["nodes", 2, "npu", "hbm_mb"], KeyError, "nodes[2].npu.hbm_mb"),
        (["nodes", 2, "name"], "Bad_Name", "nodes[2].name"),
        (["nodes", 0, "groups"], "east", "nodes[0].groups"),
        (["nodes", 0, "groups"], ["atlas_nodes"], "nodes[0].groups"),
        (["subnet"], "8.8.8.0/24", "subnet"),
        (["subnet"], "10.77.0.1/24", "subnet"),
        (["bridge"], "a-very-long-bridge-name", "bridge"),
        (["driver_version"], KeyError, "driver_version"),
        (["nodes"], [], "nodes"),
    ],
)
def test_validation_errors_name_the_field(where: list, value: object, field: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(mutated(where, value))
    assert f": {field}:" in str(err.value)
    assert str(PATH) in str(err.value)
    assert err.value.fix


def test_duplicate_node_names_are_rejected() -> None:
    data = mutated(["nodes", 1, "name"], "n1")
    with pytest.raises(UsageError, match=r"nodes\[1\]\.name: duplicate"):
        parse(data)


def test_subnet_too_small_for_the_nodes() -> None:
    with pytest.raises(UsageError, match="no address left"):
        parse(mutated(["subnet"], "10.77.0.0/29"))


def test_unknown_node_names_the_choices() -> None:
    with pytest.raises(UsageError) as err:
        parse(GOOD).node("n9")
    assert "n1, n2, n3" in (err.value.fix or "")


def test_load_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        config.load(tmp_path / "absent.yml")
    broken = tmp_path / "lab.yml"
    broken.write_text("nodes: [\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        config.load(broken)
    broken.write_text(yaml.safe_dump(GOOD))
    assert config.load(broken).path == broken.resolve()


def test_resolve_config_relative_to_repo_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert paths.resolve_config(None) == REPO_LAB_YML.resolve()
    (tmp_path / "mine.yml").write_text("x")
    assert paths.resolve_config("mine.yml") == (tmp_path / "mine.yml").resolve()


def test_hdk_override_replaces_the_versions_new_nodes_start_on() -> None:
    cfg = config.load(paths.repo_root() / "inventory/lab/lab.yml")
    assert config.with_hdk(cfg, None) is cfg
    started = config.with_hdk(cfg, "25.5.0/7.8.0.2.212")
    assert (started.driver_version, started.firmware_version) == ("25.5.0", "7.8.0.2.212")
    assert started.nodes == cfg.nodes and cfg.driver_version == "24.1.rc1"


@pytest.mark.parametrize("hdk", ["25.5.0", "/7.8.0", "25.5.0/", "25.5.0/7 8", "../x/7.8.0"])
def test_hdk_override_that_is_not_driver_slash_firmware_is_refused(hdk: str) -> None:
    cfg = config.load(paths.repo_root() / "inventory/lab/lab.yml")
    with pytest.raises(UsageError, match="DRIVER/FIRMWARE") as err:
        config.with_hdk(cfg, hdk)
    assert "--hdk 25.5.0/7.8.0.2.212" in err.value.fix
