"""Paths atlasctl reads and writes (module_utils/paths.py): a tree read as its own holds regular files with no
name elsewhere and is reached with no symbolic link on the way; a stamp file is its user's or root's alone; an
output directory is reached with no link on the way. Each refusal: exit status 2, one line naming the input and
the fix, nothing written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import checksums, paths

from atlasctl import cli, exitcodes

PROFILE = "vllm-ascend-0.11.0-mistral-7b-8x64g"


def _model(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    return root


def _sums(path: Path, model: Path) -> Path:
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in sorted(model.iterdir())]
    path.write_text("".join(lines))
    return path


def _refused(capsys, argv: list[str], *says: str) -> str:
    assert cli.main(argv) == exitcodes.USAGE
    out = capsys.readouterr()
    err = out.err
    first, *rest = err.rstrip("\n").split("\n")
    assert first.startswith("atlasctl: error: ") and all(line.startswith("  fix: ") for line in rest), err
    assert "Traceback" not in err
    for text in says:
        assert text in err, err
    return out.out + err


def test_models_manifest_refuses_a_symlink_to_etc_passwd(tmp_path, capsys):
    model = _model(tmp_path / "m")
    (model / "passwd").symlink_to("/etc/passwd")
    digest = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    said = _refused(capsys, ["models", "manifest", str(model), "--format", "json", "--out", "-"],
                    "passwd: a symbolic link", "fix:")
    assert digest not in said
    assert not (model / "md5sums.txt").exists()
    _refused(capsys, ["models", "manifest", str(model)], "passwd: a symbolic link")
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "passwd"]


def test_models_manifest_refuses_a_model_directory_reached_through_a_link(tmp_path, capsys):
    model = _model(tmp_path / "real")
    (tmp_path / "via").symlink_to(model)
    _refused(capsys, ["models", "manifest", str(tmp_path / "via" / ".")], "is a symbolic link")


def test_models_manifest_refuses_an_out_directory_under_a_link(tmp_path, capsys):
    model = _model(tmp_path / "m")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    _refused(capsys, ["models", "manifest", str(model), "--out", str(tmp_path / "link" / "sums")],
             "is a symbolic link")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_models_verify_refuses_a_hard_link_to_a_file_outside_the_model(tmp_path, capsys):
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash\n")
    model = _model(tmp_path / "m")
    os.link(secret, model / "tokenizer.json")
    sums = _sums(tmp_path / "sha256sums.txt", model)  # the list even names the outside file's digest
    said = _refused(capsys, ["models", "verify", str(model), "--manifest", str(sums)],
                    "tokenizer.json: a hard link to a file outside the tree")
    assert hashlib.sha256(secret.read_bytes()).hexdigest() not in said.split("sha256sums")[0]
    assert not (model / checksums.STAMP_FILE_NAME).exists()


def test_models_verify_accepts_two_names_of_one_file_inside_the_model(tmp_path, capsys):
    model = _model(tmp_path / "m")
    os.link(model / "config.json", model / "config-copy.json")
    sums = _sums(tmp_path / "sha256sums.txt", model)
    assert cli.main(["models", "verify", str(model), "--manifest", str(sums)]) == exitcodes.OK


@pytest.mark.parametrize("where", ["/tmp", "/tmp/atlas-stamps-{pid}.json", "{tmp}/group/s.json", "{tmp}/link/s.json"])
def test_models_verify_refuses_stamps_others_can_write(tmp_path, capsys, where):
    model = _model(tmp_path / "m")
    sums = _sums(tmp_path / "sha256sums.txt", model)
    shared = tmp_path / "group"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "private").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "private")
    stamps = where.format(tmp=tmp_path, pid=os.getpid())
    _refused(capsys, ["models", "verify", str(model), "--manifest", str(sums), "--stamps", stamps],
             f"--stamps {stamps}", "refusing a stamp file", "fix: pass --stamps FILE in a directory of your own")
    assert not os.path.exists(stamps) or os.path.isdir(stamps)
    assert list((tmp_path / "private").iterdir()) == []


def test_models_verify_accepts_stamps_in_a_private_directory(tmp_path, capsys):
    model = _model(tmp_path / "m")
    sums = _sums(tmp_path / "sha256sums.txt", model)
    (tmp_path / "private").mkdir(mode=0o700)
    stamps = tmp_path / "private" / "m.json"
    assert cli.main(["models", "verify", str(model), "--manifest", str(sums), "--stamps", str(stamps)]) == 0
    assert "refusing" not in capsys.readouterr().err


def test_config_render_refuses_an_out_whose_parent_is_a_link(tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "parent").symlink_to(tmp_path / "real")
    _refused(capsys, ["config", "render", PROFILE, "--out", str(tmp_path / "parent" / "sub")],
             "parent is a symbolic link", "fix:")
    assert list((tmp_path / "real").iterdir()) == []


def test_config_render_writes_into_a_new_directory_without_links(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    assert cli.main(["config", "render", PROFILE, "--out", str(out)]) == exitcodes.OK
    assert (out / "atlas-serving.args").is_file()


# --- the layer itself -------------------------------------------------------------------------------


def test_open_dir_refuses_a_link_anywhere_on_the_way(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "l").symlink_to(tmp_path / "a")
    os.close(paths.open_dir(str(tmp_path / "a" / "b")))
    for path in (tmp_path / "l", tmp_path / "l" / "b", tmp_path / "l" / "b" / "new"):
        with pytest.raises(paths.UnsafePath, match="is a symbolic link"):
            paths.open_dir(str(path), create=True)
    assert not (tmp_path / "a" / "b" / "new").exists()


def test_open_file_refuses_links_and_hard_links(tmp_path):
    (tmp_path / "f").write_text("x")
    os.close(paths.open_file(str(tmp_path / "f")))
    (tmp_path / "s").symlink_to(tmp_path / "f")
    with pytest.raises(paths.UnsafePath):
        paths.open_file(str(tmp_path / "s"))
    os.link(tmp_path / "f", tmp_path / "h")
    with pytest.raises(paths.UnsafePath, match="hard link"):
        paths.open_file(str(tmp_path / "h"))


def test_a_file_swapped_after_the_check_is_never_reported(tmp_path):
    """The fstat comparison: digests of a file that is not the one tree_files saw are refused, not returned."""
    model = _model(tmp_path / "m")
    (model / "w.bin").write_bytes(b"weights")
    seen = paths.tree_files(str(model))
    (model / "w.new").write_bytes(b"other")
    os.replace(model / "w.new", model / "w.bin")  # another file (inode) at the same name
    with pytest.raises(checksums.VerifyError, match="not the file checked"):
        checksums.digest_tree(str(model), identities=seen)
