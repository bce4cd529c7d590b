"""Installers run from a checked root-only copy (module_utils/installer_copy.py), on real files: the copy is
hashed against the verified manifest and is what the caller runs; a mismatch, an unlisted, missing or linked
file, a manifest that is not the verified one, a zip member that is not the manifest's, or a bundle another
account can write is refused before anything is left to run; check mode writes nothing; the copies go away."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import installer_copy

from atlasctl.bundle import write_manifest
from atlasctl.paths import suite_root

CopyError = installer_copy.CopyError
TOOLKIT, KERNELS = "cann/toolkit_1.0.run", "cann/kernels_1.0.zip"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the copies are root's")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    (root / "cann").mkdir(parents=True)
    (root / TOOLKIT).write_text("#!/bin/sh\necho toolkit\n")
    with zipfile.ZipFile(root / KERNELS, "w") as archive:
        archive.writestr("kernels_1.0.run", "#!/bin/sh\necho kernels\n")
    write_manifest(root, "t")  # records the zip's member too
    return root


def copy(bundle: Path, dest: Path, files=(TOOLKIT, KERNELS), verified: str | None = None, check: bool = False):
    manifest = bundle / "manifest.json"
    return installer_copy.copy_checked(str(bundle), list(files), str(dest), str(manifest),
                                       sha256(manifest.read_bytes()) if verified is None else verified, check=check)


def test_copies_are_checked_root_only_and_run_from_there(bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "var/lib/atlas/cann"
    copies, changed = copy(bundle, dest)
    assert changed
    toolkit, kernels = copies
    assert toolkit.copy == toolkit.run == str(dest / "toolkit_1.0.run")
    assert toolkit.sha256 == sha256((bundle / TOOLKIT).read_bytes())
    assert kernels.run == str(dest / "kernels_1.0" / "kernels_1.0.run")
    assert Path(kernels.run).read_text() == "#!/bin/sh\necho kernels\n"
    st = dest.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o700)
    assert Path(toolkit.copy).stat().st_mode & 0o7777 == 0o700
    # the bundle's file is swapped after the check: what runs is the copy that was checked
    (bundle / TOOLKIT).write_text("#!/bin/sh\necho swapped\n")
    assert subprocess.run(["bash", toolkit.run], capture_output=True, text=True).stdout == "toolkit\n"
    removed = installer_copy.remove_copies([TOOLKIT, KERNELS], str(dest))
    assert sorted(removed) == sorted([toolkit.copy, kernels.copy, str(dest / "kernels_1.0")])
    assert list(dest.iterdir()) == []


def test_a_mismatching_package_refuses_the_set_and_leaves_no_copy(bundle: Path, tmp_path: Path) -> None:
    good = (bundle / TOOLKIT).read_bytes()
    (bundle / TOOLKIT).write_text("#!/bin/sh\necho tampered\n")
    dest = tmp_path / "work"
    with pytest.raises(CopyError) as refused:
        copy(bundle, dest)
    message = str(refused.value)
    assert message.startswith("Refused before any installer ran: ")
    assert f"{bundle / TOOLKIT}: sha256 {sha256((bundle / TOOLKIT).read_bytes())} of its copy" in message
    assert f"does not match the manifest's {sha256(good)}" in message
    assert message.endswith("Rebuild or copy the bundle again (atlasctl bundle build / bundle push)")
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize(("damage", "said"), [
    ("unlisted", "no entry for cann/extra.run in"),
    ("missing", "missing from the bundle"),
    ("link", "a symbolic link (a bundle holds none)"),
])
def test_unlisted_missing_and_linked_files_are_refused(bundle: Path, tmp_path: Path, damage: str, said: str) -> None:
    files = [TOOLKIT]
    if damage == "unlisted":
        (bundle / "cann/extra.run").write_text("x")
        files.append("cann/extra.run")
    elif damage == "missing":
        (bundle / TOOLKIT).unlink()
    else:
        target = tmp_path / "elsewhere.run"
        target.write_bytes((bundle / TOOLKIT).read_bytes())
        (bundle / TOOLKIT).unlink()
        (bundle / TOOLKIT).symlink_to(target)
    with pytest.raises(CopyError, match=re.escape(said)):
        copy(bundle, tmp_path / "work", files)
    assert not any((tmp_path / "work").iterdir())


def test_a_manifest_that_is_not_the_verified_one_copies_nothing(bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(CopyError, match="is not the manifest whose signature was verified.*Nothing was copied or run"):
        copy(bundle, tmp_path / "work", verified="0" * 64)
    with pytest.raises(CopyError, match="signature was not verified in this run"):
        copy(bundle, tmp_path / "work", verified="")
    assert not (tmp_path / "work").exists()


def test_a_zip_member_is_checked_against_the_manifest_record(bundle: Path, tmp_path: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["path"] == KERNELS)
    entry["members"][0]["sha256"] = "1" * 64
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    dest = tmp_path / "work"
    with pytest.raises(CopyError, match=f"{KERNELS}!kernels_1.0.run: sha256 [0-9a-f]{{64}} of the unpacked copy "
                                        f"does not match the manifest's record of the member 1111"):
        copy(bundle, dest)
    assert list(dest.iterdir()) == []


def test_a_file_planted_in_the_work_directory_is_replaced(bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "work"
    (dest / "kernels_1.0").mkdir(parents=True)
    (dest / "kernels_1.0" / "kernels_1.0.run").write_text("#!/bin/sh\necho planted\n")
    (dest / "toolkit_1.0.run").symlink_to("/etc/shadow")
    copies, _ = copy(bundle, dest)
    assert [Path(c.run).read_text().split()[-1] for c in copies] == ["toolkit", "kernels"]
    assert not Path(copies[0].run).is_symlink() and Path("/etc/shadow").exists()


def test_the_work_directory_is_made_root_only_and_must_sit_in_root_only_directories(bundle: Path,
                                                                                     tmp_path: Path) -> None:
    dest = tmp_path / "work"
    dest.mkdir(mode=0o777)
    os.chown(dest, 65534, 65534)
    copy(bundle, dest)
    st = dest.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CopyError, match=f"installer directory {shared / 'work'}: .*{shared}: .*writable by others"):
        copy(bundle, shared / "work")


def test_a_bundle_directory_another_account_can_write_is_refused(bundle: Path, tmp_path: Path) -> None:
    (bundle / "cann").chmod(0o775)
    with pytest.raises(CopyError, match=f"installer {bundle / TOOLKIT}: .*{bundle / 'cann'}: .*mode 0775: "
                                        "writable by its group.*Copy the bundle as root"):
        copy(bundle, tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_check_mode_writes_nothing_and_still_refuses(bundle: Path, tmp_path: Path) -> None:
    dest = tmp_path / "work"
    copies, changed = copy(bundle, dest, check=True)
    assert not changed and not dest.exists()
    assert [(c.copy, c.run) for c in copies] == [("", ""), ("", "")]
    (bundle / TOOLKIT).write_text("tampered")
    with pytest.raises(CopyError, match="does not match the manifest's"):
        copy(bundle, dest, check=True)


def test_the_module_copies_and_removes(bundle: Path, tmp_path: Path) -> None:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(suite_root() / "collections"),
               ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    dest = tmp_path / "work"

    def module(args: dict) -> tuple[int, dict]:
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "localhost", "-o", "-m",
                               "atlas.serving.installer_copy", "-a", json.dumps(args)],
                              env=env, capture_output=True, text=True, timeout=120)
        return proc.returncode, json.loads(proc.stdout.split("=>", 1)[1])

    verified = sha256((bundle / "manifest.json").read_bytes())
    rc, result = module({"bundle_dir": str(bundle), "files": [TOOLKIT], "dest": str(dest),
                         "manifest_sha256": verified})
    assert rc == 0 and result["changed"] and result["files"][0]["run"] == str(dest / "toolkit_1.0.run")
    rc, result = module({"files": [TOOLKIT], "dest": str(dest), "state": "absent"})
    assert rc == 0 and result["removed"] == [str(dest / "toolkit_1.0.run")]
    rc, result = module({"files": [TOOLKIT], "dest": str(dest), "state": "absent"})
    assert rc == 0 and not result["changed"]
