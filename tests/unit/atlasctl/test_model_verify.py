"""atlas.serving.model_verify run for real through `ansible -m` against localhost, and `atlasctl models`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import checksums

from atlasctl import bundle
from atlasctl.cli import main as atlasctl_main
from atlasctl.paths import suite_root

VENV_BIN = Path(sys.executable).parent
ANSIBLE = VENV_BIN / "ansible"


def _model(root: Path) -> Path:
    root.mkdir()
    for i, size in enumerate((1_500_000, 900_001, 333), start=1):
        (root / f"model-{i:05d}-of-00003.safetensors").write_bytes(os.urandom(size))
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    assert atlasctl_main(["models", "manifest", str(root)]) == 0
    time.sleep(checksums.RACY_MARGIN_NS / 1e9 + 0.05)
    return root


def _ansible(args: str, *extra: str, check: bool = False) -> tuple[int, dict]:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(suite_root() / "collections"),
               ANSIBLE_LOCALHOST_WARNING="False")
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    cmd = [str(ANSIBLE), "localhost", "-o", "-m", "atlas.serving.model_verify", "-a", args, *extra]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("localhost |")), None)
    assert line is not None, f"no result line\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
    return proc.returncode, json.loads(line.split("=>", 1)[1])


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_module_twice_second_run_unchanged(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    args = f"path={root} checksum_files={root}/md5sums.txt,{root}/sha256sums.txt"
    rc, first = _ansible(args)
    assert rc == 0 and first["changed"] is True and first["ok"] is True, first
    assert first["totals"]["bytes_read"] > 0 and first["totals"]["extra"] == 0
    rc, second = _ansible(args)
    assert rc == 0 and second["changed"] is False, second
    assert second["totals"]["bytes_read"] == 0
    assert second["totals"]["from_stamps"] == 4


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_module_check_mode_writes_no_stamp(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    stamp = tmp_path / "stamps" / "m.json"
    rc, result = _ansible(f"path={root} stamp_file={stamp}", check=True)
    assert rc == 0 and result["changed"] is True and result["stamps_written"] is False, result
    assert not stamp.exists() and not stamp.parent.exists()


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_module_fails_naming_the_file_and_both_digests(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    shard = root / "model-00002-of-00003.safetensors"
    st = shard.stat()
    with open(shard, "r+b") as handle:
        handle.seek(123_456)
        old = handle.read(1)
        handle.seek(123_456)
        handle.write(bytes([old[0] ^ 0xFF]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    (root / "stray.txt").write_text("x")
    rc, result = _ansible(f"path={root} manifest={root}/sha256sums.txt")
    assert rc != 0 and result["ok"] is False
    expected_sha = next(ln.split()[0] for ln in (root / "sha256sums.txt").read_text().splitlines() if shard.name in ln)
    import hashlib

    actual_sha = hashlib.sha256(shard.read_bytes()).hexdigest()
    assert shard.name in result["msg"] and expected_sha in result["msg"] and actual_sha in result["msg"]
    assert "stray.txt" in result["msg"]
    statuses = {f["path"]: f["status"] for f in result["files"]}
    assert statuses[shard.name] == "mismatch" and statuses["stray.txt"] == "extra"


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_module_bad_manifest_fails_with_the_path(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    bad = tmp_path / "manifest.json"
    bad.write_text('{"files": [{"path": "/abs", "md5": "x"}]}')
    rc, result = _ansible(f"path={root} manifest={bad}")
    assert rc != 0 and str(bad) in result["msg"] and "absolute path" in result["msg"]


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_module_refuses_a_manifest_that_is_not_the_verified_one(tmp_path: Path) -> None:
    """manifest_sha256: the manifest's bytes as the module reads them must be the verified ones
    (what the engines and models stages pass: atlas_bundle_manifest_sha256)."""
    root = _model(tmp_path / "m")
    bundle.write_manifest(root, "t")
    manifest = root / "manifest.json"
    verified = hashlib.sha256(manifest.read_bytes()).hexdigest()
    args = {"path": str(root), "manifest": str(manifest), "stamps": False}
    rc, result = _ansible(json.dumps(args | {"manifest_sha256": verified}))
    assert rc == 0 and result["ok"] and result["totals"]["ok"] == result["totals"]["files"] > 0, result
    rc, result = _ansible(json.dumps(args | {"manifest_sha256": "0" * 64}))
    assert rc != 0 and "is not the manifest whose signature was verified" in result["msg"], result
    assert str(manifest) in result["msg"] and "files" not in result, "nothing was verified against it"
    rc, result = _ansible(json.dumps(args | {"manifest_sha256": ""}))
    assert rc != 0 and "signature was not verified in this run" in result["msg"], result
    rc, result = _ansible(json.dumps({"path": str(root), "checksum_files": [str(root / "md5sums.txt")],
                                      "manifest_sha256": verified}))
    assert rc != 0 and "manifest_sha256 is set but manifest is not" in result["msg"], result


# --- atlasctl models -------------------------------------------------------------------------


def test_cli_manifest_json_then_verify_json(tmp_path: Path, capsys) -> None:
    root = _model(tmp_path / "m")
    out = tmp_path / "bundle-manifest.json"
    assert (
        atlasctl_main(["models", "manifest", str(root), "--format", "json", "--out", str(out), "--prefix", "models/m"])
        == 0
    )
    doc = json.loads(out.read_text())
    assert {f["path"] for f in doc["files"]} == {
        "models/m/config.json",
        *(f"models/m/model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)),
    }
    capsys.readouterr()
    code = atlasctl_main(
        ["models", "verify", str(root), "--manifest", str(out), "--prefix", "models/m", "--json", "--allow-extra"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["failed"] is False
    # md5sums.txt/sha256sums.txt in the dir are not in this manifest: extra, tolerated
    assert sorted(f["path"] for f in report["files"] if f["status"] == "extra") == ["md5sums.txt", "sha256sums.txt"]


def test_cli_verify_exit_codes(tmp_path: Path, capsys) -> None:
    root = _model(tmp_path / "m")
    assert atlasctl_main(["models", "verify", str(root)]) == 0
    assert atlasctl_main(["models", "verify", str(root), "--check"]) == 0
    (root / "config.json").unlink()
    assert atlasctl_main(["models", "verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert "MISSING" in out and "config.json" in out
    assert atlasctl_main(["models", "verify", str(tmp_path / "empty-dir-missing")]) == 2


def test_cli_check_writes_no_stamp(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    assert atlasctl_main(["models", "verify", str(root), "--check"]) == 0
    assert not (root / checksums.STAMP_FILE_NAME).exists()
    assert atlasctl_main(["models", "verify", str(root)]) == 0
    assert (root / checksums.STAMP_FILE_NAME).exists()


def test_cli_sums_match_coreutils(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    for tool, name in (("md5sum", "md5sums.txt"), ("sha256sum", "sha256sums.txt")):
        subprocess.run([tool, "--check", "--quiet", name], cwd=root, check=True)
        files = sorted(p.name for p in root.iterdir() if p.name not in ("md5sums.txt", "sha256sums.txt"))
        ours = (root / name).read_text()
        theirs = subprocess.run([tool, *files], cwd=root, capture_output=True, text=True, check=True).stdout
        assert ours == theirs


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_bundle_verify_and_the_node_verifier_give_the_same_verdicts(tmp_path: Path) -> None:
    """One verifier: `atlasctl bundle verify` here and what `bundle push` runs on each node
    (model_verify with bundle_push.node_verify_args) name the same files with the same problems."""
    from atlasctl import bundle_push

    root = tmp_path / "b"
    (root / "cann").mkdir(parents=True)
    (root / "models" / "m").mkdir(parents=True)
    files = {"cann/a.run": os.urandom(5000), "cann/b.run": b"#!/bin/sh\n", "models/m/config.json": b"{}",
             "models/m/w.bin": os.urandom(3000), "models/m/gone.bin": b"x", ".dot": b"listed too"}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    bundle.write_manifest(root, "t")
    flipped = bytearray(files["cann/a.run"])
    flipped[10] ^= 1
    (root / "cann/a.run").write_bytes(bytes(flipped))  # same size: sha256 (and md5)
    (root / "models/m/w.bin").write_bytes(b"short")  # size
    (root / "models/m/gone.bin").unlink()  # missing
    (root / "models/m/extra.bin").write_bytes(b"x")  # unexpected
    (root / ".extra-dot").write_bytes(b"x")  # unexpected, a dot-file too
    (root / "cann/b.run").unlink()
    (root / "cann/b.run").symlink_to(root / "models/m/config.json")  # listed, now a link: refused
    (root / "models/link").symlink_to(root / "models/m")  # a linked directory: refused, never walked
    here = {b.path: b.problem for b in bundle.verify_bundle(root)}
    assert here == {"cann/a.run": "sha256", "models/m/w.bin": "size", "models/m/gone.bin": "missing",
                    "models/m/extra.bin": "unexpected", ".extra-dot": "unexpected", "cann/b.run": "symlink",
                    "models/link": "symlink"}
    rc, result = _ansible(bundle_push.node_verify_args(str(root)))
    assert rc != 0 and result["ok"] is False, result
    fields = ("path", "status", "source", "expected", "actual", "mismatched", "message")
    node = [checksums.FileResult(**{k: tuple(f[k]) if k == "mismatched" else f[k] for k in fields})
            for f in result["files"]]
    assert {r.path: r.problem for r in node if r.problem} == here


def test_files_verifies_only_those_and_refuses_an_unlisted_name(tmp_path: Path) -> None:
    """`files`: one image archive of a bundle's images/ is read; the other listed archives are neither read nor
    reported; a damaged one of them does not matter; a file outside the lists is still an extra file."""
    from ansible_collections.atlas.serving.plugins.module_utils import tree_check as tree

    root = _model(tmp_path / "m")
    wanted, other = "model-00003-of-00003.safetensors", "model-00001-of-00003.safetensors"
    (root / other).write_bytes(b"damaged")
    sums = [str(root / "sha256sums.txt"), str(root / "md5sums.txt")]
    report, _ = tree.check_tree(str(root), checksum_files=sums, files=[wanted], stamps=False)
    assert [r.path for r in report.results] == [wanted] and not report.failed
    assert report.bytes_read == (root / wanted).stat().st_size
    full, _ = tree.check_tree(str(root), checksum_files=sums, stamps=False)
    assert full.failed, "without files the damaged one fails: the test can fail"
    with pytest.raises(checksums.VerifyError, match="absent.bin: not listed in .*sha256sums.txt"):
        tree.check_tree(str(root), checksum_files=sums, files=["absent.bin"], stamps=False)
    (root / "stray.bin").write_bytes(b"x")
    stray, _ = tree.check_tree(str(root), checksum_files=sums, files=[wanted], stamps=False)
    assert stray.failed and "stray.bin" in [r.path for r in stray.results]
