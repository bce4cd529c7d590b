"""Engine wheel sets for the nodes' platform (atlasctl.wheelhouse), offline: real uv and pip resolve tiny wheels
from a local directory. The markers are evaluated for the target, not this machine; vendor packages, sdist
builds and the compatibility gate refuse what would not install or run on the nodes."""

from __future__ import annotations

import email.parser
import hashlib
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from atlasctl import wheelhouse
from atlasctl.errors import UsageError

AARCH64 = {"platform": ["manylinux_2_28_aarch64"], "python": "3.11"}
X86_64 = {"platform": ["manylinux_2_28_x86_64"], "python": "3.11"}


def _wheel(folder: Path, name: str, version: str, tag: str, requires: tuple[str, ...] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}/__init__.py", "")
        zf.writestr(f"{dist}/METADATA", meta)
        zf.writestr(f"{dist}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


@pytest.fixture
def links(tmp_path: Path) -> Path:
    """eng needs gpu only on x86_64 (as torch needs nvidia-* there), kern and cv everywhere (kern: one wheel per
    architecture, the aarch64 one with a plain linux tag as vendors ship them; cv: abi3 wheels)."""
    d = tmp_path / "links"
    _wheel(d, "gpu", "1.0", "py3-none-manylinux_2_17_x86_64")
    _wheel(d, "kern", "1.0", "cp311-cp311-linux_aarch64")
    _wheel(d, "kern", "1.0", "cp311-cp311-manylinux_2_28_x86_64")
    _wheel(d, "eng", "1.0", "py3-none-any", ("gpu==1.0; platform_machine == 'x86_64'", "kern==1.0", "cv==4.0"))
    _wheel(d, "cv", "4.0", "cp37-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64")  # abi3, as opencv ships
    _wheel(d, "cv", "4.0", "cp37-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64")
    return d


def _vouch(wheel: Path, digest: str | None = None) -> Path:
    """The ``<wheel>.sha256`` side file a vendor wheel's source publishes (sha256sum's format)."""
    side = wheel.with_name(wheel.name + ".sha256")
    side.write_text(f"{digest or hashlib.sha256(wheel.read_bytes()).hexdigest()}  {wheel.name}\n")
    return side


def _set(links: Path, **extra) -> wheelhouse.PipSet:
    entry = {"set": "eng-1.0", "requirements": ["eng==1.0"], "targets": [AARCH64, X86_64],
             "find_links": [str(links)], "no_index": True, **extra}
    return wheelhouse.parse_entry(entry)


def test_targets_name_the_tags_pip_needs_and_the_platform_uv_needs():
    old = wheelhouse.parse_target("t", {"platform": "manylinux2014_aarch64", "python": "3.11"})
    assert old.uv_platform == "aarch64-manylinux_2_17" and old.label == "manylinux2014_aarch64 / Python 3.11"
    new = wheelhouse.parse_target("t", {"platform": ["manylinux_2_28_x86_64", "manylinux2014_x86_64"],
                                        "python": "3.11"})
    assert new.uv_platform == "x86_64-manylinux_2_28"
    tags = new.pip_tags()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "linux_x86_64" in tags
    assert not any("aarch64" in t for t in tags)


def test_markers_are_evaluated_for_each_target_and_the_lock_carries_them(links, tmp_path):
    """pip would ask for gpu on aarch64 too (it evaluates markers for this x86_64 machine); the set is
    resolved per target, and requirements.lock marks what only x86_64 installs."""
    counts = wheelhouse.build_set(_set(links), tmp_path / "out", tmp_path / "cache")
    dest = tmp_path / "out/wheels/eng-1.0"
    assert sorted(p.name for p in dest.glob("*.whl")) == [
        "cv-4.0-cp37-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        "cv-4.0-cp37-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "eng-1.0-py3-none-any.whl", "gpu-1.0-py3-none-manylinux_2_17_x86_64.whl",
        "kern-1.0-cp311-cp311-linux_aarch64.whl", "kern-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert counts["wheels"] == 6
    assert (dest / "requirements.lock").read_text().splitlines() == [
        "cv==4.0", "eng==1.0", 'gpu==1.0 ; platform_machine == "x86_64"', "kern==1.0"]
    # the lock installs as the engines role installs it (no index, no deps), on this x86_64 machine
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index",
                           "--no-deps", "--find-links", str(dest), "--target", str(tmp_path / "t"), "-r",
                           str(dest / "requirements.lock")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "gpu-1.0" in proc.stdout and "kern-1.0" in proc.stdout


def test_a_target_the_wheels_do_not_cover_is_refused_by_name(links, tmp_path):
    (links / "kern-1.0-cp311-cp311-linux_aarch64.whl").unlink()
    with pytest.raises(UsageError, match=r"eng-1.0 for manylinux_2_28_aarch64 / Python 3\.11: no set of wheels"):
        wheelhouse.build_set(_set(links), tmp_path / "out", tmp_path / "cache")
    assert not (tmp_path / "out/wheels/eng-1.0").exists()  # nothing half-written into the bundle


def test_a_vendor_package_must_be_in_vendor_dir_for_its_targets(links, tmp_path):
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    wheel = vendor / "kern-1.0-cp311-cp311-linux_aarch64.whl"
    (links / wheel.name).rename(wheel)
    item = {"name": "kern", "version": "1.0", "arch": "aarch64", "source": "the vendor's portal (not on the index)"}
    pipset = _set(links, vendor_dir=str(tmp_path / "elsewhere"), vendor=[item])
    with pytest.raises(UsageError, match=r"vendor package kern 1\.0 is not in vendor_dir .*the vendor's portal"):
        wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache")
    pipset = _set(links, vendor_dir=str(vendor), vendor=[item])
    with pytest.raises(UsageError, match=r"has no kern-1\.0-cp311-cp311-linux_aarch64\.whl\.sha256 beside it"):
        wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache")
    _vouch(wheel, "0" * 64)
    with pytest.raises(UsageError, match=r"sha256 [0-9a-f]{64} is not kern-1\.0-.*\.whl\.sha256's 0{64}"):
        wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache")
    _vouch(wheel)
    wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache")
    assert (tmp_path / "out/wheels/eng-1.0/kern-1.0-cp311-cp311-linux_aarch64.whl").is_file()


@pytest.fixture
def engine_links(tmp_path: Path) -> Path:
    d = tmp_path / "engine"
    _wheel(d, "vllm-ascend", "0.11.0", "cp311-cp311-manylinux_2_24_aarch64", ("torch==2.7.1", "torch-npu==2.7.1"))
    for version in ("2.7.1", "2.8.0"):
        _wheel(d, "torch", version, "cp311-cp311-manylinux_2_28_aarch64")
        _wheel(d, "torch-npu", version, "cp311-cp311-manylinux_2_28_aarch64", (f"torch=={version}",))
    return d


def _engine_set(links: Path, requirements: list[str]) -> wheelhouse.PipSet:
    return wheelhouse.parse_entry({"set": "vllm-ascend-0.11.0", "requirements": requirements, "targets": [AARCH64],
                                   "find_links": [str(links)], "no_index": True,
                                   "engine": {"name": "vllm-ascend", "version": "0.11.0"}})


def test_the_compatibility_gate_refuses_pins_the_engine_is_not_built_for(engine_links, tmp_path):
    good = _engine_set(engine_links, ["vllm-ascend==0.11.0"])
    wheelhouse.build_set(good, tmp_path / "ok", tmp_path / "cache")
    assert "torch-npu==2.7.1" in (tmp_path / "ok/wheels/vllm-ascend-0.11.0/requirements.lock").read_text()
    _wheel(engine_links, "vllm-ascend", "0.11.0", "cp311-cp311-manylinux_2_24_aarch64",
           ("torch==2.8.0", "torch-npu==2.8.0"))  # the same name, now built against torch 2.8.0
    bad = _engine_set(engine_links, ["vllm-ascend==0.11.0", "torch==2.8.0", "torch-npu==2.8.0"])
    with pytest.raises(UsageError, match=r"compatibility gate refuses it: .*built for torch 2\.7\.1, not 2\.8\.0"):
        wheelhouse.build_set(bad, tmp_path / "bad", tmp_path / "cache")


def test_the_gate_judges_the_set_against_each_cann_the_bundle_carries(engine_links, tmp_path):
    pipset = _engine_set(engine_links, ["vllm-ascend==0.11.0"])
    with pytest.raises(UsageError, match=r"vllm-ascend 0\.11\.0 needs CANN 8\.3\.RC2"):
        wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache", canns=["8.5.0"])
    wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache", canns=["8.5.0", "8.3.RC2"])
    assert wheelhouse.canns_of(["Ascend-cann-toolkit_8.3.RC2_linux-aarch64.run",
                                "Ascend-cann-kernels-910b_8.3.RC2_linux-aarch64.run",
                                "Ascend-hdk-910b-npu-driver_25.3.rc1_linux-aarch64.run"]) == ["8.3.RC2"]


def _sdist(tmp_path: Path, name: str, setup: str, extra: dict[str, str] | None = None) -> Path:
    root = tmp_path / "src" / f"{name}-1.0"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / "setup.py").write_text(setup)
    for file, text in (extra or {}).items():
        (root / file).write_text(text)
    out = tmp_path / f"{name}-1.0.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return out


def test_an_sdist_is_built_once_into_a_platform_neutral_wheel_from_its_pinned_file(tmp_path):
    setup = ("import os\nfrom setuptools import setup\n"
             "setup(name='neutral', version='1.0' + os.environ.get('SUFFIX', ''), packages=['neutral'])\n")
    sdist = _sdist(tmp_path, "neutral", setup)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    build = wheelhouse._parse_build("t", {"sdist": sdist.name, "sha256": sha, "env": {"SUFFIX": "+empty"},
                                          "isolation": False})
    wheel = wheelhouse.build_wheel(build, str(tmp_path), tmp_path / "cache")
    assert wheel.name == "neutral-1.0+empty-py3-none-any.whl"  # env reaches the build, as VLLM_TARGET_DEVICE does
    assert wheelhouse.build_wheel(build, "/nonexistent", tmp_path / "cache") == wheel  # cached: not fetched again
    wrong = wheelhouse._parse_build("t", {"sdist": sdist.name, "sha256": "0" * 64, "isolation": False})
    with pytest.raises(UsageError, match=r"sha256 .* is not the pinned 0{64}"):
        wheelhouse.build_wheel(wrong, str(tmp_path), tmp_path / "cache")


def test_a_build_for_this_machines_platform_is_refused(tmp_path):
    setup = ("from setuptools import setup\nfrom setuptools.dist import Distribution\n"
             "class D(Distribution):\n    def has_ext_modules(self):\n        return True\n"
             "setup(name='native', version='1.0', packages=['native'], distclass=D)\n")
    sdist = _sdist(tmp_path, "native", setup)
    build = wheelhouse._parse_build("t", {"sdist": sdist.name, "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
                                          "isolation": False})
    with pytest.raises(UsageError, match=r"a wheel for this build machine's platform, not the nodes'"):
        wheelhouse.build_wheel(build, str(tmp_path), tmp_path / "cache")


def test_a_named_pyproject_replaces_the_sdists_own(tmp_path):
    """SGLang's NPU build: its sdist's pyproject_other.toml is used as pyproject.toml."""
    other = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
             '[project]\nname = "npuflavour"\nversion = "1.0"\n[tool.setuptools]\npackages = ["flavour"]\n')
    sdist = _sdist(tmp_path, "flavour", "from setuptools import setup\nsetup(name='flavour', version='1.0')\n",
                   {"pyproject_other.toml": other})
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    build = wheelhouse._parse_build("t", {"sdist": sdist.name, "sha256": sha, "pyproject": "pyproject_other.toml",
                                          "isolation": False})
    assert wheelhouse.build_wheel(build, str(tmp_path), tmp_path / "cache").name == "npuflavour-1.0-py3-none-any.whl"
    missing = wheelhouse._parse_build("t", {"sdist": sdist.name, "sha256": sha, "pyproject": "pyproject_npu.toml",
                                            "isolation": False})
    with pytest.raises(UsageError, match="has no pyproject_npu.toml at its top"):
        wheelhouse.build_wheel(missing, str(tmp_path), tmp_path / "cache2")


