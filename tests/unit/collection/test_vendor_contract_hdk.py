"""The lab's HDK installer doubles against Huawei's: the records they write and the lines they print have the keys,
the order and the shapes of the real-format samples in tests/fixtures/vendor/hdk (SOURCES.md names each source),
and their exit statuses follow the vendor's rules (hicann/driver install.sh @ ef377e95): a first install exits 2,
an upgrade whose hot reset works 0, --upgrade to an older driver is performed, refused option combinations exit 1
with ERR_NO:0x0004, another account than the last installation's 0x0095, not root 0x0093, the firmware before any
driver is refused. The suite's parser of the error lines (module_utils/hdk.py) reads both alike."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import hdk

from support.hdk_nodes import bare, installed, make_node, raw, root_only, run, running

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "hdk"
# [Driver] [2023-07-10 22:24:33] [INFO]<message>
LINE = re.compile(r"^\[(Driver|Firmware)\] \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \[(INFO|WARNING|ERROR)\](.*)$")
KEY_VALUE = re.compile(r"^([A-Za-z_]+)=(.*)$")
ERROR_LINE = re.compile(r"^ERR_NO:0x[0-9A-F]{4};ERR_DES:")

pytestmark = root_only


@pytest.fixture(name="node")
def a_node(tmp_path: Path) -> dict:
    """A fake node with driver 24.1.rc1 and firmware 7.1.0.6.220 installed and running (support.hdk_nodes)."""
    return make_node(tmp_path)


def keys(text: str) -> list[str]:
    """The keys of a ``Key=Value`` record, in order; every line must be one."""
    lines = [line for line in text.splitlines() if line]
    assert all(KEY_VALUE.match(line) for line in lines), lines
    return [KEY_VALUE.match(line).group(1) for line in lines]


def values(text: str) -> dict[str, str]:
    return dict(KEY_VALUE.match(line).groups() for line in text.splitlines() if line)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def messages(output: str) -> list[tuple[str, str, str]]:
    """(tag, level, message) of each line; every line must have the vendor's shape."""
    lines = output.splitlines()
    assert lines and all(LINE.match(line) for line in lines), output
    return [LINE.match(line).groups() for line in lines]


def with_npu_smi(node: dict, tmp_path: Path, table: str = "| No running processes found in NPU 0 |\n") -> None:
    """npu-smi answers with ``table`` as its process table (the hot reset asks it who holds the NPUs)."""
    smi = tmp_path / "npu-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{table}EOF\n")
    smi.chmod(0o755)
    node["env"]["ATLAS_LAB_NPU_SMI"] = str(smi)


# --- the records ------------------------------------------------------------------------------------------------


def test_the_fixtures_agree_on_the_driver_record() -> None:
    assert keys(fixture("driver_version.info.24.1.rc2.2")) == keys(fixture("driver_version.info.25.3.rc1"))
    for name in ("driver_version.info.24.1.rc2.2", "driver_version.info.25.3.rc1"):
        record = values(fixture(name))
        assert record["Version"] == record["package_version"]


def test_the_driver_record_has_the_vendors_keys_in_order(node: dict) -> None:
    assert run(node, "driver", "--upgrade").returncode in (0, 2)
    text = (node["ascend"] / "driver/version.info").read_text()
    assert keys(text) == keys(fixture("driver_version.info.25.3.rc1"))
    record = values(text)
    assert record["Version"] == record["package_version"] == "25.5.0"
    assert re.fullmatch(r"\[\d+\.\d+\.\d+,\d+\.\d+\.\d+\]", record["compatible_version_fw"])
    assert re.fullmatch(r"V\d{3}R\d{3}C\d+SPC\d{3}", record["Innerversion"])


