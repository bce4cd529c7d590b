"""Lab API and CLI error paths that need no root: commands that reach nodes refuse when the lab is down."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from atlasctl import exitcodes
from atlasctl.errors import EnvironmentProblem
from atlaslab import api, cli, node, paths, ssh


@pytest.fixture(autouse=True)
def empty_lab_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATLAS_LAB_DIR", str(tmp_path / "lab"))
    return tmp_path / "lab"


def test_lab_is_not_up_without_recorded_state() -> None:
    assert api.lab_is_up() is False
    with pytest.raises(EnvironmentProblem, match="not up") as err:
        api.require_lab_up()
    assert "atlas-lab up" in (err.value.fix or "")


@pytest.mark.parametrize(
    "argv",
    [["ssh", "atlas-n1", "true"], ["status"], ["npu", "atlas-n1", "--health", "Alarm"],
     ["npu", "atlas-n1", "--device", "3", "--link", "down"], ["npu", "atlas-n1", "--unreachable", "10.20.0.25"]],
)
def test_cli_refuses_to_reach_nodes_of_a_lab_that_is_down(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert cli.main(argv) == exitcodes.ENVIRONMENT
    assert "the lab is not up" in capsys.readouterr().err


def test_cli_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit) as err:
        cli.main(["power", "atlas-n1", "reboot"])
    assert err.value.code == exitcodes.USAGE
    with pytest.raises(SystemExit):
        cli.main(["npu", "atlas-n1", "--health", "Fine"])
    with pytest.raises(SystemExit):
        cli.main(["npu", "atlas-n1", "--link", "sideways"])
    with pytest.raises(SystemExit):
        cli.main(["npu", "atlas-n1", "--net-health", "Init"])


def test_ssh_argv_pins_key_and_known_hosts() -> None:
    spec = api.load_config().nodes[0]
    argv = ssh.ssh_argv(spec, ["npu-smi", "info"])
    text = " ".join(argv)
    assert f"-i {paths.private_key()}" in text
    assert f"UserKnownHostsFile={paths.known_hosts()}" in text
    assert "StrictHostKeyChecking=yes" in text and "BatchMode=yes" in text
    assert argv[-4:] == [f"root@{spec.ip}", "--", "npu-smi", "info"]


def test_nspawn_argv_follows_the_measured_recipe() -> None:
    spec = api.load_config().nodes[0]
    argv = node.nspawn_argv(spec)
    for flag in ("--register=no", "--keep-unit", "--console=passive", "--link-journal=no", "-b",
                 "--capability=CAP_NET_ADMIN", "--resolv-conf=off", f"--network-namespace-path=/run/netns/{spec.netns}",
                 f"--bind-ro={paths.bundle_dir()}:/srv/atlas-bundle",
                 f"--bind={paths.fabric_dir()}:/srv/atlas-npu-fabric"):
        assert flag in argv


def test_stale_pid_files_are_not_running(empty_lab_dir: Path) -> None:
    ndir = paths.node_dir("atlas-n1")
    ndir.mkdir(parents=True)
    (ndir / "supervisor.pid").write_text("1\n")  # pid 1 is alive but is not our supervisor
    assert node.is_running("atlas-n1") is False
    (ndir / "supervisor.pid").write_text("999999999\n")
    assert node.is_running("atlas-n1") is False


def test_boot_failure_names_the_node_and_shows_its_console() -> None:
    ndir = paths.node_dir("atlas-n2")
    ndir.mkdir(parents=True)
    (ndir / node.CONSOLE_LOG).write_text("".join(f"line {i}\n" for i in range(50)) + "sshd: fatal: no host key\n")
    err = api._boot_failure(["atlas-n2"], 120)
    text = err.render()
    assert "atlas-n2" in text and "within 120s" in text
    assert "sshd: fatal: no host key" in text and "line 10\n" not in text
    assert "atlas-lab down" in text


def test_down_moves_the_nodes_roots_aside_and_deletes_them_in_the_background(tmp_path: Path) -> None:
    tree = tmp_path / "nodes"
    (tree / "atlas-n1" / "upper" / "opt").mkdir(parents=True)
    (tree / "atlas-n1" / "upper" / "opt" / "f").write_text("x")
    api._discard(tree)
    assert not tree.exists()  # gone at once: the next lab can be built beside the deletion
    deadline = time.monotonic() + 30
    while any(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(tmp_path.iterdir()), "the background deletion left files behind"