@pytest.mark.parametrize("extra, said", [
    ({"colour": 1}, "unknown key(s) colour"),
    ({"engine": {"name": "vllm-ascend"}}, "must be {name, version}"),
    ({"build": [{"sdist": "https://x/v.tar.gz", "sha256": "abc"}]}, "sha256 must be the sdist's 64-hex sha256"),
    ({"build": [{"sdist": "v.whl", "sha256": "0" * 64}]}, "must be the URL or file name of a .tar.gz or .zip"),
    ({"build": [{"sdist": "v.tar.gz", "sha256": "0" * 64}]}, "need vendor_dir"),
    ({"vendor": [{"name": "torch", "version": "2.7.1+cpu"}]}, "needs name and source"),
    ({"vendor": [{"name": "torch", "version": "2.7.1+cpu", "source": "s"}]}, "need vendor_dir"),
    ({"vendor_dir": "/v", "vendor": [{"name": "t", "version": "1", "source": "s", "arch": "ppc64le"}]},
     "arch is x86_64 or aarch64"),
    ({"targets": [{"platform": "win_amd64", "python": "3.11"}]}, "not a Linux x86_64/aarch64 wheel tag"),
])
def test_a_bad_pip_entry_is_refused_with_the_fix(tmp_path, extra, said):
    with pytest.raises(UsageError) as err:
        _set(tmp_path, **extra)
    assert said in str(err.value) and "eng-1.0" in str(err.value)


