"""Room for a model version before staging: what must be written, against the free space; where the bundle is on
the models filesystem the version is hard-linked from it (one copy per node) and costs nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import model_space as space
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ManifestError

MIB = 1024 * 1024


def manifest(tmp_path: Path, files: dict[str, int]) -> Path:
    """A bundle with models/m/<files> (sparse files of those sizes) and its manifest."""
    entries = [{"path": f"models/m/{name}", "size": size, "sha256": "0" * 64} for name, size in files.items()]
    entries.append({"path": "cann/other.run", "size": 10**12, "sha256": "1" * 64})  # another model's / package
    for name, size in files.items():
        src = tmp_path / "models/m" / name
        src.parent.mkdir(parents=True, exist_ok=True)
        with open(src, "wb") as fh:
            fh.truncate(size)
        os.utime(src, (1_700_000_000, 1_700_000_000))
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"format": 1, "files": entries}))
    return path


def copy_of(tmp_path: Path, directory: Path, name: str, *, mtime: int = 1_700_000_000) -> None:
    """What rsync --times leaves: the bundle file's size and modification time (sparse here)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "wb") as fh:
        fh.truncate((tmp_path / "models/m" / name).stat().st_size)
    os.utime(directory / name, (mtime, mtime))


def test_a_model_that_does_not_fit_is_refused_naming_path_need_and_free(tmp_path: Path) -> None:
    m = manifest(tmp_path, {"a.safetensors": 600 * MIB, "b.safetensors": 600 * MIB})
    version = tmp_path / "node/versions/v2"
    result = space.check(str(m), "m", str(version), None, 64 * MIB, free=lambda p: 1000 * MIB, link=False)
    assert result["ok"] is False
    assert result["need_bytes"] == 1200 * MIB and result["filesystem_of"] == str(tmp_path)
    msg = result["message"]
    assert f"no room to stage model m in {version}" in msg
    assert "it needs 1.2 GiB (plus 64.0 MiB headroom" in msg and "has 1000.0 MiB free" in msg


def test_files_current_already_holds_are_hard_linked_not_counted(tmp_path: Path) -> None:
    m = manifest(tmp_path, {"a.safetensors": 600 * MIB, "config.json": 100})
    current = tmp_path / "node/versions/v1"
    copy_of(tmp_path, current, "a.safetensors")
    result = space.check(str(m), "m", str(tmp_path / "node/versions/v2"), str(current), 0, free=lambda p: 1000,
                         link=False)
    assert (result["ok"], result["need_bytes"], result["model_bytes"]) == (True, 100, 600 * MIB + 100)


def test_a_new_shard_of_the_same_size_is_copied_and_counted(tmp_path: Path) -> None:
    """The disk-full drill: new weights, same size: rsync's quick check (size + mtime) copies it."""
    m = manifest(tmp_path, {"a.safetensors": 600 * MIB})
    current = tmp_path / "node/versions/v1"
    copy_of(tmp_path, current, "a.safetensors", mtime=1_600_000_000)
    result = space.check(str(m), "m", str(tmp_path / "node/versions/v2"), str(current), 0, free=lambda p: MIB,
                         link=False)
    assert (result["ok"], result["need_bytes"]) == (False, 600 * MIB)


def test_a_rerun_keeps_what_the_version_directory_has(tmp_path: Path) -> None:
    m = manifest(tmp_path, {"a.safetensors": 10})
    version = tmp_path / "node/v"
    copy_of(tmp_path, version, "a.safetensors")
    assert space.check(str(m), "m", str(version), None, 10**15, free=lambda p: 0)["ok"] is True


def test_a_symlink_of_the_right_size_is_not_a_copy(tmp_path: Path) -> None:
    m = manifest(tmp_path, {"a.safetensors": 10})
    version = tmp_path / "node/v"
    version.mkdir(parents=True)
    (version / "a.safetensors").symlink_to(tmp_path / "models/m/a.safetensors")
    assert space.check(str(m), "m", str(version), None, 0, free=lambda p: 0, link=False)["need_bytes"] == 10


def test_the_real_free_space_is_measured(tmp_path: Path) -> None:
    m = manifest(tmp_path, {"a.safetensors": 10})
    result = space.check(str(m), "m", str(tmp_path / "node/not/yet/there"), None, 0)
    assert result["free_bytes"] > 0 and result["ok"] is True


def test_a_manifest_without_the_model_is_a_clear_error(tmp_path: Path) -> None:
    m = manifest(tmp_path, {"a": 1})
    with pytest.raises(ManifestError, match="no files under prefix 'models/other'"):
        space.check(str(m), "other", str(tmp_path / "v"), None, 0)


def test_a_bundle_on_the_models_filesystem_is_hard_linked_and_costs_nothing(tmp_path: Path) -> None:
    """One copy per node: the bundle and the version on one mount (here both under tmp_path)."""
    m = manifest(tmp_path, {"a.safetensors": 600 * MIB, "config.json": 100})
    os.chmod(tmp_path / "models/m/a.safetensors", 0o644)
    os.chmod(tmp_path / "models/m/config.json", 0o600)  # a mode the version cannot keep: copied
    result = space.check(str(m), "m", str(tmp_path / "node/versions/v2"), None, 0, free=lambda p: 1000)
    assert result["same_filesystem"] is True
    assert (result["ok"], result["need_bytes"], result["linked_bytes"]) == (True, 100, 600 * MIB)
    assert "do not have mode 0644" in result["note"]


def test_a_bundle_on_another_filesystem_is_a_second_copy_and_the_check_says_so(tmp_path: Path) -> None:
    m = manifest(tmp_path, {"a.safetensors": 600 * MIB})
    result = space.check(str(m), "m", str(tmp_path / "node/versions/v2"), None, 0, free=lambda p: 10**12, link=False)
    assert (result["ok"], result["need_bytes"], result["linked_bytes"]) == (True, 600 * MIB, 0)
    assert "second copy of 600.0 MiB" in result["note"] and "atlasctl bundle push --dest" in result["note"]


def test_a_filesystem_mounted_twice_is_two_mounts_for_a_hard_link(tmp_path: Path, monkeypatch) -> None:
    """link(2) fails across mount points even of one filesystem (a bind mount, as the lab's bundle share)."""
    assert space.same_mount(str(tmp_path / "a"), str(tmp_path / "b/c")) is True
    points = {str(tmp_path / "share"): str(tmp_path / "share"), str(tmp_path / "node"): "/"}
    monkeypatch.setattr(space, "mount_point",
                        lambda path: next((v for k, v in points.items() if path.startswith(k)), "/"))
    (tmp_path / "share").mkdir()
    assert space.same_mount(str(tmp_path / "share"), str(tmp_path / "node/v")) is False
