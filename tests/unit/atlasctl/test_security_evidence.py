"""Evidence packs under attack (docs/security.md, "Threat model per entry point"): a genuine older pack copied into
another rollout's folder, a pack checked against another --rollout, a report swapped beside its pack, a pack
that is (or holds) a link, a record nested too deep to parse, a pack signed by a key that is not the pinned
one, and an older, unbound pack. `verify` fails on each (exit 1; the deep record is bad input, exit 2);
`show` is informational and says WARNING."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu

from atlasctl import cli, evidence, exitcodes, rollout
from atlasctl.runner import RunResult
from support.evidence import build, evidence_keys, hostvars, verify_cli

pytestmark = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")

FOLDER = "bank-0123456789"  # an inventory's folder of rollouts: <inventory>-<hash>
OLDER, NEWER = "20260301T100000Z-r2", "20260401T100000Z-r3"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    """The controller's evidence key (its public keyring) and a stranger's (support.evidence)."""
    with evidence_keys(tmp_path_factory.mktemp("evidence-keys")) as made:
        yield made


def _pack(root: Path, keys, rollout_id: str = OLDER, folder: str = FOLDER) -> Path:
    return build(root / "rollouts" / folder / f"{rollout_id}{mu.SUFFIX}", keys)


def _verify(pack: Path, keys, capsys, *extra: str) -> tuple[int, str, str]:
    code = cli.main(verify_cli(pack, keys, *extra))
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def _resign(pack: Path, record: dict, signer) -> None:
    """The record rewritten as is (no binding added), SHA256SUMS and its signature made again by ``signer``."""
    data = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
    (pack / mu.RECORD).write_bytes(data)
    (pack / mu.SUMS).write_text(f"{hashlib.sha256(data).hexdigest()}  {mu.RECORD}\n")
    signer.sign(pack / mu.SUMS, pack / mu.SIGNATURE)


# ---------------------------------------------------------------- bound to its rollout

def test_a_genuine_older_pack_copied_into_another_rollouts_folder_is_refused(tmp_path: Path, keys, capsys) -> None:
    older = _pack(tmp_path, keys)
    assert _verify(older, keys, capsys)[0] == exitcodes.OK
    copy = older.parent / f"{NEWER}{mu.SUFFIX}"
    shutil.copytree(older, copy)
    code, _, err = _verify(copy, keys, capsys)
    assert code == exitcodes.FAILED and f"bound to rollout '{OLDER}', not '{NEWER}'" in err, err


def test_a_pack_copied_into_another_inventorys_folder_is_refused(tmp_path: Path, keys, capsys) -> None:
    pack = _pack(tmp_path, keys)
    other = tmp_path / "rollouts" / "other-9876543210" / pack.name
    other.parent.mkdir(parents=True)
    shutil.copytree(pack, other)
    code, _, err = _verify(other, keys, capsys)
    assert code == exitcodes.FAILED and "another inventory's rollout" in err, err


def test_rollout_names_the_rollout_the_pack_must_be_bound_to(tmp_path: Path, keys, capsys) -> None:
    pack = _pack(tmp_path, keys)
    code, _, err = _verify(pack, keys, capsys, "--rollout", NEWER)
    assert code == exitcodes.FAILED and f"bound to rollout '{OLDER}', not '{NEWER}' (--rollout" in err, err
    code, _, err = _verify(pack, keys, capsys, "--rollout", f"other-9876543210/{OLDER}")
    assert code == exitcodes.FAILED and "another inventory's rollout" in err, err
    assert _verify(pack, keys, capsys, "--rollout", OLDER)[0] == exitcodes.OK
    assert _verify(pack, keys, capsys, "--rollout", f"{FOLDER}/{OLDER}")[0] == exitcodes.OK
    auditor = tmp_path / "audit" / "copy.evidence"  # an auditor's copy, held to the rollout it claims to be
    shutil.copytree(pack, auditor)
    assert _verify(auditor, keys, capsys)[0] == exitcodes.FAILED
    assert _verify(auditor, keys, capsys, "--rollout", f"{FOLDER}/{OLDER}")[0] == exitcodes.OK
    code, _, err = _verify(pack, keys, capsys, "--rollout", "../..")
    assert code == exitcodes.USAGE and "is not a rollout id" in err, err


def _rollout_with_report(tmp_path: Path, keys, monkeypatch) -> dict:
    """atlasctl rollout, the playbook writing the pack (complete): the report and its bound pack beside it."""
    monkeypatch.setenv("ATLAS_ROLLOUT_DIR", str(tmp_path / "rollouts"))
    inv = tmp_path / "inv"
    inv.mkdir(exist_ok=True)

    def run_fn(playbook, inventory, *, extravars, limit, on_event):
        build(Path(extravars["rollout_evidence_dir"]), keys, hostvars(), complete=True)
        return RunResult("failed", 2, {}, tmp_path, 1.0)

    return rollout.run(inv, "r2", run_fn=run_fn)


def test_the_pack_is_bound_to_the_report_beside_it(tmp_path: Path, keys, capsys, monkeypatch) -> None:
    report = _rollout_with_report(tmp_path, keys, monkeypatch)
    pack, path = Path(report["evidence"]["dir"]), Path(report["report"])
    record = evidence.read(pack)
    assert record["format"] == mu.FORMAT and record["binding"]["rollout"] == path.stem
    assert record["binding"]["report_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert json.loads(path.read_text())["evidence"] == report["evidence"]  # the report names the pack, as before
    assert _verify(pack, keys, capsys)[0] == exitcodes.OK
    path.write_text(path.read_text().replace('"status": "failed"', '"status": "ok"'))
    code, _, err = _verify(pack, keys, capsys)
    assert code == exitcodes.FAILED and f"the report beside it, {path.name}, is not the one it is bound to" in err


def test_an_earlier_pack_of_the_run_laid_beside_its_report_is_refused(tmp_path: Path, keys, capsys) -> None:
    pack = _pack(tmp_path, keys)  # what the playbook wrote before atlasctl bound it to the report
    (pack.parent / f"{OLDER}.json").write_text('{"status": "ok"}\n')
    code, _, err = _verify(pack, keys, capsys)
    assert code == exitcodes.FAILED and "is not bound to it: the record names no report sha256" in err, err


# ---------------------------------------------------------------- links

def test_a_symlinked_pack_directory_is_refused(tmp_path: Path, keys, capsys) -> None:
    pack = _pack(tmp_path, keys)
    link = pack.parent / f"{NEWER}{mu.SUFFIX}"
    link.symlink_to(pack)
    code, _, err = _verify(link, keys, capsys)
    assert code == exitcodes.FAILED and "the pack directory is a symbolic link" in err, err
    (tmp_path / FOLDER).symlink_to(pack.parent)  # a link above the pack: where the operator keeps it, not the pack
    code, _, err = _verify(tmp_path / FOLDER / pack.name, keys, capsys)
    assert code == exitcodes.OK, err


def test_a_pack_of_hard_linked_files_is_refused(tmp_path: Path, keys, capsys) -> None:
    older = _pack(tmp_path, keys)
    copy = older.parent / f"{NEWER}{mu.SUFFIX}"
    copy.mkdir()
    for name in os.listdir(older):
        os.link(older / name, copy / name)
    code, _, err = _verify(copy, keys, capsys)
    assert code == exitcodes.FAILED and "hard-linked (2 names for one file)" in err, err
    code, _, err = _verify(older, keys, capsys)  # the original shares its files now: refused too
    assert code == exitcodes.FAILED and "hard-linked" in err, err


def test_a_symlink_inside_the_pack_is_refused(tmp_path: Path, keys, capsys) -> None:
    pack = _pack(tmp_path, keys)
    elsewhere = tmp_path / "kept.asc"
    shutil.move(pack / mu.SIGNATURE, elsewhere)
    (pack / mu.SIGNATURE).symlink_to(elsewhere)
    code, _, err = _verify(pack, keys, capsys)
    assert code == exitcodes.FAILED and f"{mu.SIGNATURE}: a symbolic link" in err, err


# ---------------------------------------------------------------- a record nested too deep

@pytest.mark.parametrize("command", ["show", "verify"])
def test_a_record_nested_too_deep_is_bad_input_without_a_traceback(tmp_path: Path, capsys, command: str) -> None:
    pack = _pack(tmp_path, None)
    data = b'{"format": "%s", "nodes": %s%s}' % (mu.FORMAT.encode(), b"[" * 100_000, b"]" * 100_000)
    (pack / mu.RECORD).write_bytes(data)
    (pack / mu.SUMS).write_text(f"{hashlib.sha256(data).hexdigest()}  {mu.RECORD}\n")
    argv = ["evidence", command, str(pack), *(["--allow-unsigned"] if command == "verify" else [])]
    assert cli.main(argv) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert "nested deeper than 64 levels" in err and "Traceback" not in err, err


def test_json_depth_ignores_brackets_inside_strings() -> None:
    assert mu.json_depth('{"a": "[[[[", "b": [{"c": "\\"]]"}]}') == 3
    assert mu.loads_bounded('[[1]]', "x", max_depth=2) == [[1]]
    with pytest.raises(mu.TooDeep):
        mu.loads_bounded('[[[1]]]', "x", max_depth=2)


# ---------------------------------------------------------------- the signer

def test_show_warns_of_a_signer_that_is_not_the_pinned_key_and_verify_fails(tmp_path: Path, keys, capsys) -> None:
    controller, stranger, _ = keys
    pack = build(tmp_path / "rollouts" / FOLDER / f"{OLDER}{mu.SUFFIX}", (stranger,))
    assert cli.main(["evidence", "show", str(pack), "--fingerprint", controller.fingerprint]) == exitcodes.OK
    out = capsys.readouterr().out
    assert out.startswith(f"WARNING: signed by {stranger.fingerprint}, NOT the pinned key {controller.fingerprint}")
    assert cli.main(["evidence", "show", str(pack), "--json", "--fingerprint", controller.fingerprint]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["signature"]["key"] == stranger.fingerprint and "NOT the pinned key" in err
    code, _, err = _verify(pack, keys, capsys)
    assert code == exitcodes.FAILED and "a foreign signature" in err, err
    own = _pack(tmp_path, keys, NEWER)
    assert cli.main(["evidence", "show", str(own), "--fingerprint", controller.fingerprint]) == exitcodes.OK
    assert "WARNING" not in capsys.readouterr().out


def test_show_without_a_pinned_key_says_the_signer_is_not_checked(tmp_path: Path, keys, capsys) -> None:
    pack = _pack(tmp_path, keys)
    assert cli.main(["evidence", "show", str(pack)]) == exitcodes.OK
    out = capsys.readouterr().out
    assert out.startswith("WARNING: the signer") and "is NOT checked: no pinned key named" in out, out


def test_a_record_that_names_another_signer_than_the_one_that_signed_it_is_refused(tmp_path: Path, keys,
                                                                                   capsys) -> None:
    controller, stranger, _ = keys
    pack = _pack(tmp_path, keys)
    record = json.loads((pack / mu.RECORD).read_text())
    record["signature"]["key"] = stranger.fingerprint
    _resign(pack, record, controller)
    code, _, err = _verify(pack, keys, capsys)
    assert code == exitcodes.FAILED and f"names {stranger.fingerprint} as its signer" in err, err


# ---------------------------------------------------------------- an older, unbound pack

def test_an_older_unbound_pack_is_reported_as_such_and_accepted_only_when_allowed(tmp_path: Path, keys,
                                                                                 capsys) -> None:
    pack = _pack(tmp_path, keys)
    record = json.loads((pack / mu.RECORD).read_text())
    del record["binding"]
    _resign(pack, {**record, "format": mu.FORMAT_V1}, keys[0])
    code, _, err = _verify(pack, keys, capsys)
    assert code == exitcodes.FAILED and "unbound, older format" in err, err
    code, out, _ = _verify(pack, keys, capsys, "--allow-unbound")
    assert code == exitcodes.OK and "UNBOUND, older format" in out, out
    assert cli.main(["evidence", "show", str(pack)]) == exitcodes.OK
    out = capsys.readouterr().out
    assert "WARNING: unbound, older format" in out and "!!! UNBOUND" in out