def test_a_package_built_here_wins_over_the_same_release_on_the_index(links, tmp_path):
    """SGLang 0.5.8's NPU build has the name and version of PyPI's CUDA wheel, whose torch pin differs:
    the set takes the wheel it built, never the index's."""
    other = ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
             '[project]\nname = "eng"\nversion = "1.0"\ndependencies = ["kern==1.0"]\n'
             '[tool.setuptools]\npackages = ["eng"]\n')
    sdist = _sdist(tmp_path, "eng", "from setuptools import setup\nsetup()\n", {"pyproject_other.toml": other})
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    build = [{"sdist": sdist.name, "sha256": sha, "pyproject": "pyproject_other.toml", "isolation": False}]
    pipset = _set(links, build=build, vendor_dir=str(tmp_path))  # links' eng 1.0 needs gpu on x86_64 and cv
    wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache")
    lock = (tmp_path / "out/wheels/eng-1.0/requirements.lock").read_text().splitlines()
    assert lock == ["eng==1.0", "kern==1.0"]
    with pytest.raises(UsageError, match=r"eng==2\.0 is not what its build makes \(eng-1\.0-py3-none-any\.whl\)"):
        wheelhouse.build_set(_set(links, build=build, vendor_dir=str(tmp_path), requirements=["eng==2.0"]),
                             tmp_path / "out2", tmp_path / "cache")


