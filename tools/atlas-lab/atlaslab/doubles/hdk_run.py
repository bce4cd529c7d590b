"""Builder of Ascend HDK (NPU driver and firmware) installer test doubles.

Like the CANN doubles (:mod:`atlaslab.doubles.cann_run`, whose makeself header they share),
they carry Huawei's file names and options and check their payload before they run; the
install logic is ``hdk_installer/install.sh``. They follow Huawei's installers (hicann/driver
``scripts/package/custom/driver/common/scripts/{install.sh,args_parse.sh}`` @ ef377e95), not the suite:

* driver: ``Ascend-hdk-<soc>-npu-driver_<ver>_linux-<arch>.run`` with the options of Huawei's driver
  ``install.sh`` and its rules (``unsupportParam``): ``--full``/``--run`` or ``--upgrade``, ``--uninstall``
  alone, ``--install-path=`` and ``--install-username=``/``--install-usergroup=`` (a pair) only with a full
  install, each refusal the vendor's ``[ERROR]ERR_NO:0x0004;ERR_DES:...`` line and exit 1; an overwrite install
  with another account than ``/etc/ascend_install.info`` records is ``ERR_NO:0x0095``, not root ``0x0093``; an
  upgrade keeps the path and account the record names; ``--upgrade`` to an older version is performed;
* firmware: ``Ascend-hdk-<soc>-npu-firmware_<fwver>.run`` (no arch: it is flashed onto the
  NPU) with the options ascend-deployer gives it (``--full``, ``--upgrade``, ``--quiet``); needs an
  installed driver;
* records with the vendor's keys in the vendor's order: ``<path>/driver/version.info``,
  ``<path>/firmware/version.info``, ``/etc/ascend_install.info`` (``Driver_Install_Status=complete`` appended after
  a successful driver install); output and log lines ``[Driver] [<date>] [INFO]...`` in
  ``/var/log/ascend_seclog/ascend_install.log``;
* exit status 0 when the new version runs now (a hot reset that succeeded; a first install whose chips all came
  up), 2 when it runs only after a reboot (a first driver install, by default: "There are some chips not ready,
  please check after reboot"; a hot reset that fails while a process holds an NPU; any new firmware), 1 on
  failure, as Huawei's installers do.

Lab hooks, files on the node (under ``ATLAS_HDK_SYSROOT`` in unit tests): ``/etc/atlas-lab/chips-ready`` makes a
first driver install find every chip up (exit 0, the driver runs at once); ``/etc/atlas-lab/fail-install`` names
package kinds (``driver``, ``firmware``), one a line, whose installer then fails (exit 1) before it writes anything.

In the lab the node's simulated NPU layer (:mod:`atlaslab.npu`) keeps the running
versions apart from the installed ones, and loads the installed ones when the node boots.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from atlaslab.doubles.cann_run import ARCHES, COMMON_SH, SOCS, CannBuildError, make_run, write_if_changed

INSTALLER = Path(__file__).with_name("hdk_installer") / "install.sh"
_DRIVER_VERSION = re.compile(r"\d+\.\d+\.(?:rc\d+|RC\d+|\d+)(?:\.\d+)*")  # fullmatch
_FIRMWARE_VERSION = re.compile(r"\d+(?:\.\d+){2,5}")  # fullmatch
_LOG_TAGS = {"driver": "Driver", "firmware": "Firmware"}
# The lab hooks of the installer doubles, relative to the node's root (see the module docstring).
CHIPS_READY_REL = Path("etc/atlas-lab/chips-ready")
FAIL_INSTALL_REL = Path("etc/atlas-lab/fail-install")


@dataclass(frozen=True)
class HdkPackageSpec:
    kind: str  # driver | firmware
    package_name: str
    file_name: str
    version: str


def hdk_package_files(driver: str, firmware: str, arch: str = "x86_64", soc: str = "910b") -> list[HdkPackageSpec]:
    """The HDK packages of a driver/firmware pair, in first-install order (driver, then firmware)."""
    if not _DRIVER_VERSION.fullmatch(driver):
        raise CannBuildError(f"HDK driver version {driver!r} is not of the form 24.1.rc1, 24.1.0 or 25.5.0")
    if not _FIRMWARE_VERSION.fullmatch(firmware):
        raise CannBuildError(f"NPU firmware version {firmware!r} is not of the form 7.1.0.6.220")
    if arch not in ARCHES:
        raise CannBuildError(f"arch {arch!r} is not one of {', '.join(ARCHES)}")
    if soc not in SOCS:
        raise CannBuildError(f"soc {soc!r} is not one of {', '.join(SOCS)}; the lab simulates Atlas 910B nodes")
    driver_name, firmware_name = f"Ascend-hdk-{soc}-npu-driver", f"Ascend-hdk-{soc}-npu-firmware"
    return [
        HdkPackageSpec("driver", driver_name, f"{driver_name}_{driver}_linux-{arch}.run", driver),
        HdkPackageSpec("firmware", firmware_name, f"{firmware_name}_{firmware}.run", firmware),
    ]


def build_hdk_packages(out_dir: Path, driver: str, firmware: str, *, arch: str = "x86_64",
                       soc: str = "910b") -> list[Path]:
    """Write the driver and firmware packages to ``out_dir``; return their paths (driver first)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in hdk_package_files(driver, firmware, arch, soc):
        target = out_dir / spec.file_name
        write_if_changed(target, build_hdk_run(spec, driver_version=driver, arch=arch), 0o755)
        paths.append(target)
    return paths


def build_hdk_run(spec: HdkPackageSpec, *, driver_version: str, arch: str) -> bytes:
    info = {
        "KIND": spec.kind,
        "PKG_NAME": spec.package_name,
        "PKG_FILE": spec.file_name,
        "VERSION": spec.version,
        "PACKAGE_VERSION": driver_version,
        "INNERVERSION": _innerversion(spec.version),
        "ARCH": arch,
        "LOG_TAG": _LOG_TAGS[spec.kind],
    }
    stub = f"atlas lab stand-in for the Ascend HDK {spec.kind} {spec.version}; not loadable\n".encode()
    files: dict[str, tuple[bytes, int]] = {
        "install.sh": (INSTALLER.read_bytes(), 0o755),
        "common.sh": (COMMON_SH.read_bytes(), 0o644),
        "package.info": ("".join(f'{k}="{v}"\n' for k, v in info.items()).encode(), 0o644),
    }
    if spec.kind == "driver":
        files["files/driver/lib64/driver/libascend_hal.so"] = (stub, 0o644)
        files["files/driver/lib64/common/libc_sec.so"] = (stub, 0o644)
        files["files/driver/kernel/drv_davinci.ko.stub"] = (stub, 0o644)
    else:
        files["files/firmware/Ascend910B-hccs.hpm.stub"] = (stub, 0o644)
    return make_run(f"{spec.package_name} {spec.version}", spec.file_name, files)


def _innerversion(version: str) -> str:
    """A Huawei-style internal version; synthetic but stable per version."""
    major, minor, *_ = version.split(".")
    return f"V100R001C{major}{minor}SPC{zlib.crc32(version.encode()) % 1000:03d}"
