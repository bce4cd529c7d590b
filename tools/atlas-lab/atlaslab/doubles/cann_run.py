"""Builder of CANN installer test doubles: makeself-style self-extracting ``.run`` files.

Huawei's CANN packages cannot run without an NPU, so the lab bundle carries stand-ins
that behave like them: the real file names, the real installer options and exit codes,
an embedded SHA256 of the payload checked before extraction, and an installation at the
real paths (``ascend-toolkit/<v>`` before 8.5, ``cann-<v>`` from 8.5, ``nnal/atb/<v>``),
with ``set_env.sh``, the uninstallers and Huawei's version records in their formats:
``<arch>-linux/ascend_toolkit_install.info``, the kernels' ``opp_kernel/version.info``
(``Version=<build>``, ``version_dir=<release>``), from 8.5 the ops'
``<arch>-linux/ascend_ops_install.info``, NNAL's indented ``Key : Value`` ``version.info``
(``tests/fixtures/vendor/cann`` holds real-format records of each line; the contract test
``tests/unit/collection/test_vendor_contract_cann.py`` keeps the two alike).

A ``.run`` file is a bash header (``cann_installer/header.sh``) followed by a gzip tar
payload holding ``install.sh`` (``cann_installer/install.sh``), ``package.info`` and
the package's files. Builds are reproducible: the same version gives the same bytes.

File names (checked against public install guides, see ``package_files``):

* toolkit: ``Ascend-cann-toolkit_<v>_linux-<arch>.run``
* kernels, before 8.0.RC3: ``Ascend-cann-kernels-910b_<v>_linux.run`` (no arch: the
  operator binaries run on the NPU); from 8.0.RC3: ``..._linux-<arch>.run``;
  7.0.RC1: a ``Ascend-cann-kernels-910b_7.0.RC1_linux.zip`` holding the ``.run``
* 8.5 and later: ``Ascend-cann-910b-ops_<v>_linux-<arch>.run`` replaces the kernels
* NNAL from 8.0.RC2 (no NNAL package exists before): ``Ascend-cann-nnal_<v>_linux-<arch>.run``
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

INSTALLER_DIR = Path(__file__).with_name("cann_installer")
COMMON_SH = INSTALLER_DIR / "common.sh"  # shared with the HDK doubles
ARCHES = ("x86_64", "aarch64")
SOCS = ("910b",)
COMPONENTS = ("toolkit", "kernels", "nnal")
BUILD_MTIME = 1_700_000_000  # fixed timestamp: reproducible payloads

# matched whole (fullmatch)
_VERSION = re.compile(r"(?P<major>\d+)\.(?P<minor>\d+)\.(?:RC(?P<rc>\d+)|(?P<patch>\d+))(?P<tail>(?:\.\d+)*)")
_LOG_TAGS = {"toolkit": "Toolkit", "kernels": "Kernels", "ops": "Ops", "nnal": "NNAL"}


class CannBuildError(ValueError):
    """A build input that cannot be used; the message names it and the fix."""


def version_key(version: str) -> tuple[int, ...]:
    """Order of CANN versions: 7.0.RC1 < 7.0.0 < 7.0.1.1 < 8.0.RC3 < 8.0.0 < 8.5.0."""
    match = _VERSION.fullmatch(version)
    if not match:
        raise CannBuildError(
            f"CANN version {version!r} is not of the form <major>.<minor>.RC<n> or <major>.<minor>.<patch>"
            " (examples: 7.0.RC1, 8.3.RC1, 8.5.0)"
        )
    final, number = (0, int(match["rc"])) if match["rc"] is not None else (1, int(match["patch"]))
    tail = tuple(int(part) for part in match["tail"].split(".") if part)
    return (int(match["major"]), int(match["minor"]), final, number, *tail)


def uses_cann_layout(version: str) -> bool:
    """8.5 and later install to ``<path>/cann-<v>`` and ship ops instead of kernels."""
    return version_key(version) >= version_key("8.5.0")


def has_nnal(version: str) -> bool:
    """NNAL (Ascend Transformer Boost) ships as a CANN package from 8.0.RC2."""
    return version_key(version) >= version_key("8.0.RC2")


@dataclass(frozen=True)
class CannPackageSpec:
    """One package of a CANN release as it appears in the bundle's ``cann/`` directory."""

    component: str  # toolkit | kernels | nnal (kernels also names the 8.5+ ops package)
    kind: str  # toolkit | kernels | ops | nnal: what the installer calls itself
    package_name: str  # package_name= in the version record
    file_name: str  # the file in the bundle (.run, or .zip for 7.0.RC1 kernels)
    run_name: str  # the .run file itself (inside the zip when file_name is a zip)