def test_the_example_banks_current_line_names_the_wheels_the_index_does_not_carry(tmp_path):
    """vllm-ascend 0.23.0.post1 (sdist only on the index), triton-ascend 3.2.2 and arctic-inference 0.1.1 come from
    Huawei's mirror: the build refuses the set, naming each and where it comes from, until the vendor directory
    holds its aarch64 wheel; the set is judged against the CANN 9.1.0 the bundle carries."""
    import dataclasses

    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[3] / "inventory/example-bank/bundle.yml").read_text())
    entry = next(e for e in spec["pip"] if e["set"] == "vllm-ascend-0.23.0.post1")
    assert "Ascend-cann-toolkit_9.1.0_linux-aarch64.run" in spec["huawei"]
    pipset = dataclasses.replace(wheelhouse.parse_entry(entry), vendor_dir=str(tmp_path))
    [target] = pipset.targets
    assert (target.arch, target.python, target.glibc) == ("aarch64", "3.11", 34)
    assert pipset.builds == ()  # vLLM 0.23's empty build is not platform-neutral: built on an aarch64 host
    huawei = r"mirrors\.huaweicloud\.com/ascend/repos/pypi"
    aarch64_build = r"built on an aarch64 host .* VLLM_TARGET_DEVICE"
    for name, version, source in (("vllm-ascend", "0.23.0.post1", huawei), ("triton-ascend", "3.2.2", huawei),
                                  ("arctic-inference", "0.1.1", huawei), ("vllm", r"0\.23\.0\+empty", aarch64_build)):
        with pytest.raises(UsageError, match=rf"vendor package {name} {version} is not in vendor_dir .*{source}"):
            wheelhouse.check_vendor(pipset, target)
        tag = "py3-none-any" if name == "vllm" else "cp311-cp311-manylinux_2_34_aarch64"
        _vouch(_wheel(tmp_path, name, version.replace("\\", ""), tag))
    wheelhouse.check_vendor(pipset, target)


