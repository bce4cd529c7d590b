"""Checksum list formats: md5sum/sha256sum output (module_utils/manifest.py) and manifest.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import manifest

MD5_A = "0cc175b9c0f1b6a831c399e269772661"
MD5_B = "92eb5ffee6ae2fec3ad71c777531578f"
SHA_A = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (f"{MD5_A}  model-00001.safetensors", "model-00001.safetensors"),
        (f"{MD5_A} *model-00001.safetensors", "model-00001.safetensors"),
        (f"{MD5_A}  ./sub/dir/file.bin", "sub/dir/file.bin"),
        (f"{MD5_A}  name with  spaces.bin", "name with  spaces.bin"),
        (f"\\{MD5_A}  back\\\\slash.bin", "back\\slash.bin"),
        (f"\\{MD5_A} *new\\nline.bin", "new\nline.bin"),
        (f"MD5 (tagged file.bin) = {MD5_A}", "tagged file.bin"),
        (f"{MD5_A.upper()}  upper.bin", "upper.bin"),
        (f"{MD5_A} single-space.bin", "single-space.bin"),
    ],
)
def test_md5sum_lines(line: str, name: str) -> None:
    assert manifest.parse_sums(line + "\n", "md5") == {name: MD5_A}


def test_comments_blank_lines_and_crlf() -> None:
    text = f"# vendor list\r\n\r\n{MD5_A}  a.bin\r\n{MD5_B} *b.bin\r\n"
    assert manifest.parse_sums(text, "md5") == {"a.bin": MD5_A, "b.bin": MD5_B}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (f"{MD5_A[:-1]}  short.bin", "not an 'md5sum' line|not 32 hex"),
        (f"{MD5_A}  /etc/passwd", "absolute path"),
        (f"{MD5_A}  ../../etc/passwd", "outside the root"),
        (f"{MD5_A}  a.bin\n{MD5_B}  a.bin", "listed twice"),
        (f"\\{MD5_A}  bad\\qescape", "bad escape"),
        (f"SHA256 (x) = {SHA_A}", "SHA256 line in a md5 list"),
        ("zz" * 16 + "  x", "not 32 hex"),
    ],
)
def test_bad_sums_lines_name_the_line(text: str, error: str) -> None:
    with pytest.raises(manifest.ManifestError, match=error) as info:
        manifest.parse_sums(text, "md5", source="md5sums.txt")
    assert "md5sums.txt:" in str(info.value)


def test_render_round_trips_through_coreutils(tmp_path: Path) -> None:
    """Our rendering is what md5sum writes, and what md5sum -c accepts, including escaped names."""
    names = ["plain.bin", "with space.bin", "back\\slash.bin", "sub/nested.bin"]
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())
    coreutils = subprocess.run(
        ["md5sum", "--", *sorted(names)], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    parsed = manifest.parse_sums(coreutils, "md5")
    assert sorted(parsed) == sorted(names)
    rendered = manifest.render_sums(list(parsed.items()))
    assert rendered == coreutils
    (tmp_path / "list.md5").write_text(rendered)
    subprocess.run(["md5sum", "--check", "--quiet", "list.md5"], cwd=tmp_path, check=True)


def test_guess_algorithm_from_name_then_length(tmp_path: Path) -> None:
    assert manifest.guess_algorithm("SHA256SUMS", "") == "sha256"
    assert manifest.guess_algorithm("x/md5sums.txt", "") == "md5"
    assert manifest.guess_algorithm("CHECKSUMS", f"{SHA_A}  a\n") == "sha256"
    assert manifest.guess_algorithm("CHECKSUMS", f"# c\n{MD5_A}  a\n") == "md5"
    with pytest.raises(manifest.ManifestError, match="cannot tell"):
        manifest.guess_algorithm("CHECKSUMS", "abc  a\n")


def _bundle_manifest() -> dict:
    return {
        "format": 1,
        "name": "bundle",
        "files": [
            {"path": "cann/toolkit.run", "size": 1, "sha256": SHA_A, "md5": MD5_A, "kind": "cann"},
            {"path": "models/qwen/model.safetensors", "size": 1, "sha256": SHA_A, "md5": MD5_A},
            {"path": "models/qwen/config.json", "size": 2, "sha256": "sha256:" + SHA_A.upper(), "md5": None},
            {"path": "models/qwen-other/x.bin", "size": 1, "sha256": SHA_A},
        ],
    }


@pytest.mark.parametrize("prefix", ["models/qwen", "models/qwen/", "/models/qwen/"])
def test_manifest_prefix_selects_and_strips(prefix: str) -> None:
    got = manifest.parse_manifest(_bundle_manifest(), prefix=prefix)
    assert sorted(got) == ["config.json", "model.safetensors"]
    assert got["config.json"] == manifest.Expected("config.json", 2, None, SHA_A)
    assert got["model.safetensors"].md5 == MD5_A


def test_manifest_without_prefix_keeps_all() -> None:
    assert len(manifest.parse_manifest(_bundle_manifest())) == 4


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ([], "not a manifest"),
        ({"files": [{"size": 1}]}, "needs a 'path'"),
        ({"files": [{"path": "a", "size": -1, "md5": MD5_A}]}, "non-negative"),
        ({"files": [{"path": "a"}]}, "no md5 or sha256"),
        ({"files": [{"path": "a", "md5": SHA_A}]}, "not 32 hex"),
        ({"files": [{"path": "a", "sha256": "md5:" + MD5_A}]}, "labelled 'md5'"),
        ({"files": [{"path": "x/a", "md5": MD5_A}]}, "no files under prefix"),
    ],
)
def test_bad_manifests(doc, error: str) -> None:
    with pytest.raises(manifest.ManifestError, match=error):
        manifest.parse_manifest(doc, prefix="models/qwen" if "prefix" in error else "")


def test_load_expected_merges_sums_and_manifest(tmp_path: Path) -> None:
    (tmp_path / "md5sums.txt").write_text(f"{MD5_A}  model.safetensors\n{MD5_B} *extra-in-md5.bin\n")
    (tmp_path / "sha256sums.txt").write_text(f"{SHA_A}  model.safetensors\n")
    (tmp_path / "manifest.json").write_text(json.dumps(_bundle_manifest()))
    got = manifest.load_expected(
        [str(tmp_path / "manifest.json"), str(tmp_path / "md5sums.txt"), str(tmp_path / "sha256sums.txt")],
        prefix="models/qwen",
    )
    assert got["model.safetensors"] == manifest.Expected("model.safetensors", 1, MD5_A, SHA_A)
    assert got["extra-in-md5.bin"] == manifest.Expected("extra-in-md5.bin", None, MD5_B, None)


def test_sources_that_disagree_fail(tmp_path: Path) -> None:
    (tmp_path / "md5sums.txt").write_text(f"{MD5_B}  model.safetensors\n")
    (tmp_path / "manifest.json").write_text(json.dumps(_bundle_manifest()))
    with pytest.raises(manifest.ManifestError, match="disagree on md5"):
        manifest.load_expected([str(tmp_path / "manifest.json"), str(tmp_path / "md5sums.txt")], "models/qwen")


def test_missing_list_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(manifest.ManifestError, match="nope.txt: checksum file not found"):
        manifest.load_expected([str(tmp_path / "nope.txt")])