def package_files(version: str, arch: str = "x86_64", soc: str = "910b") -> list[CannPackageSpec]:
    """The packages of CANN ``version`` in install order (toolkit, kernels/ops, NNAL)."""
    _validate(version, arch, soc)
    specs = [
        CannPackageSpec(
            "toolkit",
            "toolkit",
            "Ascend-cann-toolkit",
            f"Ascend-cann-toolkit_{version}_linux-{arch}.run",
            f"Ascend-cann-toolkit_{version}_linux-{arch}.run",
        )
    ]
    if uses_cann_layout(version):
        name = f"Ascend-cann-{soc}-ops_{version}_linux-{arch}.run"
        specs.append(CannPackageSpec("kernels", "ops", f"Ascend-cann-{soc}-ops", name, name))
    else:
        suffix = f"linux-{arch}" if version_key(version) >= version_key("8.0.RC3") else "linux"
        run = f"Ascend-cann-kernels-{soc}_{version}_{suffix}.run"
        file_name = run[: -len(".run")] + ".zip" if version == "7.0.RC1" else run
        specs.append(CannPackageSpec("kernels", "kernels", f"Ascend-cann-kernels-{soc}", file_name, run))
    if has_nnal(version):
        name = f"Ascend-cann-nnal_{version}_linux-{arch}.run"
        specs.append(CannPackageSpec("nnal", "nnal", "Ascend-cann-nnal", name, name))
    return specs