def _spec_entry(name: str) -> dict:
    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[3] / "inventory/example-bank/bundle.yml").read_text())
    return next(e for e in spec["pip"] if e["set"] == name)


def test_the_example_banks_0_23_0_set_is_built_from_the_index_with_one_vendor_wheel(tmp_path):
    """vllm-ascend 0.23.0 has an aarch64 wheel on the index; vLLM is its empty build given the nodes' tag;
    triton-ascend 3.2.2 is the one vendor wheel; arctic-inference is left out, with the reason."""
    import dataclasses

    pipset = dataclasses.replace(wheelhouse.parse_entry(_spec_entry("vllm-ascend-0.23.0")), vendor_dir=str(tmp_path))
    [target] = pipset.targets
    assert (target.arch, target.python, target.glibc) == ("aarch64", "3.11", 34)
    assert pipset.engine == ("vllm-ascend", "0.23.0")
    assert {"vllm-ascend==0.23.0", "vllm==0.23.0+empty", "torch==2.10.0", "torch-npu==2.10.0.post4",
            "triton-ascend==3.2.2"} <= set(pipset.requirements)
    [build] = pipset.builds
    assert build.sdist.endswith("/vllm-0.23.0.tar.gz") and dict(build.env) == {"VLLM_TARGET_DEVICE": "empty"}
    assert build.platform == "manylinux_2_34_aarch64"
    assert [(v.name, v.version) for v in pipset.vendor] == [("triton-ascend", "3.2.2")]
    assert [i.name for i in pipset.leave_out] == ["arctic-inference"] and "suffix" in pipset.leave_out[0].reason
    # the build refuses the set at once (before any sdist is fetched or built), naming the wheel and its source
    with pytest.raises(UsageError, match=r"vendor package triton-ascend 3\.2\.2 is not in vendor_dir .*Huawei's "
                                         r"Ascend PyPI mirror, https://mirrors\.huaweicloud\.com/ascend/repos/pypi"):
        wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache")
    assert not (tmp_path / "cache/sdists").exists()
    wheel = _wheel(tmp_path, "triton-ascend", "3.2.2", "cp311-cp311-manylinux_2_27_aarch64.manylinux_2_28_aarch64")
    with pytest.raises(UsageError, match=r"no triton_ascend-3\.2\.2-.*\.whl\.sha256 beside it"):
        wheelhouse.check_vendor(pipset, target)
    _vouch(wheel)
    wheelhouse.check_vendor(pipset, target)