def test_the_firmware_record_has_the_vendors_keys_in_order(node: dict) -> None:
    assert run(node, "firmware", "--upgrade").returncode == 2
    text = (node["ascend"] / "firmware/version.info").read_text()
    assert keys(text) == keys(fixture("firmware_version.info"))
    record = values(text)
    assert record["Version"] == "7.8.0.2.212" and record["firmware_version"] == "1.0"
    assert record["package_version"] == "25.5.0"  # the HDK release, not the firmware build
    assert re.fullmatch(r"(\[[^,\]]+,[^,\]]+\],?)+", record["compatible_version_drv"])


def test_the_install_record_of_a_first_install(node: dict) -> None:
    """Driver then firmware: the vendor's keys in the order its installers write them, the driver's status line
    appended after its install; every key is one a real record has (or the driver's code writes)."""
    bare(node)
    assert run(node, "driver", "--full").returncode == 2
    assert run(node, "firmware", "--full").returncode == 2
    record = (node["sysroot"] / "etc/ascend_install.info").read_text()
    assert keys(record) == keys(fixture("ascend_install.info.driver-then-firmware"))
    assert set(keys(fixture("ascend_install.info"))) <= set(keys(record))
    assert set(keys(record)) - set(keys(fixture("ascend_install.info"))) == {"Driver_Install_Mode",
                                                                              "Driver_Install_Status"}
    # an upgrade appends the status line at the end again, once
    assert run(node, "driver", "--upgrade").returncode in (0, 2)
    record = (node["sysroot"] / "etc/ascend_install.info").read_text()
    assert record.splitlines()[-1] == "Driver_Install_Status=complete"
    assert record.count("Driver_Install_Status=") == 1


# --- the output -------------------------------------------------------------------------------------------------


def test_the_fixtures_have_the_line_shape() -> None:
    for name in ("driver_install_exit0.out", "driver_install_exit2.out", "driver_install_error.out",
                 "driver_install_error_0095.out", "firmware_install.out"):
        lines = messages(fixture(name))
        assert lines[-1][2].startswith("End time: "), name


def test_a_first_install_exits_2_with_the_vendors_lines(node: dict) -> None:
    bare(node)
    drv = run(node, "driver", "--full")
    assert drv.returncode == 2
    printed = messages(drv.stdout)
    expected = messages(fixture("driver_install_exit2.out"))
    assert [(tag, level, text.strip()) for tag, level, text in expected[1:-1]] == \
        [(tag, level, text.strip()) for tag, level, text in printed[-3:-1]]
    assert printed[0][2].startswith("Start time: ")
    assert printed[1] == messages(fixture("driver_install_exit0.out"))[1]  # LogFile: /var/log/ascend_seclog/...
    assert running(node)[0] == "none"


def test_an_upgrade_whose_hot_reset_works_exits_0(node: dict, tmp_path: Path) -> None:
    with_npu_smi(node, tmp_path)
    drv = run(node, "driver", "--upgrade")
    assert drv.returncode == 0, drv.stdout + drv.stderr
    closing = [text.strip() for _, _, text in messages(drv.stdout)][-2]
    vendor = [text.strip() for _, _, text in messages(fixture("driver_install_exit0.out"))][-2]
    assert closing == vendor.replace("installed", "upgraded")
    assert running(node)[0] == "25.5.0"


def test_the_firmware_prints_the_vendors_closing_line(node: dict) -> None:
    fw = run(node, "firmware", "--upgrade")
    assert fw.returncode == 2
    closing = [text for _, _, text in messages(fw.stdout)][-2]
    vendor = [text for _, _, text in messages(fixture("firmware_install.out"))][-2]
    assert closing == vendor.replace("installed", "upgraded")
    assert {tag for tag, _, _ in messages(fw.stdout)} == {"Firmware"}


def test_upgrade_to_an_older_driver_is_performed(node: dict, tmp_path: Path) -> None:
    with_npu_smi(node, tmp_path)
    (node["ascend"] / "driver/version.info").write_text("Version=26.0.rc1\npackage_version=26.0.rc1\n")
    back = run(node, "driver", "--upgrade")
    assert back.returncode == 0, back.stdout + back.stderr
    assert installed(node, "driver") == "25.5.0"