def build_cann_packages(out_dir: Path, version: str, *, arch: str = "x86_64", soc: str = "910b") -> list[Path]:
    """Write the packages of CANN ``version`` to ``out_dir``; return their paths in install order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in package_files(version, arch, soc):
        run_bytes = build_run(spec, version, arch=arch, soc=soc)
        target = out_dir / spec.file_name
        if spec.file_name.endswith(".zip"):
            write_if_changed(target, _zip_bytes(spec.run_name, run_bytes), 0o644)
        else:
            write_if_changed(target, run_bytes, 0o755)
        paths.append(target)
    return paths


def build_run(spec: CannPackageSpec, version: str, *, arch: str, soc: str) -> bytes:
    """The bytes of one self-extracting ``.run``: header, then the gzip tar payload."""
    return make_run(f"{spec.package_name} {version}", spec.run_name, _payload_files(spec, version, arch, soc))


def make_run(label: str, run_name: str, files: dict[str, tuple[bytes, int]]) -> bytes:
    """A makeself-style ``.run``: the shared header (``cann_installer/header.sh``) over a gzip tar of ``files``
    (``install.sh`` among them: the script the header runs after checking the payload)."""
    payload = _tar_gz(files)
    return _render_header(label, run_name, payload, unpacked=sum(len(data) for data, _ in files.values())) + payload


def innerversion(version: str) -> str:
    """A Huawei-style internal version (V100R001C<nn>...); synthetic but stable per version."""
    key = version_key(version)
    release = f"SPC{key[3]:03d}" if key[2] else f"RC{key[3]}"
    return f"V100R001C{key[0]}{key[1]}{release}B{100 + sum(key[4:])}"


def component_build(version: str) -> str:
    """A component build number distinct from the release, as Huawei's records carry one (8.0.0's kernels:
    ``Version=7.6.0.1.220``, ``version_dir=8.0.0``); synthetic but stable per version."""
    key = version_key(version)
    return f"{key[0]}.{key[1]}.{key[2]}.{key[3]}.220"


def _record_values(version: str) -> dict[str, str]:
    """The values the double's records carry besides the release (examples of the real records' shapes)."""
    key = version_key(version)
    built = time.gmtime(BUILD_MTIME)
    return {
        "BUILD": component_build(version),
        "TIMESTAMP": time.strftime("%Y%m%d_%H%M%S000", built),
        "REQUIRED_RANGE": f">={key[0]}.0, <={key[0]}.{key[1]}",
        "COMPATIBLE_VERSION": f"[{innerversion(version)[:11]}]",
        "NNAL_BUILD": f"B{100 + key[3]:03d}",
        "NNAL_BRANCH": f"br_release_cann_{version}_{time.strftime('%Y%m%d', built)}",
        "COMMIT_ID": hashlib.sha1(f"atb {version}".encode()).hexdigest(),
    }


def _validate(version: str, arch: str, soc: str) -> None:
    version_key(version)
    if arch not in ARCHES:
        raise CannBuildError(f"arch {arch!r} is not one of {', '.join(ARCHES)}")
    if soc not in SOCS:
        raise CannBuildError(f"soc {soc!r} is not one of {', '.join(SOCS)}; the lab simulates Atlas 910B nodes")


def _payload_files(spec: CannPackageSpec, version: str, arch: str, soc: str) -> dict[str, tuple[bytes, int]]:
    layout = "cann" if uses_cann_layout(version) else "ascend-toolkit"
    info = {
        "KIND": spec.kind,
        "PKG_NAME": spec.package_name,
        "PKG_FILE": spec.run_name,
        "VERSION": version,
        "INNERVERSION": innerversion(version),
        "ARCH": arch,
        "SOC": soc,
        "LAYOUT": layout,
        "LOG_TAG": _LOG_TAGS[spec.kind],
        **_record_values(version),
    }
    package_info = "".join(f'{key}="{value}"\n' for key, value in info.items()).encode()
    files: dict[str, tuple[bytes, int]] = {
        "install.sh": ((INSTALLER_DIR / "install.sh").read_bytes(), 0o755),
        "common.sh": (COMMON_SH.read_bytes(), 0o644),
        "package.info": (package_info, 0o644),
    }
    for rel, text in _component_files(spec.kind, version, arch, soc).items():
        mode = 0o755 if rel.startswith("bin/") or "/bin/" in rel else 0o644
        files[f"files/{rel}"] = (text.encode(), mode)
    return files


def _component_files(kind: str, version: str, arch: str, soc: str) -> dict[str, str]:
    stub = f"atlas lab stand-in for a CANN {version} {arch} library; not loadable\n"
    if kind == "toolkit":
        return {
            "bin/atc": f"#!/bin/bash\necho 'ATC start working now, please wait for a moment.'\n"
            f"echo 'CANN {version} stand-in: no NPU compiler in the lab' >&2\nexit 1\n",
            "lib64/libascendcl.so": stub,
            "lib64/libhccl.so": stub,
            "python/site-packages/acl/__init__.py": f'"""CANN {version} stand-in."""\n',
            "opp/built-in/op_impl/ai_core/tbe/config/ascend910b/aic-ascend910b-ops-info.json": "{}\n",
            # the toolkit's own components (not the kernels' or ops' record): Version=<build>, version_dir=<release>
            "opp/version.info": f"Version={component_build(version)}\nversion_dir={version}\n",
            "compiler/version.info": f"Version={component_build(version)}\nversion_dir={version}\n",
        }
    if kind in ("kernels", "ops"):
        base = f"opp/built-in/op_impl/ai_core/tbe/kernel/ascend{soc}"
        return {f"{base}/binary_info_config.json": "{}\n", f"{base}/add/Add_stub.json": "{}\n"}
    return {f"atb/cxx_abi_{abi}/lib/libatb.so": stub for abi in (0, 1)} | {
        "atb/cxx_abi_1/bin/.keep": "",
        "atb/cxx_abi_0/bin/.keep": "",
    }


def _tar_gz(files: dict[str, tuple[bytes, int]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            data, mode = files[name]
            member = tarfile.TarInfo(f"./{name}")
            member.size, member.mode, member.mtime = len(data), mode, BUILD_MTIME
            member.uname = member.gname = "root"
            tar.addfile(member, io.BytesIO(data))
    compressed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return compressed.getvalue()


def _render_header(label: str, run_name: str, payload: bytes, *, unpacked: int) -> bytes:
    template = (INSTALLER_DIR / "header.sh").read_text()
    values = {
        "@LABEL@": label,
        "@FILENAME@": run_name,
        "@TARGETDIR@": run_name[: -len(".run")],
        "@SHA256@": hashlib.sha256(payload).hexdigest(),
        "@MD5@": hashlib.md5(payload).hexdigest(),
        "@SIZE@": str(len(payload)),
        "@UNPACKED_KB@": str(max(1, unpacked // 1024)),
        "@HEADER_LINES@": str(template.count("\n")),
    }
    for placeholder, value in values.items():
        template = template.replace(placeholder, value)
    return template.encode()


def write_if_changed(target: Path, data: bytes, mode: int) -> None:
    """Leave an identical package alone (its inode, ctime and any reader of it); replace a
    different one atomically, so a node reading the bundle never sees a half-written file."""
    if target.exists() and target.stat().st_size == len(data) and target.read_bytes() == data:
        return
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, target)


def _zip_bytes(member: str, data: bytes) -> bytes:
    info = zipfile.ZipInfo(member, date_time=(2023, 9, 30, 0, 0, 0))
    info.external_attr = 0o100755 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr(info, data)
    return buf.getvalue()