def _native_sdist(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    """An sdist that setuptools tags for this machine (it says it has extension modules, as setuptools-rust makes
    vLLM's say) and ships ``files`` as package data."""
    setup = ("from setuptools import setup\nfrom setuptools.dist import Distribution\n"
             "class D(Distribution):\n    def has_ext_modules(self):\n        return True\n"
             f"setup(name={name!r}, version='1.0', packages=[{name!r}], distclass=D, "
             f"package_data={{{name!r}: ['*.bin']}})\n")
    sdist = _sdist(tmp_path, name, setup)
    root = tmp_path / "src" / f"{name}-1.0"
    for file, data in files.items():
        (root / name / file).write_bytes(data)
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return sdist


def test_a_build_with_no_native_code_is_given_the_nodes_platform_tag(tmp_path):
    sdist = _native_sdist(tmp_path, "puretagged", {"data.bin": b"not code"})
    item = {"sdist": sdist.name, "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(), "isolation": False,
            "platform": "manylinux_2_34_aarch64"}
    wheel = wheelhouse.build_wheel(wheelhouse._parse_build("t", item), str(tmp_path), tmp_path / "cache")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert wheel.name == f"puretagged-1.0-{py}-{py}-manylinux_2_34_aarch64.whl"
    aarch64 = wheelhouse.parse_target("t", {"platform": ["manylinux_2_34_aarch64"],
                                            "python": f"{sys.version_info[0]}.{sys.version_info[1]}"})
    assert wheelhouse.wheel_fits(wheel.name, aarch64)
    with zipfile.ZipFile(wheel) as zf:  # read as pip reads it: a header block, Tag headers in it
        headers = email.parser.BytesParser().parsebytes(zf.read("puretagged-1.0.dist-info/WHEEL"))
    assert headers.get_all("Tag") == [f"{py}-{py}-manylinux_2_34_aarch64"]
    # pip takes it for the nodes' platform and checks its RECORD on install (a stale hash would be refused)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                           "--disable-pip-version-check", "--platform", "manylinux_2_34_aarch64", "--only-binary=:all:",
                           "--target", str(tmp_path / "t"), str(wheel)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t/puretagged/data.bin").read_bytes() == b"not code"
    with pytest.raises(UsageError, match=r"platform 'win_amd64' is not a Linux"):
        wheelhouse._parse_build("t", {**item, "platform": "win_amd64"})


def test_a_build_holding_machine_code_is_never_retagged(tmp_path):
    """An optional native part that did build (vLLM's Rust frontend where a Rust toolchain is found) is code
    for this machine: the wheel is refused, naming the member, whatever platform the spec asks for."""
    sdist = _native_sdist(tmp_path, "withbinary", {"tool.bin": b"\x7fELF\x02\x01\x01" + bytes(64)})
    item = {"sdist": sdist.name, "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(), "isolation": False,
            "platform": "manylinux_2_34_aarch64"}
    with pytest.raises(UsageError, match=r"holding native code \(withbinary/tool\.bin\)"):
        wheelhouse.build_wheel(wheelhouse._parse_build("t", item), str(tmp_path), tmp_path / "cache")


def test_retag_rewrites_the_name_the_wheel_file_and_its_record_line(tmp_path):
    import base64

    src = tmp_path / "pkg-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(src, "w") as zf:  # as a build writes it
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                                               "Tag: cp311-cp311-linux_x86_64\n\n")
        zf.writestr("pkg-1.0.dist-info/RECORD", "pkg/__init__.py,sha256=x,0\npkg-1.0.dist-info/WHEEL,sha256=y,1\n"
                                                "pkg-1.0.dist-info/RECORD,,\n")
    out = wheelhouse.retag(src, "manylinux_2_17_aarch64.manylinux2014_aarch64", tmp_path / "out")
    assert out.name == "pkg-1.0-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
    with zipfile.ZipFile(out) as zf:
        text = zf.read("pkg-1.0.dist-info/WHEEL")
        record = zf.read("pkg-1.0.dist-info/RECORD").decode().splitlines()
        assert zf.read("pkg/__init__.py") == b""
    assert email.parser.BytesParser().parsebytes(text).get_all("Tag") == [
        "cp311-cp311-manylinux_2_17_aarch64", "cp311-cp311-manylinux2014_aarch64"]
    digest = base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=").decode()
    assert f"pkg-1.0.dist-info/WHEEL,sha256={digest},{len(text)}" in record
    assert "pkg/__init__.py,sha256=x,0" in record


def test_a_package_left_out_on_purpose_is_not_resolved_and_the_lock_lacks_it(links, tmp_path):
    """eng requires cv; with cv left out (named, with the reason) the set resolves and installs without it."""
    (links / "cv-4.0-cp37-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl").unlink()
    with pytest.raises(UsageError, match="no set of wheels satisfies"):
        wheelhouse.build_set(_set(links), tmp_path / "out", tmp_path / "cache")
    pipset = _set(links, leave_out=[{"name": "cv", "reason": "an sdist with C++ extensions, used by nothing here"}])
    wheelhouse.build_set(pipset, tmp_path / "out", tmp_path / "cache")
    lock = (tmp_path / "out/wheels/eng-1.0/requirements.lock").read_text()
    assert "cv" not in lock and "kern==1.0" in lock
    with pytest.raises(UsageError, match=r"leave_out cv is also a requirement \(cv==4\.0\)"):
        _set(links, requirements=["eng==1.0", "cv==4.0"], leave_out=[{"name": "cv", "reason": "r"}])
    with pytest.raises(UsageError, match="needs name and reason"):
        _set(links, leave_out=[{"name": "cv"}])