@pytest.mark.parametrize("args", [
    ["--upgrade", "--quiet", "--install-path=/usr/local/Ascend"],
    ["--upgrade", "--quiet", "--install-username=root", "--install-usergroup=root", "--install-for-all"],
    ["--full", "--upgrade", "--quiet"],
    ["--uninstall", "--quiet"],
    ["--install", "--quiet"],
])
def test_refused_combinations_exit_1_with_err_0x0004(node: dict, args: list[str]) -> None:
    refused = raw(node, "driver", "--nox11", *args)
    assert refused.returncode == 1
    printed = messages(refused.stdout)
    errors = [text for _, level, text in printed if level == "ERROR"]
    assert len(errors) == 1 and ERROR_LINE.match(errors[0]) and errors[0].startswith("ERR_NO:0x0004;")
    assert [e["code"] for e in hdk.installer_errors(refused.stdout)] == ["0x0004"]
    assert printed[-1][2].startswith("End time: ")
    assert installed(node, "driver") == "24.1.rc1"


def test_another_account_than_the_last_installations_is_0x0095(node: dict) -> None:
    record = node["sysroot"] / "etc/ascend_install.info"
    record.write_text(record.read_text().replace("UserName=root", "UserName=HwHiAiUser")
                      .replace("UserGroup=root", "UserGroup=HwHiAiUser"))
    refused = run(node, "driver", "--full")  # --install-username=root --install-usergroup=root
    assert refused.returncode == 1
    assert [line.split("] ", 2)[2] for line in refused.stdout.splitlines()][0] == \
        [line.split("] ", 2)[2] for line in fixture("driver_install_error_0095.out").splitlines()][0]
    assert hdk.installer_errors(refused.stdout) == hdk.installer_errors(fixture("driver_install_error_0095.out"))
    assert installed(node, "driver") == "24.1.rc1"


def test_not_root_is_0x0093(node: dict) -> None:
    """Run as nobody from a directory it can read (the test's tmp_path is root's alone)."""
    where = Path(tempfile.mkdtemp(prefix="hdk-nobody-"))
    try:
        where.chmod(0o777)
        pkg = where / node["driver"].name
        shutil.copy(node["driver"], pkg)
        pkg.chmod(0o755)
        env = {**node["env"], "TMPDIR": str(where), "HOME": str(where)}
        refused = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(pkg),
                                  "--nox11", "--upgrade", "--quiet"], env=env, capture_output=True, text=True,
                                 timeout=60)
    finally:
        shutil.rmtree(where)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert [e["code"] for e in hdk.installer_errors(refused.stdout)] == ["0x0093"]


def test_the_firmware_before_any_driver_is_refused(node: dict) -> None:
    bare(node)
    refused = run(node, "firmware", "--full")
    assert refused.returncode == 1 and "install the driver first" in refused.stdout
    assert not (node["ascend"] / "firmware/version.info").exists()
    assert json.loads(node["state"].read_text())["firmware_version"] == "7.1.0.6.220"


def test_the_error_parser_reads_the_fixtures() -> None:
    assert hdk.installer_errors(fixture("driver_install_error.out")) == [
        {"code": "0x0004", "description": "Unrecognized parameters: --install. Try './xxx.run --help' for more "
                                          "information."}]
    for name in ("driver_install_exit0.out", "driver_install_exit2.out", "firmware_install.out"):
        assert hdk.installer_errors(fixture(name)) == []


def test_the_logs_go_where_the_installers_say(node: dict) -> None:
    assert run(node, "firmware", "--upgrade").returncode == 2
    log = node["sysroot"] / "var/log/ascend_seclog/ascend_install.log"
    assert os.path.exists(log) and all(LINE.match(line) for line in log.read_text().splitlines())
