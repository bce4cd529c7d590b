"""A wheelhouse's lock with each wheel's sha256 from the verified manifest (module_utils/wheel_hashes.py, the filter
wheel_requirements), and pip's hash-checking mode on it for real: the lab's metadata-only vllm wheel and a pin per
target platform with its marker install; a wheel whose bytes are not the manifest's is refused by pip."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import wheel_hashes

from atlaslab.doubles.wheelhouse import VLLM_SHIM, MetadataShim, build_metadata_wheel

LockError = wheel_hashes.LockError
A, B, C = "a" * 64, "b" * 64, "c" * 64


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_each_pin_gets_the_hash_of_every_wheel_of_it():
    lock = (b"torch==2.7.1+cpu ; platform_machine == \"x86_64\"\n# a comment\n\n"
            b"Torch_NPU==2.7.1\nvllm==0.32.0+cpu\n")
    wheels = {"torch-2.7.1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl": A,
              "torch_npu-2.7.1-cp311-cp311-manylinux_2_28_aarch64.whl": B,
              "torch_npu-2.7.1-cp311-cp311-manylinux_2_28_x86_64.whl": C,
              "vllm-0.32.0+cpu-py3-none-any.whl": A}
    assert wheel_hashes.hashed_requirements(lock, sha256(lock), wheels, "r.lock").splitlines() == [
        f'torch==2.7.1+cpu ; platform_machine == "x86_64" --hash=sha256:{A}',
        f"Torch_NPU==2.7.1 --hash=sha256:{B} --hash=sha256:{C}",
        f"vllm==0.32.0+cpu --hash=sha256:{A}",
    ]


@pytest.mark.parametrize(("lock", "verified", "wheels", "said"), [
    (b"a==1\n", "0" * 64, {"a-1-py3-none-any.whl": A}, "r.lock: sha256 [0-9a-f]{64} is not the manifest's 0000"),
    (b"a==1\n", "", {"a-1-py3-none-any.whl": A}, "is not the manifest's [(]none[)]"),
    (b"a==1\nb==2\n", None, {"a-1-py3-none-any.whl": A}, "r.lock line 2: no wheel of b==2 in the wheelhouse"),
    (b"a>=1\n", None, {"a-1-py3-none-any.whl": A}, "r.lock line 1: 'a>=1' is not a pin"),
    (b"a==1\n", None, {"a-1-py3-none-any.whl": A, "notes.whl": B}, "notes.whl in the wheelhouse is not a wheel"),
    (b"# nothing\n", None, {}, "r.lock: pins nothing"),
])
def test_a_lock_that_cannot_be_installed_with_hashes_is_refused(lock, verified, wheels, said):
    with pytest.raises(LockError, match=said):
        wheel_hashes.hashed_requirements(lock, sha256(lock) if verified is None else verified, wheels, "r.lock")


def test_the_filter_reads_model_verify_files_and_a_slurp():
    from ansible_collections.atlas.serving.plugins.filter import engines

    lock = b"a==1\n"
    files = [{"path": "requirements.lock", "expected": {"sha256": sha256(lock)}},
             {"path": "a-1-py3-none-any.whl", "expected": {"sha256": A}}, {"path": "requirements.txt"}]
    text = engines.wheel_requirements(base64.b64encode(lock).decode(), files, "r.lock")
    assert text == f"a==1 --hash=sha256:{A}\n"
    with pytest.raises(AnsibleFilterError, match="is not the manifest's"):
        engines.wheel_requirements(base64.b64encode(b"a==2\n").decode(), files, "r.lock")


def _pip(requirements: Path, house: Path, target: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--require-hashes",
                           "--no-cache-dir", "--disable-pip-version-check", "--target", str(target),
                           "--find-links", str(house), "--requirement", str(requirements)],
                          capture_output=True, text=True, timeout=300)


def test_pip_installs_the_hashed_lock_and_refuses_a_wheel_that_is_not_the_manifests(tmp_path: Path):
    house = tmp_path / "wheels"
    shim = build_metadata_wheel(house, VLLM_SHIM)  # the lab's vllm-0.32.0+cpu, metadata only
    engine = build_metadata_wheel(house, MetadataShim("tiny-engine", "1.0", "an engine"))
    lock = b'vllm==0.32.0+cpu\ntiny-engine==1.0\nabsent==1.0 ; platform_machine == "s390x"\n'
    wheels = {w.name: sha256(w.read_bytes()) for w in (shim, engine)}
    wheels["absent-1.0-py3-none-any.whl"] = C  # another target's wheel: its marker keeps pip from it
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(wheel_hashes.hashed_requirements(lock, sha256(lock), wheels, "r.lock"))
    good = _pip(requirements, house, tmp_path / "good")
    assert good.returncode == 0, good.stdout + good.stderr
    assert (tmp_path / "good/vllm-0.32.0+cpu.dist-info/METADATA").is_file()
    # the same name and version, other bytes: what an account that can write the bundle would put there
    build_metadata_wheel(house, MetadataShim("tiny-engine", "1.0", "not the checked one"))
    bad = _pip(requirements, house, tmp_path / "bad")
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").glob("tiny_engine*"))
