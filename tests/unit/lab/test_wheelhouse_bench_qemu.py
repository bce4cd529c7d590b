"""The wheelhouse benchmark's offline install proof, without the network or qemu: the sysroot's package list,
the private apt it is fetched with, the stand-ins for vendor wheels, and how an import's error is judged."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from atlasctl import wheelhouse
from atlaslab import qemu_sysroot
from atlaslab.benchmarks import wheelhouse as bench


def test_the_package_list_names_arm64_packages_and_the_hosts_emulator():
    packages = qemu_sysroot.parse_packages("""
        # a comment
        python3.11   # the interpreter
        media-types:all
        qemu-user-static:amd64

        libstdc++6
    """)
    assert packages == [("python3.11", "arm64"), ("media-types", "all"), ("qemu-user-static", "amd64"),
                        ("libstdc++6", "arm64")]


@pytest.mark.parametrize("text, said", [
    ("Python3.11", "line 1: 'Python3.11' is not a Debian package name"),
    ("libc6:armhf", "is not a Debian package name with an optional :arm64/:all/:amd64"),
    ("libc6\n# two\nlibc6", "line 3: libc6 is named twice"),
    ("libc6 libssl3", "is not a Debian package name"),
])
def test_a_bad_package_list_is_refused_naming_the_line(text, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        qemu_sysroot.parse_packages(text)


def test_the_sysroot_has_cpython_3_11_its_libraries_and_qemu_for_this_machine():
    packages = dict(qemu_sysroot.parse_packages(qemu_sysroot.PACKAGES))
    assert packages["qemu-user-static"] == "amd64"
    for name in ("python3.11-minimal", "libpython3.11-stdlib", "libc6", "libssl3", "zlib1g", "libffi8", "libexpat1",
                 "libstdc++6", "libgomp1"):
        assert packages[name] == "arm64", name
    assert [n for n, a in packages.items() if a == "amd64"] == ["qemu-user-static"]


def test_apt_runs_with_a_private_state_and_reads_nothing_of_the_machines_own(tmp_path):
    options = qemu_sysroot.apt_options(tmp_path)
    pairs = dict(options[i + 1].split("=", 1) for i in range(0, len(options) - 1, 2) if options[i] == "-o"
                 and "=" in options[i + 1] and not options[i + 1].startswith("APT::Architectures::"))
    for key in ("Dir::State", "Dir::State::status", "Dir::Cache", "Dir::Etc::SourceList"):
        assert pairs[key].startswith(str(tmp_path)), key
    assert pairs["Dir::Etc::SourceParts"] == "/nonexistent"
    assert "APT::Architectures::=arm64" in options
    assert "deb.debian.org/debian bookworm" in qemu_sysroot.SOURCES


@pytest.mark.parametrize("line, npu", [
    ("ImportError: libascend_hal.so: cannot open shared object file: No such file or directory", True),
    ("OSError: libhccl.so: cannot open shared object file: No such file or directory", True),
    ("RuntimeError: ASCEND_HOME_PATH is not set: install CANN and source set_env.sh", True),
    ("ModuleNotFoundError: No module named 'acl'", True),
    ("ModuleNotFoundError: No module named 'triton'", False),
    ("ModuleNotFoundError: No module named 'vllm_ascend'", False),
    ("ModuleNotFoundError: No module named 'arctic_inference'", False),
    ("SyntaxError: invalid syntax", False),
])
def test_an_import_error_reaches_the_ascend_stack_only_when_it_names_it(line, npu):
    assert bench.reaches_npu(line) is npu


def test_a_vendor_wheel_this_machine_cannot_reach_gets_a_named_stand_in_that_the_build_accepts(tmp_path):
    pipset = wheelhouse.parse_entry({
        "set": "s", "requirements": ["a==1"], "targets": [{"platform": "manylinux_2_34_aarch64", "python": "3.11"}],
        "vendor_dir": str(tmp_path / "vendor"),
        "vendor": [{"name": "triton-ascend", "version": "3.2.2", "source": "Huawei's mirror"},
                   {"name": "kern", "version": "1.0", "source": "the vendor"}]})
    real = tmp_path / "vendor" / "kern-1.0-py3-none-any.whl"
    real.parent.mkdir()
    with zipfile.ZipFile(real, "w") as zf:
        zf.writestr("kern-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: kern\nVersion: 1.0\n")
    real.with_name(real.name + ".sha256").write_text(hashlib.sha256(real.read_bytes()).hexdigest() + "\n")
    folder, named = bench.stand_in_vendor(pipset, pipset.vendor_dir, tmp_path / "bench-vendor")
    assert named == ["triton-ascend 3.2.2"]  # kern is there: only the missing one is stood in for
    assert sorted(p.name for p in Path(folder).iterdir()) == [
        "kern-1.0-py3-none-any.whl", "kern-1.0-py3-none-any.whl.sha256",
        "triton_ascend-3.2.2-py3-none-any.whl", "triton_ascend-3.2.2-py3-none-any.whl.sha256"]
    [target] = pipset.targets
    wheelhouse.check_vendor(dataclasses.replace(pipset, vendor_dir=folder), target)
