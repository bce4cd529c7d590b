"""A rollout's evidence pack (docs/evidence.md): built from a rollout's record it verifies, with real gpg and
throwaway keys; one byte changed, a file removed, a file added, SHA256SUMS rewritten to match, a signature by
another key or none at all is refused, one line naming the file and what is wrong; bad input is exit 2; no
secret is ever in a pack. The playbook side writes the pack without atlasctl: after a batch that failed, and
at the end of playbooks/rollout.yml, where atlasctl would put it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu

from atlasctl import cli, evidence, exitcodes, rollout
from atlasctl.runner import RunResult
from support.evidence import (
    ENV_KEY,
    PLAN,
    build,
    evidence_keys,
    hostvars,
    secrets_in,
    verify_cli,
)

pytestmark = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")

@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    """The controller's evidence key (its public keyring) and a stranger's (support.evidence)."""
    with evidence_keys(tmp_path_factory.mktemp("evidence-keys")) as made:
        yield made


def test_a_pack_from_a_rollout_record_verifies_and_shows(tmp_path: Path, keys, capsys) -> None:
    pack = build(tmp_path / "r2.evidence", keys)
    assert sorted(p.name for p in pack.iterdir()) == ["SHA256SUMS", "SHA256SUMS.asc", "evidence.json"]
    assert cli.main(verify_cli(pack, keys)) == exitcodes.OK
    assert f"signed by {keys[0].fingerprint}" in capsys.readouterr().out
    record = json.loads((pack / "evidence.json").read_text())
    assert record["status"] == "failed" and record["complete"]  # a failed node ends the rollout: the last record
    assert record["bundle"] == {"manifest_sha256": "cd" * 32, "signed_by": "EF" * 20}
    assert record["controller"]["user"] and record["controller"]["hostname"]
    n1, n2, n3 = record["nodes"]
    assert (n1["result"], n2["result"], n3["result"]) == ("ok", "failed", "not reached")
    assert n1["versions"]["driver"] == "24.1.rc1" and n1["versions"]["cann"] == "8.3.RC1"
    assert n1["versions"]["model_version"] == "9f" * 8 and n1["versions"]["engine_release"] == "vllm-ascend-0.9.1"
    assert n1["files_sha256"] == {"atlas-serving.env": "ab" * 32, "atlas-serving.args": "12" * 32}
    gates = {g["gate"]: g for g in n1["gates"]}
    assert gates["health"]["figures"]["health"] == 200 and gates["slo"]["figures"]["metrics"]["e2el_ms"]["p95"] == 210
    assert [g["result"] for g in n2["gates"]][-2:] == ["failed", "not run"]
    assert record["rollbacks"][0]["host"] == "n2" and record["rollbacks"][0]["running_after"] == "r1"

    assert cli.main(["evidence", "show", str(pack), "--html", str(tmp_path / "page.html")]) == exitcodes.OK
    table = capsys.readouterr().out
    assert "rollout r2: FAILED" in table and "vllm-ascend-0.9.1" in table and "24.1.rc1" in table
    assert "n2 (wave east): gate slo" in table
    page = (tmp_path / "page.html").read_text()
    assert "<script" not in page and "<link" not in page and "vllm-ascend-0.9.1" in page and "e2el" in page
    assert cli.main(["evidence", "show", str(pack), "--json"]) == exitcodes.OK
    assert json.loads(capsys.readouterr().out) == record


def _one_byte(pack: Path) -> None:
    data = bytearray((pack / "evidence.json").read_bytes())
    data[data.index(b'"release": "r2"') + len(b'"release": "r')] ^= 0x01  # the release "r2" -> "r3"
    (pack / "evidence.json").write_bytes(bytes(data))


def _rehash(pack: Path) -> None:
    _one_byte(pack)
    digest = hashlib.sha256((pack / "evidence.json").read_bytes()).hexdigest()
    (pack / "SHA256SUMS").write_text(f"{digest}  evidence.json\n")


TAMPERING = {
    "one byte changed": (_one_byte, "evidence.json: changed: sha256"),
    "a file removed": (lambda p: (p / "evidence.json").unlink(), "evidence.json: missing"),
    "a file added": (lambda p: (p / "notes.txt").write_text("hello\n"), "notes.txt: extra: not listed"),
    "SHA256SUMS rewritten to match": (_rehash, "SHA256SUMS.asc: BAD signature"),
    "the signature removed": (lambda p: (p / "SHA256SUMS.asc").unlink(), "SHA256SUMS.asc: missing: the pack is NOT"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_tampered_pack_is_refused_naming_the_file(tmp_path: Path, keys, capsys, case: str) -> None:
    pack = build(tmp_path / "r2.evidence", keys)
    tamper, reason = TAMPERING[case]
    tamper(pack)
    assert cli.main(verify_cli(pack, keys)) == exitcodes.FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{pack}/") and reason in lines[0], lines


def test_a_foreign_signature_is_refused(tmp_path: Path, keys, capsys) -> None:
    """Signed again by another key: in the keyring or not, it is not the pinned one."""
    controller, stranger, keyring = keys
    pack = build(tmp_path / "r2.evidence", keys)
    stranger.sign(pack / "SHA256SUMS", pack / "SHA256SUMS.asc")
    assert cli.main(verify_cli(pack, keys)) == exitcodes.FAILED
    assert "SHA256SUMS.asc: a foreign signature" in capsys.readouterr().err
    both = stranger.export(tmp_path / "both.gpg")
    both.write_bytes(keyring.read_bytes() + both.read_bytes())
    argv = ["evidence", "verify", str(pack), "--keyring", str(both), "--fingerprint", controller.fingerprint]
    assert cli.main(argv) == exitcodes.FAILED
    err = capsys.readouterr().err
    assert f"a foreign signature: good, but by key {stranger.fingerprint}, not the pinned" in err, err


def test_an_unsigned_pack_says_so_and_is_refused_unless_allowed(tmp_path: Path, keys, capsys) -> None:
    pack = build(tmp_path / "r2.evidence")
    record = json.loads((pack / "evidence.json").read_text())
    assert record["signature"]["signed"] is False and "UNSIGNED" in record["signature"]["note"]
    assert cli.main(["evidence", "verify", str(pack)]) == exitcodes.FAILED
    assert "SHA256SUMS.asc: missing: the pack is NOT signed" in capsys.readouterr().err
    assert cli.main(["evidence", "verify", str(pack), "--allow-unsigned"]) == exitcodes.OK
    assert "UNSIGNED" in capsys.readouterr().out
    assert cli.main(["evidence", "show", str(pack)]) == exitcodes.OK
    assert "!!! UNSIGNED" in capsys.readouterr().out


def test_bad_input_is_exit_2_with_one_line(tmp_path: Path, keys, capsys) -> None:
    controller, _, keyring = keys
    pack = build(tmp_path / "r2.evidence", keys)
    (tmp_path / "empty").mkdir()
    cases = [
        ["evidence", "verify", str(tmp_path / "nowhere")],
        ["evidence", "verify", str(tmp_path / "empty"), "--allow-unsigned"],
        ["evidence", "verify", str(pack)],  # signed, and no key named to check it against
        ["evidence", "verify", str(pack), "--keyring", str(keyring), "--fingerprint", controller.fingerprint[-16:]],
        ["evidence", "verify", str(pack), "--keyring", str(tmp_path / "none.gpg"), "--fingerprint",
         controller.fingerprint],
        ["evidence", "show", str(tmp_path / "empty")],
    ]
    for argv in cases:
        assert cli.main(argv) == exitcodes.USAGE, argv
        err = capsys.readouterr().err
        assert err.startswith("atlasctl: error: ") and "Traceback" not in err, err


def test_no_secret_is_ever_in_a_pack(tmp_path: Path, keys) -> None:
    """Keys in the hostvars, in the environment and in a failure's message: none is in the pack, which records
    only the sha256 of the env file that carries one."""
    env = tmp_path / "atlas-serving.env"
    env.write_text(f"VLLM_API_KEY={ENV_KEY}\nOMP_NUM_THREADS=8\n")
    pack = build(tmp_path / "r2.evidence", keys, hostvars(hashlib.sha256(env.read_bytes()).hexdigest()))
    assert secrets_in(pack) == []
    record = json.loads((pack / "evidence.json").read_text())
    assert record["nodes"][1]["rollback"]["why"].endswith(f"(sent with {mu.WITHHELD})")
    assert record["nodes"][0]["files_sha256"]["atlas-serving.env"] == hashlib.sha256(env.read_bytes()).hexdigest()


def test_atlasctl_finishes_a_pack_the_playbook_could_not(tmp_path: Path, keys, monkeypatch) -> None:
    """A node lost alone in its batch leaves the pack as the last batch wrote it ('in progress'): atlasctl
    rollout finishes it from its report, signed with the key the record names, beside its report."""
    monkeypatch.setenv("ATLAS_ROLLOUT_DIR", str(tmp_path / "rollouts"))
    inv = tmp_path / "inv"
    inv.mkdir()
    hv = hostvars()
    del hv["n2"]["rollout_failure"]
    seen: dict = {}

    def run_fn(playbook, inventory, *, extravars, limit, on_event):
        seen.update(extravars)
        build(Path(extravars["rollout_evidence_dir"]), keys, hv)  # what the playbook wrote after wave 1
        on_event({"event": "runner_on_ok", "event_data": {"task": "Rollout | plan | the waves", "host": "localhost",
                                                          "res": {"ansible_facts": {"rollout_plan": PLAN}}}})
        on_event({"event": "playbook_on_play_start", "event_data": {"play": "Rollout | wave 2"}})
        on_event({"event": "runner_on_unreachable", "event_data": {"host": "n2", "task": "Rollout | node | drain",
                                                                   "res": {"msg": "ssh: connect: no route"}}})
        return RunResult("failed", 4, {}, tmp_path, 1.0)

    report = rollout.run(inv, "r2", run_fn=run_fn)
    pack = Path(report["evidence"]["dir"])
    assert pack.parent == Path(report["report"]).parent and pack.name == Path(report["report"]).stem + ".evidence"
    assert report["evidence"]["signed"] and report["evidence"]["status"] == "failed"
    record = evidence.read(pack)
    assert record["complete"] and record["nodes"][1]["result"] == "lost"
    assert "no route" in record["nodes"][1]["note"] and record["failure"]["gate"] == "unreachable"
    assert evidence.verify(pack, keyring=keys[2], fingerprint=keys[0].fingerprint).ok


def test_verify_against_the_key_the_inventory_names(tmp_path: Path, keys, capsys) -> None:
    controller, _, _ = keys
    pack = build(tmp_path / "r2.evidence", keys)
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"vars": {"atlas_evidence_signing_key": controller.fingerprint,
                                                    "atlas_evidence_gnupg_home": str(controller.path)},
                                           "children": {"atlas_nodes": {"hosts": {"n1": {}}}}}}))
    assert cli.main(["evidence", "verify", str(pack), "-i", str(inv)]) == exitcodes.OK
    other = tmp_path / "other.yml"
    other.write_text(yaml.safe_dump({"all": {"children": {"atlas_nodes": {"hosts": {"n1": {}}}}}}))
    assert cli.main(["evidence", "verify", str(pack), "-i", str(other)]) == exitcodes.USAGE
    assert "names no atlas_evidence_signing_key" in capsys.readouterr().err


# ---------------------------------------------------------------- the playbook side, without atlasctl


def test_the_gates_of_a_platform_move_are_recorded_where_it_moved() -> None:
    moved = {"stop": True, "hdk": ["firmware", "driver"], "cann": True, "moves": True}
    gates = [g["gate"] for g in mu._gates("ok", False, ["n1"], {}, {}, {}, moved)]
    assert gates == ["previous", "drain", "stop", "driver", "cann", "stage", "restart", "health", "slo", "enable"]
    assert [g["gate"] for g in mu._gates("ok", False, ["n1"], {}, {}, {}, {})] == [
        "previous", "drain", "stage", "restart", "health", "slo", "enable"]
    failed = mu._gates("failed", False, ["n1", "n2"], {"gate": "driver", "why": "npu-smi fails"}, {}, {}, moved)
    assert [(g["gate"], g["result"]) for g in failed][:5] == [
        ("previous", "passed"), ("network", "passed"), ("drain", "passed"), ("stop", "passed"), ("driver", "failed")]
